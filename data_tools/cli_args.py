"""One command-line convention for every command of the project: Hydra's ``key=value``, no dashes.

The data set is ``data.root=DIR``, a run directory ``run_dir=DIR``, what a command writes ``out=PATH``;
every other option is a key with underscores (``chunk_rows=N``, ``overwrite=true``, ``log=[a.csv,b.csv]``,
``min_count.user_id=5``). The Hydra commands (train, lr_find, evaluate, export, predict, the retraining
job) get this from Hydra; the other commands (``data_tools.convert``, ``validate``, ``relayout``,
``generate``) from :func:`parse`: a typed dataclass per command, the arguments parsed with Hydra's override
grammar (the same quoting as the Hydra commands) and merged into ``OmegaConf.structured``. An unknown
key, a wrong type or a missing required key is one line and exit status 2, as in the Hydra commands.

The one error voice of every command is here: :func:`usage_error` (``error: ...``, exit 2) and the lines it
says for an unknown key (:func:`unknown_key`: did you mean), a wrong value (:func:`wrong_value`: the type
expected) and a Hydra composition error (:func:`composition_error`); ``+key=value`` is ``key=value`` for a
key the command declares and refused for any other (:func:`known_plus`, :func:`check_known_keys`). The
Hydra commands reach them through :func:`recsys_hdet.config.check_composition`.

An old spelling (``--out DIR``, a positional path, ``data_root=``, ``hydra.run.dir=``, ...) is refused by
:func:`refuse_old_spellings`: exit status 2 and one line naming the new spelling.

Here, in the bottom package (it imports nothing of the project but the exit statuses), so that the data
tools, the library and the jobs share it.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Type, TypeVar

from data_tools.exit_status import ExitStatus

T = TypeVar("T")

HELP = ("-h", "--help")

# The old spellings every command refuses, and the new one each names (a key ends with "=").
DATA_ROOT_KEY = {"data_root=": "data.root=DIR"}
RUN_DIR_KEY = {"hydra.run.dir=": "run_dir=DIR"}


def usage_error(message: str) -> NoReturn:
    """``error: message`` on stderr, exit status 2 (:attr:`ExitStatus.USAGE`)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(ExitStatus.USAGE)


def opt(default: Any = dataclasses.MISSING, help: str = "", metavar: Optional[str] = None,
        factory: Any = dataclasses.MISSING, shown: Optional[str] = None) -> Any:
    """A field of a command's arguments: its default (``"???"``: required), its ``--help`` line, the
    placeholder of its value (``DIR``, ``N``) and what ``--help`` says of its default (``shown``: default
    the default)."""
    meta = {"help": help, "metavar": metavar, "shown": shown}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class DataSet:
    """``data.root=DIR``: a processed data set (the directory holding its meta file)."""
    root: str = opt("???", metavar="DIR")


def _fields(schema: type, prefix: str = "", help: str = "") -> List[tuple]:
    """``(key, field, help)`` of every leaf field, nested dataclasses flattened to ``parent.key``."""
    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = hints.get(f.name)
        text = f.metadata.get("help") or help
        if dataclasses.is_dataclass(kind):
            out += _fields(kind, f"{prefix}{f.name}.", text)
        else:
            out.append((f"{prefix}{f.name}", f, text))
    return out


def _placeholder(key: str, f: dataclasses.Field) -> str:
    if f.metadata.get("metavar"):
        return f.metadata["metavar"]
    if f.type in (bool, "bool") or isinstance(f.default, bool):
        return "true"
    return "VALUE"


def usage(prog: str, doc: str, schema: type) -> str:
    """A command's ``--help``: its docstring, then each key with its type, default and meaning
    (:func:`data_tools.cli_help.help_text`, the one generator of every command's)."""
    from data_tools.cli_help import help_text

    return help_text(doc, f"usage: {prog} key=value ...", schema)


