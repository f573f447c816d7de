"""How an LR range test's curve is read: fastai's classic suggestion (the smoothed minimum / 10, or / another
divisor), with fastai's per-step smoothing or a smoothing window fixed in decades of the sweep, where the
suggestion lies in the range, and whether it lies off the map.

The one owner of the rule that both range tests apply: the command that sweeps before a plain run
(:mod:`recsys_hdet.lr_find`, one sweep per axis after the other) and the range test on HDET's replicas
(:mod:`recsys_hdet.hdet.range_test.sweep`, the axes swept at once by different replicas). The sweep's schedule
itself (the rate at each step) is :mod:`recsys_hdet.components.range_schedule`'s, which the plain run's LR
schedules use too.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from recsys_hdet.components.range_schedule import check_sweep, sweep_multiplier  # noqa: F401 (re-exported)

# fastai's per-step smoothing of the loss (a window of 50 steps), which lr_find applies as fastai does. A
# window of 50 steps spans 3.5 decades of the multiplier on a 100-step sweep over 7 decades, and the smoothed
# minimum lags the loss's by up to a decade; :func:`smoothing` gives the factor of a window fixed in decades
# instead (the range test on the replicas reads with one: recsys_hdet.hdet.range_test.sweep).
CLASSIC_SMOOTHING = 0.98
# fastai's rule: the suggestion is the multiplier at the smoothed minimum divided by this, so it lies in
# [low, high] / this (range_edge reads those ends). The range test on the replicas divides per axis (its
# hdet.range_test.divisors: how far below its stability edge an axis trains best, which depends on the model).
SUGGESTION_DIVISOR = 10.0
# Which point of the curve the divisor divides: "minimum", fastai's (the smoothed minimum); "bottom_centre", the
# geometric mean of the smoothed minimum and the cut (where the smoothed loss exceeds 4x its minimum: the explosion),
# the centre of the curve's bottom in decades. The second was fitted on the benchmark's and data_regime's recorded
# curves after the first missed on data_regime (docs/results/rule_travels/rule_fit/; hdet_history.md,
# range-rule-revised): the minimum's distance below the best rate moved by half a decade between them.
READS = ("minimum", "bottom_centre")


def smoothing(low: float, high: float, sweep_steps: int, decades: float) -> float:
    """The per-step factor of the loss's moving average whose time constant spans ``decades`` decades of a sweep
    from ``low`` to ``high`` in ``sweep_steps`` steps: exp(-(decades per step) / ``decades``)."""
    return math.exp(-math.log10(high / low) / (sweep_steps - 1) / decades)


def smoothed_curve(losses: Sequence[Optional[float]], beta: float) -> list:
    """The losses as :func:`read_curve` reads them: an exponential moving average (``beta``, bias-corrected), up to
    the first non-finite loss (non-finite from there)."""
    avg, out = 0.0, []
    for k, loss in enumerate(losses):
        if loss is None or not math.isfinite(loss):
            return out + [math.nan] * (len(losses) - k)
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta ** (k + 1)))
    return out


def read_curve(losses: Sequence[Optional[float]], beta: float) -> Tuple[Optional[int], Optional[int]]:
    """How the rule reads a range test's losses: the loss smoothed by an exponential moving average (``beta``,
    bias-corrected) and cut where it exceeds 4x its minimum or turns non-finite. Returns (the index of the
    smoothed minimum before the cut, None without a finite loss; the index of the cut, None if it never comes)."""
    avg, best, best_at = 0.0, math.inf, None
    for k, loss in enumerate(losses):
        if loss is None or not math.isfinite(loss):
            return best_at, k
        avg = beta * avg + (1 - beta) * loss
        smoothed = avg / (1 - beta ** (k + 1))
        if smoothed > 4 * best:
            return best_at, k
        if smoothed < best:
            best, best_at = smoothed, k
    return best_at, None


# A curve "never descended" when its smoothed loss falls from its first value to its minimum by less than this
# fraction of the first value, or by less than NOISE_MULTIPLE x the raw loss's step-to-step noise over the sweep's
# first quarter (early_noise). Its minimum then says nothing about a rate (a warm-started model, an axis the loss
# does not depend on). Measured (docs/hdet.md, off the map): every one of the 180 recorded cold-start sweeps of the
# benchmark's studies fell by at least 29x its early noise and 48% of its first value; the tiny data set's
# warm-started sweeps fell by 0.75x (dense) and 2.2x (embedding) their noise.
MIN_DESCENT = 0.02
NOISE_MULTIPLE = 10.0


def descent(losses: Sequence[Optional[float]], beta: float) -> Optional[float]:
    """How far the smoothed loss (:func:`read_curve`'s) fell from its first value to its minimum before the cut, as
    a fraction of the first value; None without a finite loss."""
    best, _ = read_curve(losses, beta)
    if best is None:
        return None
    smoothed = smoothed_curve(losses[:best + 1], beta)
    return (smoothed[0] - smoothed[-1]) / abs(smoothed[0]) if smoothed[0] else 0.0


def early_noise(losses: Sequence[Optional[float]], cut: Optional[int] = None) -> Optional[float]:
    """The raw loss's step-to-step noise over the sweep's first quarter (at least 4 steps; never from index ``cut``,
    where the rule cut the curve, on: an explosion is no noise), relative to its mean: the standard deviation that
    the second differences x[k+1] - 2 x[k] + x[k-1] imply (their variance is 6 x the noise's), so that a steady fall
    or rise there is not counted as noise; None with fewer than 4 finite losses."""
    end = max(4, len(losses) // 4) if cut is None else min(max(4, len(losses) // 4), cut)
    head = [float(x) for x in losses[:end] if x is not None and math.isfinite(x)]
    if len(head) < 4:
        return None
    second = [head[k + 1] - 2 * head[k] + head[k - 1] for k in range(1, len(head) - 1)]
    mean = sum(head) / len(head)
    return (sum(d * d for d in second) / len(second) / 6) ** 0.5 / abs(mean) if mean else None


def descended(fell: Optional[float], noise: Optional[float]) -> bool:
    """Whether a curve's fall (:func:`descent`) stands out of its early noise (:func:`early_noise`)."""
    return fell is not None and fell >= max(MIN_DESCENT, NOISE_MULTIPLE * (noise or 0.0))


def off_the_map(multiplier: Optional[float], cut: Optional[int], fell: Optional[float], noise: Optional[float],
                low: float, high: float, sweep_steps: int, divisor: float) -> list:
    """Why a range test's answer for an axis lies off its map (empty: it does not): ``range_edge_high`` /
    ``range_edge_low``, the suggestion within a sweep step of the largest / smallest the range allows;
    ``never_exploded``, the loss was never cut (the edge lies above the range, or the axis does not matter);
    ``never_descended``, the smoothed loss's fall (``fell``: :func:`descent`) does not stand out of the early noise
    (``noise``: :func:`early_noise`; :func:`descended`)."""
    if multiplier is None:
        return []
    edge = range_edge(multiplier, low, high, sweep_steps, divisor=divisor)
    return ([f"range_edge_{edge}"] if edge else []) + (["never_exploded"] if cut is None else []) + \
        ([] if descended(fell, noise) else ["never_descended"])


def suggest_multiplier(steps: Sequence[int], losses: Sequence[Optional[float]], low: float, high: float,
                       sweep_steps: int, beta: float = CLASSIC_SMOOTHING,
                       divisor: float = SUGGESTION_DIVISOR, read: str = "minimum") -> Optional[float]:
    """fastai's classic suggestion from a range test's logged losses (``steps[k]``: the number of steps
    trained when ``losses[k]`` was logged), read by :func:`read_curve` with the smoothing ``beta`` (default:
    fastai's): the multiplier of the max LR at the point ``read`` names (:data:`READS`; default: fastai's smoothed
    minimum), divided by ``divisor`` (default: fastai's :data:`SUGGESTION_DIVISOR`). A curve never cut is read as
    cut at its last logged step (its answer is flagged ``never_exploded``: :func:`off_the_map`). None without a
    finite logged loss."""
    best, cut = read_curve(losses[:len(steps)], beta)
    if best is None:
        return None
    # a record at step k follows k trained steps; the last of them (0-based k - 1) ran at the multiplier of k - 1
    minimum = sweep_multiplier(steps[best] - 1, low, high, sweep_steps)
    edge = sweep_multiplier(steps[len(steps) - 1 if cut is None else cut] - 1, low, high, sweep_steps)
    return read_point(minimum, edge, read) / divisor


def read_point(minimum: float, edge: float, read: str) -> float:
    """The multiplier that ``read`` (:data:`READS`) names on a curve whose smoothed minimum lies at ``minimum`` and
    whose cut (or, never cut, its end) at ``edge``: the one the divisor divides."""
    if read not in READS:
        raise ValueError(f"read={read!r}: choose one of {', '.join(READS)}")
    return minimum if read == "minimum" else math.sqrt(minimum * edge)


def range_edge(multiplier: float, low: float, high: float, sweep_steps: int, within_steps: int = 1,
               divisor: float = SUGGESTION_DIVISOR) -> Optional[str]:
    """"high" when the suggestion (made with ``divisor``) lies within ``within_steps`` sweep steps of the largest
    the range allows (the loss still fell, or barely stopped falling, at the sweep's end: the rate may lie
    higher), "low" when it lies as near the smallest (the loss rose from the first steps), else None."""
    step_ratio = (high / low) ** (within_steps / (sweep_steps - 1))
    top, bottom = high / divisor, low / divisor
    if multiplier >= top / step_ratio * (1 - 1e-9):
        return "high"
    if multiplier <= bottom * step_ratio * (1 + 1e-9):
        return "low"
    return None


def curve_record(steps: Sequence[int], losses: Sequence[Optional[float]], low: float, high: float, sweep_steps: int,
                 beta: float = CLASSIC_SMOOTHING, divisor: float = SUGGESTION_DIVISOR, read: str = "minimum") -> dict:
    """A range test's curve as a person reads it (``lr_find.json``'s per sweep; the range test on the replicas
    records the same fields per axis): the multiplier each logged loss was trained at (``steps[k]``: the steps
    trained when ``losses[k]`` was logged), the raw and smoothed loss, the smoothed minimum's multiplier, where the
    rule cut the curve, the point it read (``read``), the divisor, the suggestion and why it lies off the map."""
    best, cut = read_curve(losses, beta)
    multiplier = suggest_multiplier(steps, losses, low, high, sweep_steps, beta, divisor, read)
    fell = descent(losses, beta)
    at = [sweep_multiplier(k - 1, low, high, sweep_steps) for k in steps]
    return {"multipliers": at, "loss": [x if x is not None and math.isfinite(x) else None for x in losses],
            "smoothed": [x if math.isfinite(x) else None for x in smoothed_curve(losses, beta)],
            "minimum_at": None if best is None else at[best], "cut_at": None if cut is None else at[cut],
            "read": read, "divisor": divisor, "multiplier": multiplier, "descent": fell,
            "off_map": off_the_map(multiplier, cut, fell, early_noise(losses, cut), low, high, sweep_steps, divisor)}
