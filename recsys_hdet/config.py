"""Checks of the composed config, run before any worker starts.

Hydra and OmegaConf check structure (unknown groups, missing files); these check values, and each
error names the config key, the value and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

from recsys_hdet.models.ranker import PARAM_GROUPS


class ConfigError(ValueError):
    pass


def _require(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ConfigError(f"config {key}={value!r}: {expected}")


def _positive_number(cfg: DictConfig, key: str) -> None:
    value = cfg
    for part in key.split("."):
        value = value[part]
    _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0,
             key, value, "must be a finite number > 0")


def _positive_int(cfg: DictConfig, key: str) -> None:
    value = cfg
    for part in key.split("."):
        value = value[part]
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key, value, "must be an integer >= 1")


def validate_config(cfg: DictConfig) -> None:
    for key in ("trainer.nproc", "trainer.sharding_group_size", "trainer.log_every", "trainer.eval_batch_size", "trainer.embedding_sync_every",
                "data.batch_size", "data.eval_days", "model.embedding_dim", "model.attention_heads"):
        _positive_int(cfg, key)
    nproc, sgs = cfg.trainer.nproc, cfg.trainer.sharding_group_size
    _require(nproc % sgs == 0, "trainer.sharding_group_size", sgs, f"must divide trainer.nproc={nproc}")
    _require(cfg.model.embedding_dim % cfg.model.attention_heads == 0, "model.attention_heads",
             cfg.model.attention_heads, f"must divide model.embedding_dim={cfg.model.embedding_dim}")
    _require(0.0 <= float(cfg.model.dropout) < 1.0, "model.dropout", cfg.model.dropout, "must be in [0, 1)")
    for group in PARAM_GROUPS:
        _require(group in cfg.optim.lr, f"optim.lr.{group}", None, "missing: every parameter group needs a max LR")
        _positive_number(cfg, f"optim.lr.{group}")
    _positive_number(cfg, "trainer.diverge_loss")
    _require(len(cfg.tasks) >= 1, "tasks", dict(cfg.tasks), "declare at least one task")
    for task, spec in cfg.tasks.items():
        w = spec.weight
        _require(isinstance(w, (int, float)) and w >= 0 and math.isfinite(w), f"tasks.{task}.weight", w,
                 "must be a finite number >= 0")
    _require(sum(float(s.weight) for s in cfg.tasks.values()) > 0, "tasks", "all weights 0", "some task needs a weight > 0")
    s = cfg.optim.schedule
    _require(s.name == "one_cycle", "optim.schedule.name", s.name, "only 'one_cycle' is implemented")
    _require(0.0 < float(s.pct_start) < 1.0, "optim.schedule.pct_start", s.pct_start, "must be in (0, 1)")
    _positive_number(cfg, "optim.schedule.div_factor")
    _positive_number(cfg, "optim.schedule.final_div_factor")
    if cfg.hdet.enabled:
        from recsys_hdet.hdet.engine import HDETConfig

        h = cfg.hdet
        try:
            HDETConfig(alpha=float(h.alpha), sync_every=int(h.sync_every), controller_start=int(h.controller_start),
                       beta=float(h.beta), sigma=float(h.sigma), lam=float(h.lam), autolr=bool(h.autolr), seed=int(h.seed),
                       decay=str(h.decay))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        _require(float(h.ceiling_multiple) >= 1.0, "hdet.ceiling_multiple", h.ceiling_multiple, "must be >= 1")
        _require(float(h.warm_init.nu) >= 0.0, "hdet.warm_init.nu", h.warm_init.nu, "must be >= 0")
    skip = cfg.data.get("skip_days", 0)
    _require(isinstance(skip, int) and not isinstance(skip, bool) and skip >= 0, "data.skip_days", skip,
             "must be an integer >= 0")
    if cfg.data.get("train_days") is not None:
        _positive_int(cfg, "data.train_days")
