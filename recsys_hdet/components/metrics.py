"""Evaluation metrics and the training-progress logger.

Metrics per task on held-out predictions: AUC (torchmetrics), log loss, normalized entropy
(log loss / entropy of the positive rate) and calibration (mean prediction / positive rate).
Where the data carries the generator's true probabilities, the oracle's log loss and NE on the
same rows are reported beside the model's: the floor no model can beat.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Dict, IO, Mapping, Optional, Sequence

import torch
from torchmetrics.functional.classification import binary_auroc

_EPS = 1e-7


def binary_entropy(p: float) -> float:
    p = min(max(p, _EPS), 1 - _EPS)
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def log_loss(probs: torch.Tensor, labels: torch.Tensor) -> float:
    p = probs.double().clamp(_EPS, 1 - _EPS)
    y = labels.double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def task_metrics(probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """AUC, NE, log loss, calibration, positive rate and count for one task."""
    if probs.numel() == 0:
        raise ValueError("no held-out examples to evaluate")
    positive_rate = float(labels.double().mean())
    ll = log_loss(probs, labels)
    has_both = 0.0 < positive_rate < 1.0
    return {
        "auc": float(binary_auroc(probs.float(), labels.long())) if has_both else float("nan"),
        "ne": ll / binary_entropy(positive_rate) if has_both else float("nan"),
        "logloss": ll,
        "calibration": float(probs.double().mean()) / positive_rate if positive_rate > 0 else float("nan"),
        "positive_rate": positive_rate,
        "count": int(labels.numel()),
    }


def oracle_metrics(oracle_probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    positive_rate = float(labels.double().mean())
    ll = log_loss(oracle_probs, labels)
    return {"logloss": ll, "ne": ll / binary_entropy(positive_rate)}


class MetricLogger:
    """Writes ``metrics.jsonl`` (one object per logging interval) and a console line.

    Only rank 0 constructs one. The console line: step/total, examples/s, loss per task, ETA.
    """

    def __init__(self, path: str, total_steps: int, stream: IO[str] = sys.stdout) -> None:
        self.path = path
        self.total_steps = total_steps
        self.stream = stream
        self._file = open(path, "w")
        self._start = time.monotonic()

    def log(self, record: Mapping[str, object]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = int(record["step"])  # type: ignore[arg-type]
        elapsed = time.monotonic() - self._start
        eta = elapsed / max(step, 1) * (self.total_steps - step)
        losses = record["loss"]  # type: ignore[index]
        parts = " ".join(f"{k}={v:.4f}" for k, v in losses.items())  # type: ignore[union-attr]
        self.stream.write(
            f"step {step:>6}/{self.total_steps}  {record['examples_per_sec']:>8.0f} ex/s  "
            f"loss {parts}  eta {eta:5.0f}s\n"
        )
        self.stream.flush()

    def close(self) -> None:
        self._file.close()


def write_json_atomic(path: str, obj: object) -> None:
    """Writes JSON so that readers never see a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


def peak_rss_mb() -> float:
    import resource

    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
