"""Paired differences, the one statistic every study compares contenders by: the mean of per-seed differences
and its two-sided 95% Student's t-interval (a small t-table, conservative between its rows).

Pairing itself (which seeds, which records may be paired) is the fairness contract's:
:func:`studies.contract.paired_over_seeds`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Optional, Sequence, Tuple

# Two-sided 95% quantiles of Student's t by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    """The quantile for ``dof`` degrees of freedom (the nearest tabulated dof below: conservative)."""
    return T95[max(k for k in T95 if k <= dof)] if dof <= 30 else 1.96


def paired(diffs: Sequence[float]) -> Optional[Dict[str, Any]]:
    """Mean of paired differences and its 95% t-interval (None for the interval with one pair)."""
    if not diffs:
        return None
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    half = t95(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(diffs)}


def paired_ci95(diffs: Sequence[float]) -> Optional[Tuple[float, float, float]]:
    """(mean, low, high) of :func:`paired`; None with fewer than 2 pairs."""
    p = paired(diffs)
    return None if p is None or p["ci95"] is None else (p["mean"], *p["ci95"])
