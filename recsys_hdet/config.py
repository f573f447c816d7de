"""Checks of the composed config, run before any worker starts.

Hydra and OmegaConf check structure (unknown groups, missing files, a key set without ``+`` that no
file defines); these check values, and keys added with ``+`` that no config file knows, and each
error names the config key, the value and what is allowed.

Limits: the known keys are those some file under ``conf/`` sets (the groups' options and the
experiment presets), not a typed schema: a key a preset adds is known everywhere.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
from typing import Any, Iterator, Set

from omegaconf import DictConfig, OmegaConf

from recsys_hdet.components.dataloader import TRAIN_EXPOSURES
from recsys_hdet.models.ranker import PARAM_GROUPS


class ConfigError(ValueError):
    pass


def _require(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"config {key}={value!r}: {expected}")


def _positive_number(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
             key, value, "must be a finite number > 0")


def _positive_int(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key, value, "must be an integer >= 1")


PROBE_SIGNALS = ("probe", "averaged_probe", "anneal_probe")  # the signals that score reserved rows


def probe_rows(cfg: DictConfig) -> int:
    """Rows reserved from each training day (never trained on): ``data.reserve_rows`` when set (so that
    plain and HDET runs train on the same rows), else HDET's probe rows when the probe signal is on,
    else 0 (every other run, alpha = 0 with the default signal included, trains on every row)."""
    reserved = cfg.data.get("reserve_rows")
    if reserved is not None:
        return int(reserved)
    h = cfg.hdet
    return int(h.probe_rows) if h.enabled and h.get("signal") in PROBE_SIGNALS else 0


CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
FREE_FORM = ("tasks", "hydra")  # mappings whose keys are the user's (task names) or Hydra's own


def _key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _key_paths(value, path)


@functools.lru_cache(maxsize=1)
def known_keys() -> Set[str]:
    """Every key path some training config file sets: conf/config.yaml, each group's options (under
    the group's name) and the experiment presets (global)."""
    known: Set[str] = set(_key_paths(OmegaConf.to_container(OmegaConf.load(os.path.join(CONF_DIR, "config.yaml")))))
    for group in sorted(os.listdir(CONF_DIR)):
        folder = os.path.join(CONF_DIR, group)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if name.endswith(".yaml"):
                tree = OmegaConf.to_container(OmegaConf.load(os.path.join(folder, name)))
                known.update(_key_paths(tree, "" if group == "experiment" else group))
    return known


def check_known_keys(cfg: DictConfig) -> None:
    """A key no config file sets (added with ``+``, e.g. ``+hdet.alpah=0.1``) is a typo, not a
    setting: nothing would read it."""
    known = known_keys()
    for path in _key_paths(OmegaConf.to_container(cfg, resolve=False)):
        if path.split(".")[0] in FREE_FORM or path in known:
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        siblings = sorted(k.rsplit(".", 1)[-1] for k in known
                          if (k.rsplit(".", 1)[0] if "." in k else "") == parent)
        close = difflib.get_close_matches(path.rsplit(".", 1)[-1], siblings, n=1)
        raise ConfigError(f"config {path}: unknown key (no config file sets it, so nothing would read it)"
                          + (f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else "")
                          + (f" Keys of {parent}: {', '.join(siblings)}" if parent and siblings else ""))