def old_spelling(argv: Sequence[str], renamed: Mapping[str, str], positional: Optional[str] = None,
                 keys: Mapping[str, str] = {}) -> Optional[str]:
    """The refusal line for the first argument spelled the old way, or None.

    ``renamed``: an old option (``--out``) or key (``data_root=``, ending with ``=``) -> the spelling to use
    now (``data.root=DIR``); ``positional``: the spelling a bare argument (no ``=``) now takes; ``keys``: the
    command's keys (key -> its value's placeholder), so that any other ``--some-key`` names ``some_key=``."""
    for a in argv:
        if a in HELP:
            continue
        if a.startswith("-"):  # an option (Hydra's own flags, -m or --cfg, are not in ``renamed``: left alone)
            name = a.split("=", 1)[0]
            if name in renamed:
                return f"{name} is no longer accepted; use {renamed[name]}"
            key = name.lstrip("-").replace("-", "_")
            if key in keys:
                return f"{name} is no longer accepted; use {key}={keys[key]}"
            continue
        bare = a.lstrip("+~")
        for old, new in renamed.items():
            if old.endswith("=") and bare.startswith(old):
                return f"{old} is no longer accepted; use {new}"
        if positional is not None and "=" not in a:
            return f"a positional argument ({a}) is no longer accepted; use {positional}"
    return None


def refuse_old_spellings(argv: Sequence[str], renamed: Mapping[str, str], positional: Optional[str] = None,
                         keys: Mapping[str, str] = {}) -> None:
    """Exit 2 with one line naming the new spelling when an argument is spelled the old way
    (:func:`old_spelling`)."""
    message = old_spelling(argv, renamed, positional, keys)
    if message:
        usage_error(message)


def unknown_key(key: str, known: Sequence[str]) -> str:
    """The one line for a key the command does not know: ``key`` as the user typed it (less a ``+``), the
    closest of ``known`` (dotted keys: its siblings, or every key of a small command), then its siblings."""
    parent = key.rpartition(".")[0]
    close = difflib.get_close_matches(key, known, n=1)
    names = [k[len(parent) + 1:] if parent and k.startswith(parent + ".") else k for k in known]
    return (f"config {key}: unknown key (the command has no such setting, so nothing would read it)"
            + (f"; did you mean {close[0]}?" if close else "")
            + (f" Keys of {parent}: " if parent else " Keys: ") + ", ".join(names))


def wrong_value(key: str, message: str, expected: Any = None) -> str:
    """The one line for a value OmegaConf refused (a wrong type, a choice outside its enum): the key, OmegaConf's
    first line, then the type the schema declares (``expected``) unless the message lists the choices."""
    first = str(message).splitlines()[0]
    named = expected is not None and "expected one of" not in first
    shown = expected.__name__ if isinstance(expected, type) else str(expected).replace("typing.", "")
    return f"config {key}: {first}" + (f" (expected {shown})" if named else "")


def schema_keys(schema: type) -> List[str]:
    """Every key a command's dataclass ``schema`` declares, dotted (``data.root``), its nested dataclasses'
    keys included (not the dataclasses' own names: ``+data=...`` is a config group, not a key)."""
    return [k for k, _, _ in _fields(schema)]


def known_plus(argv: Sequence[str], schema: type) -> List[str]:
    """``+key=value`` for a key the schema declares is ``key=value`` (Hydra refuses to add a key that is
    there); ``+`` with any other key is left to Hydra, which adds it, and to :func:`check_known_keys`,
    which refuses it unless it lies in a mapping whose keys are the user's (``+tasks.share.weight=1``)."""
    keys = set(schema_keys(schema))
    return [a[1:] if a.startswith("+") and not a.startswith("++") and a[1:].split("=", 1)[0] in keys else a
            for a in argv]


