"""What a version was trained with, and the check that the next day trains as the published version
did: a changed setting between days is refused (exit 2, the keys named) unless ``allow_config_change=true``.

Two things are compared with the current version's:
- the job's settings that shape a model (:data:`SETTING_KEYS`), recorded in its manifest as ``settings``;
- the day's resolved training config (the preset's content, so an edited preset or a code update that
  changes a default counts) against the version's saved config (``RunDir.CONFIG``), leaving out the keys the job
  sets itself (:data:`JOB_KEYS`: the day window, the warm start, the holdout, checked on their own; the
  max LRs too when ``carry_lr`` carries them). Only between
  runs of one experiment: a cold start trained with ``cold_start_experiment`` is compared on the
  settings alone when the daily ``experiment`` differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from recsys_hdet.run_dir import RunDir

SETTING_KEYS = ("experiment", "cold_start_experiment", "overrides", "carry_lr", "carry_lr_clamp", "seed")
JOB_KEYS = ("data.until", "data.skip_days", "data.train_days", "data.eval_days", "data.holdout", "data.root",
            "data.generator", "seed", "trainer.warm_start", "trainer.warm_start_preset", "trainer.resume", "hydra")


def job_settings(cfg: DictConfig) -> Dict[str, Any]:
    return {k: OmegaConf.to_container(cfg[k]) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in SETTING_KEYS}


def settings_hash(settings: Mapping[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=16).hexdigest()


def _flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, dict):
        out: Dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def changed_settings(cfg: DictConfig, parent: Mapping[str, Any], parent_dir: str, training: DictConfig,
                     experiment: str) -> List[str]:
    """``key: old -> new`` for every setting and training-config key that differs from the current
    version's (``parent``: its manifest, ``parent_dir``: its directory); ``training``: the day's
    composed training config, ``experiment``: the preset it was composed from."""
    changes = []
    old = parent.get("settings")
    if old is not None:  # versions from before settings were recorded have nothing to compare
        new = job_settings(cfg)
        changes += [f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in SETTING_KEYS if old.get(k) != new[k]]
    parent_run = RunDir(parent_dir)
    if parent.get("experiment") != experiment or not os.path.isfile(parent_run.path(RunDir.CONFIG)):
        return changes
    return changes + config_changes(parent_run.config(), training, bool(cfg.carry_lr))


def _job_key(key: str, skip: Sequence[str] = JOB_KEYS) -> bool:
    return any(key == s or key.startswith(s + ".") for s in skip)


def config_changes(was: DictConfig, now: DictConfig, carry_lr: bool) -> List[str]:
    """``key: old -> new`` for every key of two resolved training configs that differs, leaving out the keys the
    job sets itself (:data:`JOB_KEYS`; the max LRs too when ``carry_lr`` carries them)."""
    skip = JOB_KEYS + (("optim.lr",) if carry_lr else ())
    old = _flat(OmegaConf.to_container(was, resolve=True))
    new = _flat(OmegaConf.to_container(now, resolve=True))
    return [f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
            for key in sorted(set(old) | set(new))
            if not _job_key(key, skip) and old.get(key, "<absent>") != new.get(key, "<absent>")]


def run_overrides(recorded: Sequence[str]) -> List[str]:
    """A training run's own overrides (its ``RunDir.OVERRIDES``) that every day's run of the job must repeat to
    train as it did (``adopt``): all but the preset (``+experiment=``: the job's ``experiment``) and those of
    the keys the job sets itself (:data:`JOB_KEYS`: the day window, the data set, the seed, the warm start)."""
    kept = []
    for o in recorded:
        key = str(o).lstrip("+~").split("=", 1)[0]
        if key != "experiment" and not _job_key(key):
            kept.append(str(o))
    return kept
