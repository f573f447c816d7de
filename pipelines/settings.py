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
from typing import Any, Dict, List, Mapping

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
    skip = JOB_KEYS + (("optim.lr",) if cfg.carry_lr else ())
    was = _flat(OmegaConf.to_container(parent_run.config(), resolve=True))
    now = _flat(OmegaConf.to_container(training, resolve=True))
    for key in sorted(set(was) | set(now)):
        if any(key == s or key.startswith(s + ".") for s in skip):
            continue
        if was.get(key, "<absent>") != now.get(key, "<absent>"):
            changes.append(f"{key}: {was.get(key, '<absent>')!r} -> {now.get(key, '<absent>')!r}")
    return changes
