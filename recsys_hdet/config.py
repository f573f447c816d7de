"""The training config: composed by Hydra over the typed schema (:mod:`recsys_hdet.config_schema`),
then checked here before any worker starts.

- :func:`check_composition` composes every Hydra command's config (train, lr_find, evaluate, export,
  predict, the retraining job; :data:`SCHEMAS`) before the command runs, so that any composition error is
  the one line of :mod:`data_tools.cli_args` (the owner of every command's error voice), exit 2;
  :func:`run_hydra_command` runs it, and ``--help`` (:func:`command_usage`: every key with its type,
  default and meaning, :mod:`data_tools.cli_help`).
- :func:`compose_error` turns Hydra's composition errors (a key the schema lacks, a wrong type, a
  choice outside its enum) into that line naming the key and what is allowed.
- :func:`validate_config`: keys added with ``+`` that the schema does not declare (Hydra lets ``+``
  add any key), every group's own checks (the schema's ``__post_init__``), then the checks that span
  groups. Each error names the config key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from recsys_hdet import config_schema
from recsys_hdet.components.lr_scheduler import own_decays
from recsys_hdet.config_values import ConfigError, require as _require
from recsys_hdet.hdet.config import FORM_SCHEMAS, recorded_hdet
from recsys_hdet.hdet.controller.config import PROBE_SIGNALS
from recsys_hdet.constants import PARAM_GROUPS
from recsys_hdet.hdet.form import hdet_form

__all__ = ["CONF_DIR", "ConfigError", "compose_error", "probe_rows", "run_hydra_command", "validate_config"]



def probe_rows(cfg: DictConfig) -> int:
    """Rows reserved from each training day (never trained on): ``data.reserve_rows`` when set (so that
    plain and HDET runs train on the same rows), else HDET's probe rows when the probe signal is on,
    else 0 (every other run, alpha = 0 with the default signal included, trains on every row)."""
    reserved = cfg.data.reserve_rows
    if reserved is not None:
        return int(reserved)
    h = cfg.hdet
    return int(h.probe_rows) if hdet_form(h) == "controller" and h.signal in PROBE_SIGNALS else 0


CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def check_known_keys(node: Any, parent: str = "") -> None:
    """A key added with ``+`` that its schema class does not declare (``+hdet.alpah=0.1``) is a typo, not a
    setting: :class:`ConfigError` naming it (:func:`data_tools.cli_args.check_known_keys`)."""
    from data_tools.cli_args import check_known_keys as check

    try:
        check(node, parent)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def compose_error(exc: BaseException, schema: type = config_schema.TrainConfig) -> Optional[str]:
    """The one line for a Hydra composition error caused by the schema (unknown key, wrong type, bad choice),
    naming the key and what is allowed; None for any other error. ``schema``: the config's root class
    (training by default). The line is :func:`data_tools.cli_args.composition_error`'s."""
    from data_tools.cli_args import composition_error

    key = getattr(exc.__cause__, "full_key", None)
    if not key:
        return None
    line = composition_error(exc, schema)
    if "unknown key" not in line or not key.startswith("hdet."):
        return line
    owner = form_of_key(key)
    if owner:
        return f"{line}; {key} is a key of hdet={owner}, not of this form"
    # a typo of another form's key (hdet.alpah under the default hdet=disabled): the closest key of every form
    parent, _, name = key.rpartition(".")
    if parent != "hdet":
        return line
    here = getattr(exc.__cause__, "object_type", None)
    known = {f.name for f in dataclasses.fields(here)} if dataclasses.is_dataclass(here) else set()
    for option, form in FORM_SCHEMAS.items():
        close = [c for c in difflib.get_close_matches(name, [f.name for f in dataclasses.fields(form)], n=1)
                 if c not in known]
        if close:
            return f"{line}; did you mean hdet.{close[0]}, a key of hdet={option}?"
    return line


# optim.schedule.groups as a config recorded before the groups' own decays existed reads it: every group on the shared
# one-cycle, which is what such a run trained.
NO_OWN_DECAY = {g: {"decay_start": None, "anneal_strategy": None} for g in PARAM_GROUPS}


