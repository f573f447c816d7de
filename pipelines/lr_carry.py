"""Carried learning rates (``carry_lr``): each group's max LR for the next day from the per-group
bases the published model's HDET controller ended with, clamped around the preset's own rates.
"""

from __future__ import annotations

from typing import Dict, Optional

from omegaconf import DictConfig

from recsys_hdet.config import compose
from recsys_hdet.run_dir import RunDir



def final_hdet_bases(run_dir: str) -> Dict[str, float]:
    """Per LR group, the max LR the controller ended the pass with (RunDir.SUMMARY's
    ``lr.controlled_max_lr``, written by the trainer: the run's max LR times the last sync's base
    over the schedule it replaces); empty when HDET was off."""
    summary = RunDir(run_dir).summary()
    if summary is None:
        return {}
    lr = summary.get("lr") or {}
    return {g: float(v) for g, v in (lr.get("controlled_max_lr") or {}).items()}


def preset_lrs(cfg: DictConfig, experiment: str) -> Dict[str, float]:
    """Each group's max LR as the day's preset sets it (with the job's ``overrides``): what a carried
    LR is clamped to and shown against."""
    train_cfg = compose("config", [f"+experiment={experiment}", *[str(o) for o in cfg.overrides]])
    return {g: float(v) for g, v in train_cfg.optim.lr.items()}


def clamp_carried(bases: Dict[str, float], preset: Dict[str, float], factor: Optional[float]) -> Dict[str, float]:
    """The published model's per-group bases as the next day's max LRs, each kept within
    [preset / factor, preset x factor] (no bound with ``factor`` null). A controller that drifts
    one way day after day (short-horizon bias lowers LRs) cannot carry the job away from the
    preset further than that."""
    if factor is None:
        return {g: float(v) for g, v in bases.items()}
    return {g: min(max(float(v), preset[g] / float(factor)), preset[g] * float(factor)) for g, v in bases.items()}
