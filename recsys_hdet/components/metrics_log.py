"""The training job's records: the metrics log (``RunDir.METRICS``) and its console lines, the summary's LR
trajectory, peak memory. The metrics themselves live in :mod:`recsys_hdet.evaluation.task_metrics`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Dict, IO, Mapping, Sequence

from data_tools.fileio import write_text_atomic


class MetricLogger:
    """Writes ``RunDir.METRICS`` (one object per logging interval) and a console line.

    Only rank 0 constructs one. The console line: step/total, examples/s, loss and NE per task, ETA.
    """

    def __init__(self, path: str, total_steps: int, stream: IO[str] = sys.stdout, start_step: int = 0) -> None:
        self.path = path
        self.total_steps = total_steps
        self.stream = stream
        self.start_step = start_step  # a resumed run appends after the records up to its checkpoint's step
        self._file = open(path, "a" if start_step else "w")
        self._start = time.monotonic()

    def log(self, record: Mapping[str, object]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = int(record["step"])  # type: ignore[arg-type]
        elapsed = time.monotonic() - self._start
        eta = elapsed / max(step - self.start_step, 1) * (self.total_steps - step)
        losses = record["loss"]  # type: ignore[index]
        parts = " ".join(f"{k}={v:.4f}" for k, v in losses.items())  # type: ignore[union-attr]
        ne = record.get("ne") or {}
        ne_parts = ("  NE " + " ".join(f"{k}={v:.4f}" for k, v in ne.items())) if ne else ""  # type: ignore[union-attr]
        self.stream.write(
            f"step {step:>6}/{self.total_steps}  {record['examples_per_sec']:>8.0f} ex/s  "
            f"loss {parts}{ne_parts}  eta {eta:5.0f}s\n"
        )
        self.stream.flush()

    def close(self) -> None:
        self._file.close()


def truncate_jsonl(path: str, last_step: int) -> int:
    """Drops the records of ``path`` after ``last_step`` (what a crashed attempt wrote after the
    checkpoint a resumed run continues from), atomically; returns how many were dropped."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    def step_of(line: str) -> float:
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            return math.inf  # a line the crash cut off
    kept = [line for line in lines if step_of(line) <= last_step]
    write_text_atomic(path, "".join(kept))
    return len(lines) - len(kept)


def peak_rss_mb() -> float:
    import resource

    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def lr_trajectory(metrics: Sequence[Mapping[str, Any]], max_lr: Mapping[str, float]) -> Dict[str, Any]:
    """``RunDir.SUMMARY``'s ``lr``: each group's configured max LR, its LR at every logged step (``metrics``: the
    run's ``RunDir.METRICS`` records, complete after a resume too) and the last one: what a later job needs of
    this run's learning rates."""
    records = [r for r in metrics if r.get("lr")]
    groups = list(records[-1]["lr"]) if records else []
    return {"max_lr": dict(max_lr),
            "final": dict(records[-1]["lr"]) if records else {},
            "trajectory": {"step": [r["step"] for r in records], **{g: [r["lr"][g] for r in records] for g in groups}}}


def print_summary(s: Mapping[str, Any]) -> None:
    """The run's closing console lines, from its ``RunDir.SUMMARY``."""
    print(f"{s['experiment']}: {s['status']} after {s['steps']} steps, {s['examples']} examples, "
          f"{s['examples_per_sec']:.0f} ex/s, {s['wall_seconds']:.1f} s wall", flush=True)
    print("train loss: " + " ".join(f"{k}={v:.4f}" for k, v in s["train_loss"].items()))
    for task, m in s.get("eval", {}).items():
        o = s.get("oracle", {}).get(task)
        extra = f"  oracle NE {o['ne']:.4f} (gap {m['ne'] - o['ne']:+.4f})" if o else ""
        print(f"held-out {task:>12}: AUC {m['auc']:.4f}  NE {m['ne']:.4f}  logloss {m['logloss']:.4f}  "
              f"calibration {m['calibration']:.3f}{extra}", flush=True)