def recorded_config(config: Any, overrides: Sequence[str] = ()) -> Tuple[Dict[str, Any], Optional[str]]:
    """A run's recorded config (a DictConfig or a mapping: ``RunDir.CONFIG``, a checkpoint's) as a plain dict in
    today's shape, for comparing it with a config composed now, and the one line that names how it was read when
    it was recorded before each HDET form had its own schema (:func:`recsys_hdet.hdet.config.recorded_hdet`; None
    otherwise). A config recorded before ``optim.schedule.groups`` existed reads it as :data:`NO_OWN_DECAY`. ``overrides``: the run's own (``RunDir.OVERRIDES``), where known."""
    plain = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else dict(config)
    schedule = (plain.get("optim") or {}).get("schedule")
    if isinstance(schedule, dict) and "groups" not in schedule:  # recorded before the groups' own decays existed
        plain = {**plain, "optim": {**plain["optim"], "schedule": {**schedule, "groups": NO_OWN_DECAY}}}
    if "hdet" not in plain:
        return plain, None
    hdet, notice = recorded_hdet(plain["hdet"], overrides)
    return {**plain, "hdet": hdet}, notice


def form_of_key(key: str) -> Optional[str]:
    """The ``hdet`` option whose schema declares ``key`` (``hdet.alpha`` -> controller), for a key given under another
    form; None for a key no form declares."""
    def declares(schema: Any, path: List[str]) -> bool:
        hints = typing.get_type_hints(schema)
        kind = hints.get(path[0])
        return path[0] in hints and (len(path) == 1 or (dataclasses.is_dataclass(kind) and declares(kind, path[1:])))

    head, _, rest = key.partition(".")
    if head != "hdet" or not rest:
        return None
    return next((option for option, form in FORM_SCHEMAS.items() if declares(form, rest.split("."))), None)


def validate_config(cfg: DictConfig) -> config_schema.TrainConfig:
    """Unknown ``+`` keys, every group's own checks (the schema's ``__post_init__``), then the checks
    that span groups (raises :class:`ConfigError`). Returns the typed config (:func:`config_schema.check`)."""
    check_known_keys(cfg)
    try:
        typed = config_schema.check(cfg)
    except ConfigError:
        raise
    except ValueError as e:  # the HDET engine's own checks, run by the schema (ValueError: it knows no config)
        raise ConfigError(str(e)) from None
    h, form = cfg.hdet, hdet_form(cfg.hdet)
    _require(form == "controller" or cfg.trainer.dense_gradients == "allreduce", "trainer.dense_gradients",
             str(cfg.trainer.dense_gradients), "'local' leaves the dense replicas apart until an HDET sync "
             "averages them: needs HDET's controller (hdet=controller)")
    _require(not h.enabled or cfg.optim.schedule.name == "one_cycle", "optim.schedule.name",
             str(cfg.optim.schedule.name), "HDET moves the one-cycle schedule's base: needs one_cycle")
    _require(not h.enabled or cfg.optim.dense.type != "schedulefree_adamw", "optim.dense.type",
             str(cfg.optim.dense.type), "Schedule-Free AdamW trains at a constant LR with no schedule for HDET to "
             "move: not with HDET (hdet.enabled=true)")
    if form == "controller":
        first = next(iter(own_decays(cfg.optim.schedule)), None)
        _require(first is None, f"optim.schedule.groups.{first}", first and {
                     k: v if k == "decay_start" else str(v) for k, v in cfg.optim.schedule.groups[first].items() if v is not None},
                 "hdet=controller moves each group's base on the shared one-cycle and does not read a group's own "
                 "decay; per-group decay runs plain or with hdet=enabled (which commits the peaks): leave "
                 "optim.schedule.groups unset with the controller")
    if form == "range_test":
        check_range_test(cfg)
    elif form == "controller" and h.signal in PROBE_SIGNALS:
        _require(cfg.data.reserve_rows != 0, "data.reserve_rows", 0,
                 f"hdet.signal={h.signal} scores rows reserved from training: null (hdet.probe_rows) or > 0")
        if h.signal == "anneal_probe":
            cooldown_rows = int(h.anneal_probe.steps) * int(cfg.data.batch_size)
            _require(cooldown_rows < probe_rows(cfg), "hdet.anneal_probe.steps", h.anneal_probe.steps,
                     f"its cooldown trains on {cooldown_rows} reserved rows (x data.batch_size="
                     f"{cfg.data.batch_size}), leaving none of the {probe_rows(cfg)} reserved rows "
                     "(data.reserve_rows, else hdet.probe_rows) for the probe")
    if form == "controller" and h.explore.weight_decay is not None:
        _require(cfg.optim.dense.type == "adamw", "optim.dense.type", str(cfg.optim.dense.type),
                 "exploring weight decay needs decoupled weight decay: set optim.dense.type=adamw")
        _require(float(cfg.optim.dense.weight_decay) > 0, "optim.dense.weight_decay", cfg.optim.dense.weight_decay,
                 "exploring weight decay (multiplicatively) needs a starting value > 0")
    return typed


