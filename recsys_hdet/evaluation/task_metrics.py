"""Metrics of predicted probabilities against labels, per task: the one definition the trainer's
held-out evaluation, ``python -m recsys_hdet.evaluate`` and the retraining gate all use.

AUC and ECE (torchmetrics), log loss (PyTorch), normalized entropy (log loss over the entropy of
the positive rate) and calibration (mean prediction over the positive rate). Where the data
carries the generator's true probabilities, the oracle's log loss and NE on the same rows are
reported beside the model's: the floor no model can beat. Equal-count reliability curves.
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc, binary_calibration_error

_EPS = 1e-7


def binary_entropy(p: float) -> float:
    p = min(max(p, _EPS), 1 - _EPS)
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def task_metrics(probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """AUC and ECE (torchmetrics), log loss (PyTorch), NE, calibration, positive rate, count.

    NE = log loss / entropy of the positive rate; calibration = mean prediction / positive rate.
    Metrics that need both classes are NaN on a one-class slice. Used by the trainer's held-out
    evaluation and by ``recsys_hdet.evaluate`` (per task and per segment)."""
    if probs.numel() == 0:
        raise ValueError("no held-out examples to evaluate")
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("predictions contain NaN or inf")
    p = probs.double().clamp(_EPS, 1 - _EPS)  # for the log loss; AUC ranks the raw scores (no ties added)
    y = labels.double()
    positive_rate = float(y.mean())
    ll = float(F.binary_cross_entropy(p, y))
    has_both = 0.0 < positive_rate < 1.0
    return {
        "auc": float(binary_auroc(probs.double(), y.long())) if has_both else float("nan"),
        "ne": ll / binary_entropy(positive_rate) if has_both else float("nan"),
        "logloss": ll,
        "calibration": float(p.mean()) / positive_rate if positive_rate > 0 else float("nan"),
        "ece": float(binary_calibration_error(p, y.long(), n_bins=15, norm="l1")),
        "positive_rate": positive_rate,
        "count": int(labels.numel()),
    }


def oracle_metrics(oracle_probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """The generator's true probabilities scored like a model: log loss and NE (NaN on one class)."""
    y = labels.double()
    positive_rate = float(y.mean())
    ll = float(F.binary_cross_entropy(oracle_probs.double().clamp(_EPS, 1 - _EPS), y))
    return {"logloss": ll, "ne": ll / binary_entropy(positive_rate) if 0.0 < positive_rate < 1.0 else float("nan")}


def reliability_curve(probs: np.ndarray, labels: np.ndarray, bins: int = 20) -> Dict[str, List[float]]:
    """Equal-count bins of the prediction: mean prediction, observed positive rate, count per bin.
    Equal-count (not equal-width) because engagement probabilities crowd near zero."""
    order = np.argsort(probs, kind="stable")
    out: Dict[str, List[float]] = {"predicted": [], "observed": [], "count": []}
    for chunk in np.array_split(order, min(bins, len(order))):
        if len(chunk):
            out["predicted"].append(float(probs[chunk].mean()))
            out["observed"].append(float(labels[chunk].mean()))
            out["count"].append(int(len(chunk)))
    return out


def grouped_auc(probs: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> Dict[str, float]:
    """GAUC: the mean over groups (users) of each group's ROC AUC, weighted by the group's rows
    (impressions). A group whose rows are all one class has no AUC and is left out: ``groups`` and
    ``rows`` say how many groups and rows count. Ties share their average rank (as in scikit-learn).
    It measures ranking within a user's own impressions, what a feed ranker is for; the global AUC
    also credits telling active users from inactive ones."""
    import polars as pl

    df = pl.DataFrame({"g": groups, "p": np.asarray(probs, dtype=np.float64), "y": np.asarray(labels, dtype=np.float64)})
    per = (df.with_columns(pl.col("p").rank("average").over("g").alias("r"))
           .group_by("g").agg(n=pl.len(), pos=pl.col("y").sum(), rsum=(pl.col("r") * pl.col("y")).sum())
           .filter((pl.col("pos") > 0) & (pl.col("pos") < pl.col("n"))))
    if per.height == 0:
        return {"gauc": float("nan"), "groups": 0, "rows": 0}
    n, pos, rsum = (per[c].to_numpy().astype(np.float64) for c in ("n", "pos", "rsum"))
    auc = (rsum - pos * (pos + 1) / 2) / (pos * (n - pos))
    return {"gauc": float((auc * n).sum() / n.sum()), "groups": int(per.height), "rows": int(n.sum())}


def paired_ne_difference(labels: np.ndarray, probs: np.ndarray, reference: np.ndarray, z: float = 1.96) -> Dict[str, float]:
    """NE(probs) - NE(reference) on the same rows, with a paired interval over rows.

    On the same rows both NEs share their denominator (the entropy H of the rows' positive rate),
    so the difference is ``mean(d) / H`` with ``d`` each row's log-loss difference; its interval is
    ``(mean(d) +- z * sd(d) / sqrt(n)) / H`` (the normal approximation of the paired mean; 1.96: 95%).
    Limit: rows are treated as independent (a user's rows are not quite), so the interval is
    somewhat narrow when a few users carry many rows. Returns ``diff``, ``low``, ``high``, ``rows``."""
    y = np.asarray(labels, dtype=np.float64)
    clip = lambda p: np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    loss = lambda p: -(y * np.log(p) + (1 - y) * np.log(1 - p))
    d = loss(clip(probs)) - loss(clip(reference))
    n = len(d)
    h = binary_entropy(float(y.mean())) if n else float("nan")
    if n < 2 or not 0.0 < float(y.mean()) < 1.0:
        return {"diff": float("nan"), "low": float("nan"), "high": float("nan"), "rows": n}
    mean, half = float(d.mean()), z * float(d.std(ddof=1)) / math.sqrt(n)
    return {"diff": mean / h, "low": (mean - half) / h, "high": (mean + half) / h, "rows": n}
