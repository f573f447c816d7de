"""The divergence check at the end of every logging interval: why the interval failed, or ''.

A failed check is rolled back while rollbacks are left (:mod:`recsys_hdet.components.rollback`), else
the run ends as diverged. It fails on

- a non-finite loss (under HDET: only when no replica's loss was finite, the others are restored);
- an average task loss above ``trainer.diverge_loss``;
- a collapse to the base-rate predictor: every task's training NE over the interval at or above
  ``trainer.collapse.ne`` once an earlier interval's mean NE was below ``trainer.collapse.armed_below``.
  A model whose logits stopped depending on its inputs predicts the base rate (NE 1) with a finite,
  ordinary-looking loss: without this check such a run "completes" as a useless model. A fresh model
  starts above NE 1 while it learns the base rate, which is no collapse: hence the arming.

Every rank takes the same decision: the inputs are all-reduced (:mod:`recsys_hdet.components.interval_check`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping


def interval_failure(avg_loss: float, non_finite: bool, ne: Mapping[str, float], trainer: Any, loop: Any) -> str:
    """Why the interval failed ('' when it passed). ``ne``: each task's training NE over the interval;
    ``trainer``: the config's ``trainer`` group; ``loop``: the loop's state, whose ``learned`` flag arms the
    collapse check (set here, checkpointed with the loop)."""
    if non_finite or not math.isfinite(avg_loss):
        return "a non-finite loss"
    diverge_loss = float(trainer.diverge_loss)
    if avg_loss > diverge_loss:
        return f"average loss {avg_loss:.3g} above trainer.diverge_loss={diverge_loss}"
    spec = trainer.collapse
    if spec.ne is None or not ne:
        return ""
    if loop.learned and all(v >= float(spec.ne) for v in ne.values()):
        each = ", ".join(f"{t} {v:.4f}" for t, v in ne.items())
        return f"collapsed to the base-rate predictor (training NE {each} >= trainer.collapse.ne={spec.ne})"
    if sum(ne.values()) / len(ne) < float(spec.armed_below):
        loop.learned = True
    return ""