def check_range_test(cfg: DictConfig) -> None:
    """What the range test on the replicas (hdet=enabled) needs: two replicas or more (one sweep per axis), the
    one-cycle schedule of Adam or AdamW (the committed max LRs are its)."""
    nproc, group = int(cfg.trainer.nproc), int(cfg.trainer.sharding_group_size)
    if nproc // group < 2:
        fits = [g for g in range(nproc // 2, 0, -1) if nproc % g == 0]  # sharding groups that leave 2+ replicas
        fix = (f"set trainer.sharding_group_size={fits[0]} ({nproc // fits[0]} replicas of {fits[0]} ranks) or "
               if fits else "set trainer.nproc to 2 or more, or ")
        raise ConfigError(f"config hdet=enabled: the range test sweeps one axis per replica and needs at least 2 "
                          f"replicas; trainer.nproc={nproc} / trainer.sharding_group_size={group} makes 1: {fix}run "
                          "python -m recsys_hdet.lr_find (it sweeps the axes one after the other on one replica)")
    _require(cfg.optim.dense.type in ("adam", "adamw"), "optim.dense.type", str(cfg.optim.dense.type),
             "sets its own step size: hdet.range_test suggests max LRs for adam or adamw")


def command_usage(doc: str, usage: str, config_name: str, sections: Mapping[str, List[str]] = {}) -> str:
    """A Hydra command's ``--help`` from one source (:func:`data_tools.cli_help.help_text`): ``doc``, ``usage``,
    ``sections``, then every key of the schema of ``conf/<config_name>.yaml`` with its type, its default (the
    composed config's value) and its meaning (the schema's field docs)."""
    from data_tools.cli_help import help_text

    return help_text(doc, usage, SCHEMAS[config_name], compose(config_name, []), sections)


def _preset_summary(path: str) -> str:
    """A preset's description in full: the comment lines that open its file, joined."""
    words: List[str] = []
    with open(path) as f:
        for line in f:
            if line.startswith("# @package"):
                continue
            if not line.startswith("#"):
                break
            words.append(line[1:].strip())
    return " ".join(w for w in words if w)


def training_sections() -> Dict[str, List[str]]:
    """The presets a user runs (files starting with ``_`` are fragments the presets share, not presets), each
    described in full, and the config groups with their options, read from conf/ (train's and lr_find's --help)."""
    folder = os.path.join(CONF_DIR, "experiment")
    presets = [f"  {name[:-5]:<24}{_preset_summary(os.path.join(folder, name))}"
               for name in sorted(n for n in os.listdir(folder) if n.endswith(".yaml") and not n.startswith("_"))]
    groups = []
    for group in sorted(g for g in os.listdir(CONF_DIR) if os.path.isdir(os.path.join(CONF_DIR, g)) and g != "experiment"):
        options = sorted(n[:-5] for n in os.listdir(os.path.join(CONF_DIR, group)) if n.endswith(".yaml"))
        groups.append(f"  {group:<10}{', '.join(options)}")
    from data_tools.cli_help import key_lines

    forms = {f"keys of hdet={option} (only with that option)":
             key_lines(form, compose("config", [f"hdet={option}"]), "hdet.")
             for option, form in FORM_SCHEMAS.items() if option != "disabled"}
    return {"presets (+experiment=NAME)": presets, "config groups (group=option)": groups, **forms}


def remove_hydra_leftovers(run_dir: str, log_name: str) -> None:
    """A run that fails validation trains and writes nothing: Hydra has already written ``.hydra/``
    and an empty job log (``log_name``) into the run directory, so those go, and the directory too if that leaves
    it empty (a directory that held anything else is kept), and so do the empty parents Hydra made
    for it inside the working directory (outputs/<experiment>/)."""
    import shutil

    from recsys_hdet.run_dir import RunDir

    shutil.rmtree(RunDir(run_dir).path(RunDir.HYDRA), ignore_errors=True)
    log = os.path.join(run_dir, log_name)
    if os.path.isfile(log) and os.path.getsize(log) == 0:
        os.remove(log)
    path, cwd = os.path.abspath(run_dir), os.getcwd()
    while True:
        try:
            os.rmdir(path)
        except OSError:
            break  # not empty: it held something before this run
        path = os.path.dirname(path)
        if not path.startswith(cwd + os.sep):
            break


def compose(config_name: str = "config", overrides: Sequence[str] = ()) -> DictConfig:
    """``conf/<config_name>.yaml`` composed with ``overrides``, inside a Hydra command (its initialized Hydra) or
    outside one: the one place the project composes a config."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name=config_name, overrides=list(overrides))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


# Each command's config (conf/<name>.yaml) and the schema class at its root.
SCHEMAS = {"config": config_schema.TrainConfig, "evaluate": config_schema.EvaluateConfig,
           "export": config_schema.ExportConfig, "predict": config_schema.PredictConfig,
           "retrain": config_schema.RetrainConfig}


def check_composition(overrides: Sequence[str], config_name: str = "config") -> DictConfig:
    """Composes ``conf/<config_name>.yaml`` with ``overrides`` before Hydra's own run (and the retraining job's
    config), so that every composition error is one line, exit 2 (:func:`data_tools.cli_args.usage_error`): an
    unknown key (did you mean), a wrong type (the type expected), a bad choice, a key added with ``+`` that
    the schema does not declare, an unknown preset. Returns the composed config. Hydra's own keys
    (``hydra.*``, ``hydra/...``) are left to Hydra."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from data_tools.cli_args import composition_error, usage_error

    mine = [a for a in overrides if not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    try:
        cfg = compose(config_name, mine)
    except (HydraException, OmegaConfBaseException) as e:
        usage_error(composition_error(e, SCHEMAS[config_name]))
    try:
        check_known_keys(cfg)
    except ConfigError as e:
        usage_error(str(e))
    return cfg


def run_dir_argument() -> None:
    """``run_dir=DIR``, the run directory's one spelling in every command, becomes Hydra's ``hydra.run.dir=DIR``
    in the training commands' ``sys.argv`` before Hydra parses it (the composed config has no such key: the
    recorded config is unchanged). Exit 2 naming it for the old spelling ``hydra.run.dir=``, and for
    ``run_dir=`` in a multirun (each of its runs goes under ``hydra.sweep.dir``)."""
    from data_tools.cli_args import RUN_DIR_KEY, refuse_old_spellings, usage_error

    args = sys.argv[1:]
    refuse_old_spellings(args, RUN_DIR_KEY)
    given = [i for i, a in enumerate(args) if a.startswith("run_dir=")]
    if given and any(a in ("-m", "--multirun") for a in args):
        usage_error("run_dir= names one run; a multirun writes each of its runs under hydra.sweep.dir=DIR")
    for i in given:
        sys.argv[i + 1] = "hydra.run.dir=" + args[i][len("run_dir="):]


def require_given(cfg: DictConfig, placeholders: Mapping[str, str]) -> None:
    """A Hydra command's mandatory keys (``???`` in its YAML) that were not given: one line naming the first, exit
    status 2, as the commands without Hydra (:func:`data_tools.cli_args.parse`). ``placeholders``: key -> what
    to pass (``{"out": "MODEL_DIR"}``)."""
    from data_tools.cli_args import usage_error

    for key, placeholder in placeholders.items():
        if OmegaConf.is_missing(cfg, key):
            usage_error(f"config {key}: missing (pass {key}={placeholder})")


def run_hydra_command(main: Callable[[], None], composed: Callable[[], bool], usage: Callable[[], str],
                      renamed: Mapping[str, str] = {}, config_name: str = "config") -> None:
    """Runs a ``@hydra.main`` entry point of ``conf/<config_name>.yaml`` as a command: ``-h``/``--help`` prints
    ``usage()``; an argument spelled the old way (``renamed``: old -> new,
    :func:`data_tools.cli_args.old_spelling`) exits 2 naming the new one; ``+key=value`` is ``key=value`` for a
    key of the schema (:func:`data_tools.cli_args.known_plus`); the config is composed once first
    (:func:`check_composition`: any error one line, exit 2); Hydra's own exit 1 before the config was composed
    (a flag's run: ``-m``, ``--cfg``) becomes the usage status, 2. ``composed()``: whether ``main``'s body was
    entered."""
    from data_tools.cli_args import known_plus, refuse_old_spellings
    from data_tools.exit_status import ExitStatus

    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(usage())
        return
    refuse_old_spellings(sys.argv[1:], renamed)
    sys.argv[1:] = known_plus(sys.argv[1:], SCHEMAS[config_name])
    if not any(a.startswith("-") for a in sys.argv[1:]):  # Hydra's flags (-m, --cfg) compose their own way
        check_composition(sys.argv[1:], config_name)
    try:
        main()
    except SystemExit as e:
        if e.code == 1 and not composed():
            sys.exit(ExitStatus.USAGE)
        raise