def check_known_keys(node: Any, parent: str = "") -> None:
    """Exit 2 naming the first key of the composed ``node`` that its schema class does not declare (a key
    added with ``+``: a typo, not a setting). Mappings whose keys are the user's (``tasks``,
    ``data.generator``) are free."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        path = f"{parent}.{key}" if parent else str(key)
        if fields is not None and key not in fields:
            raise KeyError(unknown_key(path, [f"{parent}.{f}" if parent else f for f in fields]))
        check_known_keys(node._get_node(key), path)


def composition_error(exc: BaseException, schema: type) -> str:
    """The one line for an error composing a config of root class ``schema``: an unknown key (did you mean),
    a wrong type (the type expected) or a bad choice (the choices), named; any other (an unknown preset, a
    malformed override) Hydra's own message, its lines joined."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = exc.__cause__
    key = getattr(cause, "full_key", None)
    if key:
        parent, _, name = key.rpartition(".")
        node: Any = schema
        for part in parent.split(".") if parent else []:
            node = typing.get_type_hints(node).get(part)  # postponed annotations resolved in their modules
            if not dataclasses.is_dataclass(node):
                break
        # The node's own schema where OmegaConf names it: a group option's schema that extends the declared one
        # (conf/hdet/enabled.yaml's), whose keys are the ones allowed there.
        node = getattr(cause, "object_type", None) if dataclasses.is_dataclass(getattr(cause, "object_type", None)) \
            else node
        if dataclasses.is_dataclass(node):
            fields = {f.name: f.type for f in dataclasses.fields(node)}
            if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
                return unknown_key(key, [f"{parent}.{f}" if parent else f for f in fields])
            if isinstance(cause, ValidationError):
                return wrong_value(key, cause.msg, fields.get(name.split("[")[0]))
    text = str(exc).split("\nConfig search path")[0]  # Hydra's search path: not the user's concern
    head, _, options = text.partition("\nAvailable options")
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    if options:  # an unknown preset or group option: the choices, on the same line
        group, _, names = options.partition(":")
        lines.append(f"(available options{group}: {', '.join(names.split())})")
    return " ".join(lines) or type(exc).__name__


def _parse_values(argv: Sequence[str]) -> Dict[str, Any]:
    """``key=value`` arguments as key -> value, with Hydra's override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    values: Dict[str, Any] = {}
    for a in argv:
        if "=" not in a or a.startswith("-"):
            usage_error(f"{a}: expected key=value (--help lists the keys)")
        try:
            o = parser.parse_override(a)
        except HydraException as e:
            usage_error(f"{a}: cannot parse ({str(e).splitlines()[0]}); quote a value with '=' or ',' in it")
        if o.is_sweep_override():
            usage_error(f"{a}: several values; give a list [a,b] (or quote a value with ',' in it)")
        if str(o.input_line).startswith("~"):
            usage_error(f"{a}: give key=value (no ~)")
        values[o.key_or_group] = o.value()
    return values


def parse(argv: Optional[Sequence[str]], schema: Type[T], prog: str, doc: str,
          renamed: Mapping[str, str] = {}, positional: Optional[str] = None) -> T:
    """The command's arguments (``argv``, default ``sys.argv[1:]``) as an instance of the dataclass
    ``schema``. ``-h``/``--help`` prints :func:`usage` and exits 0; an old spelling (``renamed``,
    ``positional``: :func:`old_spelling`), an argument that is not ``key=value``, an unknown key, a wrong
    type, a missing required key or a value the schema's own checks refuse exits 2 with one line."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP for a in args):
        print(usage(prog, doc, schema))
        sys.exit(ExitStatus.OK)
    fields = {k: f for k, f, _ in _fields(schema)}
    refuse_old_spellings(args, renamed, positional, {k: _placeholder(k, f) for k, f in fields.items()})
    cfg = OmegaConf.structured(schema)
    for key, value in _parse_values([a[1:] if a.startswith("+") else a for a in args]).items():  # +key: the key, known or not
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except (ConfigAttributeError, ConfigKeyError):
            usage_error(unknown_key(key, list(fields)))
        except ValidationError as e:
            usage_error(wrong_value(key, e.msg, fields[key].type if key in fields else None))
    for key in sorted(OmegaConf.missing_keys(cfg), key=list(fields).index):
        usage_error(f"config {key}: missing (pass {key}={_placeholder(key, fields[key])})")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except (ValueError, TypeError) as e:  # the schema's own checks (__post_init__)
        usage_error(str(e))
