"""A run's learning rates against its preset's: each group's OneCycle schedule as the run built it, the
preset's own max LRs, and the LR area (the pass's mean log-multiplier over the preset's plain schedule).

A results line records ``schedule``, ``max_lr``, ``preset_lr`` and ``lr_area``
(:func:`studies.record.record_from_run_dir`); :func:`schedules` rebuilds the run's schedules from a line,
:func:`run_schedules` from a run directory.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional

from recsys_hdet.constants import PARAM_GROUPS as GROUPS
from recsys_hdet.run_dir import RunDir

_PRESET_LRS: Dict[str, Dict[str, float]] = {}


def preset_lrs(preset: str) -> Dict[str, float]:
    """The max LR per group of ``+experiment=<preset>`` as conf/ composes it, no other override."""
    if preset not in _PRESET_LRS:
        from recsys_hdet.config import compose

        cfg = compose("config", [f"+experiment={preset}"])
        _PRESET_LRS[preset] = {g: float(cfg.optim.lr[g]) for g in GROUPS}
    return dict(_PRESET_LRS[preset])


def one_cycle(schedule: Mapping[str, Any], max_lr: float, total_steps: int, group: Optional[str] = None):
    """The OneCycle schedule ``schedule`` (a run's ``optim.schedule``, as a results line records it: the keys it
    lacks read as the schema's defaults) at ``max_lr`` over ``total_steps``; with ``group``, that group's (its own
    decay where ``optim.schedule.groups`` gives one), else the shared one-cycle."""
    from omegaconf import OmegaConf

    from recsys_hdet.components.lr_scheduler import build_one_cycle
    from recsys_hdet.optim_schema import ScheduleConfig

    return build_one_cycle(OmegaConf.merge(OmegaConf.structured(ScheduleConfig), schedule), max_lr, total_steps, group)


def lr_area(metrics: Iterable[Mapping[str, Any]], schedule: Mapping[str, Any], preset_lr: Mapping[str, float],
            total_steps: int) -> Dict[str, float]:
    """Per group: exp(mean over the logged steps of log(logged LR / the preset's schedule at that step)), the preset's
    schedule being the shared one-cycle (a group's own decay counts in its area). The trainer logs the LR the step
    ran with (the schedule at min(step, total - 1))."""
    plain = {g: one_cycle(schedule, preset_lr[g], total_steps) for g in preset_lr}
    logs: Dict[str, List[float]] = {g: [] for g in preset_lr}
    for m in metrics:
        if "lr" not in m or "step" not in m:
            continue
        at = min(int(m["step"]), total_steps - 1)
        for g, lr in m["lr"].items():
            if g in plain and lr and lr > 0 and math.isfinite(lr):
                logs[g].append(math.log(lr / plain[g](at)[0]))
    return {g: math.exp(statistics.fmean(v)) for g, v in logs.items() if v}


def schedules(record: Mapping[str, Any], total_steps: Optional[int] = None) -> Dict[str, Any]:
    """Each group's schedule as the run of a results line built it (its max LR over its pass)."""
    steps = total_steps or record.get("total_steps") or record["steps"]
    return {g: one_cycle(record["schedule"], record["max_lr"][g], steps, g) for g in record["max_lr"]}


def run_schedules(path: str, steps: int) -> Dict[str, Any]:
    """A run directory's schedule per group (its resolved config) over ``steps`` steps."""
    from recsys_hdet.components.lr_scheduler import build_one_cycle

    cfg = RunDir(path).config()
    return {g: build_one_cycle(cfg.optim.schedule, float(cfg.optim.lr[g]), steps, g) for g in GROUPS}