def validate_config(cfg: DictConfig) -> None:
    check_known_keys(cfg)
    for key in ("trainer.nproc", "trainer.sharding_group_size", "trainer.log_every", "trainer.eval_batch_size", "trainer.embedding_sync_every",
                "data.batch_size", "data.eval_days", "model.embedding_dim", "model.attention_heads"):
        _positive_int(cfg, key)
    nproc, sgs = cfg.trainer.nproc, cfg.trainer.sharding_group_size
    _require(nproc % sgs == 0, "trainer.sharding_group_size", sgs, f"must divide trainer.nproc={nproc}")
    _require(cfg.model.embedding_dim % cfg.model.attention_heads == 0, "model.attention_heads",
             cfg.model.attention_heads, f"must divide model.embedding_dim={cfg.model.embedding_dim}")
    _require(0.0 <= float(cfg.model.dropout) < 1.0, "model.dropout", cfg.model.dropout, "must be in [0, 1)")
    _positive_number(cfg, "model.attention_temperature")
    _require(isinstance(cfg.model.get("compile_dense", False), bool), "model.compile_dense",
             cfg.model.get("compile_dense"), "must be true or false")
    _require(0.0 <= float(cfg.loss.label_smoothing) < 1.0, "loss.label_smoothing", cfg.loss.label_smoothing,
             "must be in [0, 1)")
    for group in PARAM_GROUPS:
        _require(group in cfg.optim.lr, f"optim.lr.{group}", None, "missing: every parameter group needs a max LR")
        _positive_number(cfg, f"optim.lr.{group}")
    _require(cfg.trainer.get("train_pipeline") in ("sparse_dist", "base"), "trainer.train_pipeline",
             cfg.trainer.get("train_pipeline"), "choose sparse_dist or base")
    _positive_number(cfg, "trainer.diverge_loss")
    rollbacks = OmegaConf.select(cfg, "trainer.rollback.max_rollbacks")
    _require(isinstance(rollbacks, int) and not isinstance(rollbacks, bool) and rollbacks >= 0,
             "trainer.rollback.max_rollbacks", rollbacks, "must be an integer >= 0 (0: off)")
    factor = OmegaConf.select(cfg, "trainer.rollback.lr_factor")
    _require(isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1,
             "trainer.rollback.lr_factor", factor, "must be a number in (0, 1]")
    every, log_every = cfg.trainer.periodic_checkpoint.every_steps, cfg.trainer.log_every
    if rollbacks and isinstance(every, int) and every > 0:
        # A checkpoint is then written where a divergence check has just passed, so a resumed run
        # starts from the state the uninterrupted one would roll back to (components/rollback.py).
        _require(every % log_every == 0, "trainer.periodic_checkpoint.every_steps", every,
                 f"must be a multiple of trainer.log_every={log_every} while trainer.rollback.max_rollbacks > 0")
    _positive_int(cfg, "trainer.periodic_checkpoint.keep_last")
    _positive_number(cfg, "trainer.collective_timeout_s")
    for key in ("trainer.periodic_checkpoint.every_steps", "trainer.max_restarts"):
        value = OmegaConf.select(cfg, key)
        _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, key, value,
                 "must be an integer >= 0")
    resume = OmegaConf.select(cfg, "trainer.resume")
    _require(isinstance(resume, str) and bool(resume), "trainer.resume", resume,
             "must be auto, never, or the path of a checkpoint/step-<N> directory")
    tensorboard = cfg.trainer.get("tensorboard", True)
    _require(isinstance(tensorboard, bool), "trainer.tensorboard", tensorboard, "must be true or false")
    _require(len(cfg.tasks) >= 1, "tasks", dict(cfg.tasks), "declare at least one task")
    for task, spec in cfg.tasks.items():
        w = spec.weight
        _require(isinstance(w, (int, float)) and w >= 0 and math.isfinite(w), f"tasks.{task}.weight", w,
                 "must be a finite number >= 0")
    _require(sum(float(s.weight) for s in cfg.tasks.values()) > 0, "tasks", "all weights 0", "some task needs a weight > 0")
    holdout = cfg.data.get("holdout") or {}
    fraction = holdout.get("fraction", 0.0)
    _require(isinstance(fraction, (int, float)) and 0.0 <= float(fraction) < 1.0, "data.holdout.fraction", fraction,
             "must be a number in [0, 1)")
    until = cfg.data.get("until")
    _require(until is None or (len(str(until)) == 8 and str(until).isdigit()), "data.until", until,
             "must be null or a day YYYYMMDD")
    _require(cfg.optim.dense.type in ("adam", "adamw", "prodigy", "schedulefree_adamw"), "optim.dense.type",
             cfg.optim.dense.type, "one of 'adam', 'adamw', 'prodigy', 'schedulefree_adamw'")
    from recsys_hdet.components.optimizer import CUDA_ONLY_EMBEDDING_OPTIMIZERS, EMBEDDING_OPTIMIZERS

    kind = cfg.optim.embedding.type
    _require(kind in EMBEDDING_OPTIMIZERS, "optim.embedding.type", kind,
             "one of " + ", ".join(repr(k) for k in EMBEDDING_OPTIMIZERS))
    if kind in CUDA_ONLY_EMBEDDING_OPTIMIZERS:
        import torch

        _require(torch.cuda.is_available(), "optim.embedding.type", kind,
                 "fbgemm's CPU kernels have no fused " + kind + " and this machine has no CUDA device: choose one of "
                 + ", ".join(repr(k) for k in EMBEDDING_OPTIMIZERS if k not in CUDA_ONLY_EMBEDDING_OPTIMIZERS))
    if cfg.optim.dense.type == "prodigy":
        _positive_number(cfg, "optim.dense.d0")
    s = cfg.optim.schedule
    _require(s.name == "one_cycle", "optim.schedule.name", s.name, "only 'one_cycle' is implemented")
    _require(0.0 < float(s.pct_start) < 1.0, "optim.schedule.pct_start", s.pct_start, "must be in (0, 1)")
    _positive_number(cfg, "optim.schedule.div_factor")
    _positive_number(cfg, "optim.schedule.final_div_factor")
    if cfg.hdet.enabled:
        from recsys_hdet.hdet.engine import HDETConfig

        h = cfg.hdet
        try:
            HDETConfig.from_mapping(h)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if h.get("embedding_sync_every") is not None:
            _positive_int(cfg, "hdet.embedding_sync_every")
        _require(float(h.ceiling_multiple) >= 1.0, "hdet.ceiling_multiple", h.ceiling_multiple, "must be >= 1")
        _require(float(h.warm_init.nu) >= 0.0, "hdet.warm_init.nu", h.warm_init.nu, "must be >= 0")
        from recsys_hdet.hdet.signals import SIGNALS

        signal = h.get("signal", "train")
        _require(signal in SIGNALS, "hdet.signal", signal, "one of " + ", ".join(repr(x) for x in SIGNALS))
        if signal in PROBE_SIGNALS:
            _positive_int(cfg, "hdet.probe_rows")
            _require(cfg.data.get("reserve_rows") != 0, "data.reserve_rows", 0,
                     f"hdet.signal={signal} scores rows reserved from training: null (hdet.probe_rows) or > 0")
            if signal == "anneal_probe":
                _positive_int(cfg, "hdet.anneal_probe.steps")
                cooldown_rows = int(h.anneal_probe.steps) * int(cfg.data.batch_size)
                _require(cooldown_rows < probe_rows(cfg), "hdet.anneal_probe.steps", h.anneal_probe.steps,
                         f"its cooldown trains on {cooldown_rows} reserved rows (x data.batch_size="
                         f"{cfg.data.batch_size}), leaving none of the {probe_rows(cfg)} reserved rows "
                         "(data.reserve_rows, else hdet.probe_rows) for the probe")
            if signal == "averaged_probe":
                fraction = OmegaConf.select(cfg, "hdet.averaged_probe.fraction")
                _require(isinstance(fraction, (int, float)) and 0 < float(fraction) <= 1,
                         "hdet.averaged_probe.fraction", fraction, "must be a number in (0, 1]")
                _require(OmegaConf.select(cfg, "hdet.averaged_probe.tensors") in ("dense", "all"),
                         "hdet.averaged_probe.tensors", OmegaConf.select(cfg, "hdet.averaged_probe.tensors"),
                         "'dense' or 'all'")
            mix = h.get("probe_mix", 1.0)
            _require(mix == "replicas" or (isinstance(mix, (int, float)) and 0.0 < float(mix) <= 1.0),
                     "hdet.probe_mix", mix, "'replicas' or a number in (0, 1]")
        from recsys_hdet.components.hparam_bindings import EXPLORABLE

        explore = h.get("explore") or {}
        for name, spec in explore.items():
            _require(name in EXPLORABLE, f"hdet.explore.{name}", spec, f"unknown; explorable: {list(EXPLORABLE)}")
            if spec is None:
                continue
            _require(float(spec.get("spread", -1)) >= 0, f"hdet.explore.{name}.spread", spec.get("spread"),
                     "must be a number >= 0")
            if name in ("dropout", "label_smoothing"):
                _require(0 < float(spec.get("max", -1)) < 1, f"hdet.explore.{name}.max", spec.get("max"), "must be in (0, 1)")
        if explore.get("weight_decay") is not None:
            _require(cfg.optim.dense.type == "adamw", "optim.dense.type", cfg.optim.dense.type,
                     "exploring weight decay needs decoupled weight decay: set optim.dense.type=adamw")
            _require(float(cfg.optim.dense.weight_decay) > 0, "optim.dense.weight_decay", cfg.optim.dense.weight_decay,
                     "exploring weight decay (multiplicatively) needs a starting value > 0")
    reserved = cfg.data.get("reserve_rows")
    _require(reserved is None or (isinstance(reserved, int) and not isinstance(reserved, bool) and reserved >= 0),
             "data.reserve_rows", reserved, "must be null or an integer >= 0")
    stop = cfg.trainer.get("stop_at_step")
    _require(stop is None or (isinstance(stop, int) and not isinstance(stop, bool) and stop >= 1),
             "trainer.stop_at_step", stop, "must be null or an integer >= 1")
    keep_at = list(cfg.trainer.periodic_checkpoint.get("keep_at") or [])
    _require(all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < 1 for f in keep_at),
             "trainer.periodic_checkpoint.keep_at", keep_at, "must be a list of fractions of the pass in (0, 1)")
    skip = cfg.data.get("skip_days", 0)
    _require(isinstance(skip, int) and not isinstance(skip, bool) and skip >= 0, "data.skip_days", skip,
             "must be an integer >= 0")
    if cfg.data.get("train_days") is not None:
        _positive_int(cfg, "data.train_days")
    exposure = cfg.data.get("train_exposure", "all")
    _require(isinstance(exposure, str) and exposure in TRAIN_EXPOSURES, "data.train_exposure", exposure,
             "'all' (train on every impression) or 'standard' (drop the random-exposure impressions, is_rand = 1)")
