"""Where an HDET run's controller took each group's learning rate: per sync, each LR group's controlled base
in max-LR units (comparable with a plain run's max LR whatever the schedule's phase), from a run directory
or a results line, and the bases it ended at.

Read by the recovery study (its orderings, LR areas and figure) and by ``studies.probe_bias``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping, Tuple

from data_tools.fileio import read_jsonl
from recsys_hdet.constants import DENSE_GROUPS
from recsys_hdet.run_dir import RunDir
from studies.lr_area import run_schedules, schedules
from studies.record import sync_records


def max_lr_trajectory(path: str) -> List[Tuple[int, Dict[str, float]]]:
    """Per sync, each LR group's controlled base in max-LR units: the run's max LR times the base
    over the OneCycle schedule it replaces (at that step), so that it compares with the grid's
    max LRs whatever the schedule's phase (the annealed end is ~1e-5 of the peak). ``path``: a run
    directory (see :func:`record_trajectory` for a results line)."""
    run = RunDir(path)
    steps = run.summary()["steps"]
    return _trajectory(read_jsonl(run.path(RunDir.HDET)), run_schedules(path, steps), steps)


def record_trajectory(record: Mapping[str, Any]) -> List[Tuple[int, Dict[str, float]]]:
    """:func:`max_lr_trajectory` of a results line (its syncs' bases, 6 significant digits)."""
    return _trajectory(sync_records(record), schedules(record, record["steps"]), record["steps"])


def _trajectory(records, schedule, steps: int) -> List[Tuple[int, Dict[str, float]]]:
    out = []
    for r in records:
        if r.get("hparams") and "event" not in r:
            at = min(r["step"], steps - 1)
            out.append((r["step"], {g: schedule[g].max_lr * r["hparams"][f"lr/{g}"]["next_base"] / schedule[g](at)[0]
                                    for g in ("embedding", *DENSE_GROUPS)}))
    return out


def final_bases(record: Mapping[str, Any]) -> Dict[str, float]:
    """Each LR group's controlled base in max-LR units (:func:`record_trajectory`) of a results line,
    geometric mean over the last quarter of the syncs."""
    trajectory = record_trajectory(record)
    tail = trajectory[len(trajectory) - max(1, len(trajectory) // 4):]
    return {g: geomean([v[g] for _, v in tail]) for g in ("embedding", *DENSE_GROUPS)}


def geomean(xs) -> float:
    """The geometric mean of positive numbers."""
    return math.exp(statistics.fmean(math.log(x) for x in xs))
