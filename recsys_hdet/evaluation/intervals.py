"""95% intervals on a slice's AUC, NE and calibration, per task: normal approximations over rows, each on
the scale where its metric is closest to normal.

- **NE** (log loss over the entropy of the positive rate): the delta method, from each row's influence
  on the ratio (its log loss, and its label through the entropy); symmetric.
- **Calibration** (mean prediction over the positive rate): the delta method on the log scale, so the
  interval is positive and skewed the way a ratio over a few positives is (wider above than below).
- **AUC**: DeLong's variance (each positive's share of negatives scored below it, each negative's share
  of positives above, ties one half), on the logit scale so the interval stays inside (0, 1).

Why not a bootstrap: measured side by side on slices with known metrics, a seeded percentile bootstrap held
the true values no more often, even at 9 positives, and cost twice as much (the figures: docs/outputs.md,
"Intervals"; tests/test_report_intervals.py repeats the coverage check at 9 and 37 positives). These cost
O(rows log rows) per task and are exact functions of the rows, so no seed.

Limits: rows are treated as independent (a user's impressions are not quite), so intervals are somewhat
narrow where a few users carry many rows (the same limit as the paired NE difference). On a handful of
positives they are rough (read them as "wide", not as exact bounds); where every positive outscores every
negative (or none does) DeLong's variance is 0 and the AUC interval is the point. A metric undefined on
the slice (one class; calibration without a positive) has no interval (None).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

LEVEL = 0.95
METRICS = ("auc", "ne", "calibration")
_Z = 1.959964  # the normal quantile of a two-sided 95% interval
_EPS = 1e-7  # as task_metrics: predictions clamped to [eps, 1 - eps] for the log loss and the mean prediction

Interval = Optional[List[float]]


def method() -> Dict[str, object]:
    """eval.json's ``intervals``: how every interval in it was computed."""
    return {"level": LEVEL, "metrics": list(METRICS), "rows": "treated as independent",
            "ne": "delta method", "calibration": "delta method on the log scale",
            "auc": "DeLong's variance on the logit scale"}


def _var(x: np.ndarray) -> float:
    return float(x.var(ddof=1)) if len(x) > 1 else 0.0


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing their average rank."""
    order = np.argsort(x, kind="stable")
    s = x[order]
    new_group = np.r_[True, s[1:] != s[:-1]]
    first = np.flatnonzero(new_group)
    last = np.r_[first[1:], len(s)] - 1
    group = np.cumsum(new_group) - 1
    ranks = np.empty(len(x))
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def calibration_interval(labels: np.ndarray, probs: np.ndarray) -> Interval:
    """mean(p) / mean(y), its log's delta-method standard error from each row's influence
    ``(p - P) / P - (y - r) / r``; None without a positive."""
    rate = float(labels.mean())
    if rate <= 0:
        return None
    mean_p = float(probs.mean())
    se = float(np.sqrt(_var((probs - mean_p) / mean_p - (labels - rate) / rate) / len(labels)))
    return [mean_p / rate * float(np.exp(-_Z * se)), mean_p / rate * float(np.exp(_Z * se))]


def ne_interval(labels: np.ndarray, probs: np.ndarray) -> Interval:
    """L / H(r), its delta-method standard error from each row's influence
    ``(l - L) / H - L H'(r) / H^2 (y - r)`` with ``H'(r) = ln((1 - r) / r)``; None on one class."""
    rate = float(labels.mean())
    if not 0 < rate < 1:
        return None
    loss = -(labels * np.log(probs) + (1 - labels) * np.log(1 - probs))
    r = min(max(rate, _EPS), 1 - _EPS)
    mean_loss, entropy = float(loss.mean()), -(r * np.log(r) + (1 - r) * np.log(1 - r))
    influence = (loss - mean_loss) / entropy - mean_loss * np.log((1 - r) / r) / entropy ** 2 * (labels - rate)
    ne, half = mean_loss / entropy, _Z * float(np.sqrt(_var(influence) / len(labels)))
    return [float(ne - half), float(ne + half)]


def auc_interval(labels: np.ndarray, scores: np.ndarray) -> Interval:
    """The AUC with DeLong's variance ``var(V10) / m + var(V01) / k`` (V10: each positive's share of the k
    negatives scored below it; V01: each negative's share of the m positives above it; ties one half),
    on the logit scale; None on one class."""
    positive = labels > 0.5
    m = int(positive.sum())
    k = len(labels) - m
    if m == 0 or k == 0:
        return None
    ranks = _midranks(scores)
    v10 = (ranks[positive] - _midranks(scores[positive])) / k
    v01 = 1 - (ranks[~positive] - _midranks(scores[~positive])) / m
    auc, var = float(v10.mean()), _var(v10) / m + _var(v01) / k
    if not (0 < auc < 1 and var > 0):  # every pair ordered the same way: no spread to estimate
        return [auc, auc]
    logit, se = np.log(auc / (1 - auc)), np.sqrt(var) / (auc * (1 - auc))
    return [float(1 / (1 + np.exp(-(logit - _Z * se)))), float(1 / (1 + np.exp(-(logit + _Z * se))))]


def slice_intervals(labels: np.ndarray, probs: np.ndarray) -> List[Dict[str, Interval]]:
    """Per task (the columns of ``labels`` and ``probs``, each [rows, tasks]), the 95% interval of each
    metric: ``{"auc": [low, high] | None, "ne": ..., "calibration": ...}``."""
    y_all = np.asarray(labels, dtype=np.float64).reshape(len(labels), -1)
    raw_all = np.asarray(probs, dtype=np.float64).reshape(len(probs), -1)
    out = []
    for t in range(y_all.shape[1]):
        y, raw = y_all[:, t], raw_all[:, t]
        p = np.clip(raw, _EPS, 1 - _EPS)
        out.append({"auc": auc_interval(y, raw), "ne": ne_interval(y, p), "calibration": calibration_interval(y, p)})
    return out


def with_intervals(metrics: Dict[str, Dict[str, object]], labels: np.ndarray, probs: np.ndarray,
                   tasks: Sequence[str]) -> Dict[str, Dict[str, object]]:
    """``metrics`` (task -> task_metrics' dict) with each task's ``positives`` (the slice's positive
    count) and ``interval`` (:func:`slice_intervals`) added."""
    intervals = slice_intervals(labels, probs)
    y = np.asarray(labels).reshape(len(labels), -1)
    return {t: {**metrics[t], "positives": int(round(float(y[:, i].sum()))), "interval": intervals[i]}
            for i, t in enumerate(tasks)}
