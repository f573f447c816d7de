"""Whether a range test's answer is to be trusted on this model, from the curves the sweep already has: the check the
commit records (``check`` in each axis's record of ``range_test.json`` and ``summary.json``'s ``hdet.range_test``).
It never changes what is committed, and nothing prints it: judged against the settings' plateaus it missed its
pre-registered targets (it flagged most commits on the plateau), so a warning from it would be noise.

Pre-registered, with its thresholds and why, before any recorded commit was compared with a plateau
(docs/results/hdet_history.md, ``range-check-rule``); how often it flags a commit that lay off its setting's plateau:
``python -m studies.range_check`` (docs/results/rule_travels/range_check/). Reasons, besides the rule's own
off-the-map flags (:func:`recsys_hdet.hdet.range_test.rule.off_the_map`):

- ``minimum_near_end``: the smoothed minimum within one smoothing window of either end of the sweep, or the answer
  below the range's bottom;
- ``shallow_valley``: the valley's floor (where the smoothed loss lies within two standard deviations of a smoothed
  difference of its minimum) spans more than a decade;
- ``commit_on_slope``: at the committed multiplier less than half of the smoothed loss's fall had happened;
- ``no_clear_explosion``: the cut more than one smoothing window above the smoothed minimum;
- ``replicas_disagree``: two or more replicas swept the axis and their own minima lie more than x10^0.5 apart.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from recsys_hdet.hdet.range_test.rule import (descent, early_noise, off_the_map, read_curve, smoothed_curve,
                                               suggest_multiplier, sweep_multiplier)

# The answer's tolerance: the studies judge a commit by whether it lies within x3.2 (half a decade either way) of the
# best cell; a floor wider than this many decades leaves the minimum, and so the answer, less well placed than that.
FLOOR_DECADES = 1.0
FLOOR_SIGMAS = 2.0  # the floor's band: this many standard deviations of the difference of two smoothed points
SLOPE_FRACTION = 0.5  # the fall's midpoint: a commit where less of the fall had happened lies on the upper slope
REPLICA_FACTOR = 10 ** 0.5  # replicas' minima further apart than the x3.2 band disagree
REASONS = ("minimum_near_end", "shallow_valley", "commit_on_slope", "no_clear_explosion", "replicas_disagree")



def window_decades(low: float, high: float, sweep_steps: int, beta: float) -> float:
    """The smoothing's window in decades of the multiplier (the inverse of :func:`rule.smoothing`)."""
    return math.log10(high / low) / (sweep_steps - 1) / -math.log(beta)


def _finite(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x)


def noise_level(losses: Sequence[Optional[float]], cut: Optional[int], noise: Optional[float]) -> Optional[float]:
    """The early noise (``noise``: :func:`rule.early_noise`) in loss units: times the mean of the losses it was
    measured on."""
    if noise is None:
        return None
    end = max(4, len(losses) // 4) if cut is None else min(max(4, len(losses) // 4), cut)
    head = [float(x) for x in losses[:end] if _finite(x)]
    return noise * abs(sum(head) / len(head))


def floor_decades(smoothed: Sequence[float], best: int, cut: Optional[int], band: float,
                  multipliers: Sequence[float]) -> float:
    """The width in decades of the contiguous steps around ``best`` (before ``cut``) where the smoothed loss lies
    within ``band`` of its minimum."""
    end = len(smoothed) if cut is None else cut
    top = smoothed[best] + band
    lo = hi = best
    while lo > 0 and _finite(smoothed[lo - 1]) and smoothed[lo - 1] <= top:
        lo -= 1
    while hi + 1 < end and _finite(smoothed[hi + 1]) and smoothed[hi + 1] <= top:
        hi += 1
    return math.log10(multipliers[hi] / multipliers[lo])


def check_curve(losses: Sequence[Optional[float]], low: float, high: float, sweep_steps: int, beta: float,
                divisor: float, replicas: Sequence[Sequence[Optional[float]]] = (), read: str = "minimum") -> Dict[str, Any]:
    """The check of one axis's curve (``losses[k]``: the loss of sweep step k of a sweep from ``low`` to ``high`` in
    ``sweep_steps`` steps, read with the smoothing ``beta``, the point ``read`` and ``divisor``; ``replicas``: each replica's own curve when
    two or more swept the axis). Returns ``trusted`` (no reason applies), ``reasons`` (the off-the-map flags, then
    :data:`REASONS` in order; ``no_finite_loss`` alone for a curve without one) and the measures behind them:
    ``window_decades``, ``minimum_decades_from_ends`` (bottom, top), ``floor_decades``, ``fall_at_commit`` (the fraction
    of the fall done at the answer), ``cut_decades_above_minimum``, ``replica_spread`` (the ratio of the replicas'
    largest minimum to their smallest); None where undefined."""
    n = sweep_steps
    multipliers = [sweep_multiplier(k, low, high, n) for k in range(len(losses))]
    best, cut = read_curve(losses, beta)
    window = window_decades(low, high, n, beta)
    out: Dict[str, Any] = {"window_decades": window, "minimum_decades_from_ends": None, "floor_decades": None,
                           "fall_at_commit": None, "cut_decades_above_minimum": None, "replica_spread": None}
    if best is None:
        return {"trusted": False, "reasons": ["no_finite_loss"], **out}
    minimum = multipliers[best]
    answer = suggest_multiplier(range(1, len(losses) + 1), losses, low, high, n, beta, divisor, read)
    fell, noise = descent(losses, beta), early_noise(losses, cut)
    sigma = noise_level(losses, cut, noise)
    reasons: List[str] = list(off_the_map(answer, cut, fell, noise, low, high, n, divisor))
    ends = (math.log10(minimum / low), math.log10(high / minimum))
    out["minimum_decades_from_ends"] = list(ends)
    if min(ends) < window - 1e-9 or answer < low * (1 - 1e-9):
        reasons.append("minimum_near_end")
    smoothed = smoothed_curve(losses, beta)
    if sigma is not None:
        band = FLOOR_SIGMAS * math.sqrt(2) * sigma * math.sqrt((1 - beta) / (1 + beta))
        out["floor_decades"] = floor_decades(smoothed, best, cut, band, multipliers)
        if out["floor_decades"] > FLOOR_DECADES + 1e-9:
            reasons.append("shallow_valley")
    total = smoothed[0] - smoothed[best]
    if total > 0:
        at = 0 if answer <= low else min(best, round(math.log(answer / low) / math.log(high / low) * (n - 1)))
        out["fall_at_commit"] = (smoothed[0] - smoothed[at]) / total
        if out["fall_at_commit"] < SLOPE_FRACTION:
            reasons.append("commit_on_slope")
    if cut is not None:
        out["cut_decades_above_minimum"] = math.log10(multipliers[cut] / minimum)
        if out["cut_decades_above_minimum"] > window + 1e-9:
            reasons.append("no_clear_explosion")
    if len(replicas) >= 2:
        minima = [read_curve(r, beta)[0] for r in replicas]
        if any(m is None for m in minima):
            out["replica_spread"] = math.inf
        else:
            out["replica_spread"] = multipliers[max(minima)] / multipliers[min(minima)]
        if out["replica_spread"] > REPLICA_FACTOR * (1 + 1e-9):
            reasons.append("replicas_disagree")
    if out["replica_spread"] == math.inf:
        out["replica_spread"] = None  # JSON has no infinity: the reason says it
    return {"trusted": not reasons, "reasons": reasons, **out}
