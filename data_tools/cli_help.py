"""Every command's ``--help`` keys from one source: the command's config dataclass (its keys and their types), the
values it runs with by default (the dataclass's defaults, or a Hydra command's composed config) and what each key
means (:func:`data_tools.field_docs.field_docs`: the classes' comments and ``help`` metadata).

One line per key: ``  key=PLACEHOLDER  meaning (default VALUE)``; the placeholder says the type (``INT``,
``FLOAT``, ``true|false``, ``STR``, ``[LIST]``, ``{MAP}``, an enum's choices ``a|b|c``) unless the field names
its own (``metavar``: ``DIR``, ``N``). Plain text only: reStructuredText markup is removed (:func:`plain_doc`).
"""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
from typing import Any, List, Mapping, Optional

from data_tools.field_docs import ROLE, field_docs, plain

MISSING_VALUE = "???"


def plain_doc(text: str) -> str:
    """A docstring for a terminal: its lines kept, reStructuredText roles and double backquotes removed."""
    return "\n".join(ROLE.sub(r"\1", line).replace("``", "") for line in text.strip().splitlines())


def _placeholder(kind: Any, f: dataclasses.Field) -> str:
    if f.metadata.get("metavar"):
        return f.metadata["metavar"]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Union and len(args) == 1:
        kind = args[0]  # Optional[X]: X (null is shown as a default)
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "|".join(str(m.value) for m in kind)
    if kind is bool:
        return "true|false"
    if origin in (list, List, tuple) or kind in (list, tuple):
        return "[LIST]"
    if origin in (dict, typing.Dict) or kind is dict:
        return "{MAP}"
    if isinstance(kind, type) and kind in (int, float, str):
        return kind.__name__.upper()
    return "VALUE"


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def _lookup(values: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    node = values
    for part in key.split("."):
        if node is None:
            return None
        if OmegaConf.is_config(node) and OmegaConf.is_missing(node, part):
            return MISSING_VALUE
        node = node.get(part) if hasattr(node, "get") else None
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node


def key_lines(schema: type, values: Optional[Any] = None, prefix: str = "", inherited: str = "") -> List[str]:
    """The ``--help`` lines of every key of ``schema`` (nested dataclasses flattened to ``parent.key``), each
    with its type, default and meaning. ``values``: the config the command runs with by default (a Hydra
    command's composed config), else the dataclass defaults."""
    docs, hints = field_docs(schema), typing.get_type_hints(schema)
    lines: List[str] = []
    for f in dataclasses.fields(schema):
        key, kind = f"{prefix}{f.name}", hints.get(f.name)
        meaning = docs.get(f.name, "")
        if dataclasses.is_dataclass(kind):
            doc = kind.__doc__ or ""
            generated = doc.startswith(kind.__name__ + "(")  # dataclass's own signature, not a docstring
            head = meaning or ("" if generated else plain(doc.split("\n\n")[0]))
            lines += key_lines(kind, values, f"{key}.", head)
            continue
        default = _lookup(values, key) if values is not None else _default(f)
        if f.metadata.get("shown"):
            note = f"({f.metadata['shown']})"
        elif default == MISSING_VALUE:
            note = "(required)"
        else:
            note = f"(default {_shown(default)})"
        left = f"  {key}={_placeholder(kind, f)}"
        text = " ".join(x for x in (meaning or inherited, note) if x)
        lines.append(f"{left:<40} {text}")
    return lines


def help_text(doc: str, usage: str, schema: type, values: Optional[Any] = None,
              sections: Mapping[str, List[str]] = {}) -> str:
    """A command's whole ``--help``: its description (``doc``, plain), its usage line(s), other sections (title ->
    lines: presets, config groups), then every key (:func:`key_lines`)."""
    out = [plain_doc(doc), "", usage]
    for title, lines in sections.items():
        out += ["", f"{title}:", *lines]
    out += ["", "keys (key=value; Hydra's override grammar: a list [a,b], a mapping {a:1}, a quoted string for a "
                "value with '=' or ','):", *key_lines(schema, values)]
    return "\n".join(out)


def has_markup(text: str) -> bool:
    """Whether ``text`` holds reStructuredText markup (a role or double backquotes)."""
    return bool(ROLE.search(text) or "``" in text or re.search(r":(mod|func|class|meth|attr|data):", text))
