"""The end of one logging interval: its ``RunDir.METRICS`` record and its divergence check, from one all-reduce.

The training loop ends an interval every ``trainer.log_every`` steps, at the pass's last step, at
``trainer.stop_at_step`` and whenever the LR control fails the check itself (``forced``); every rank calls
:meth:`IntervalCheck.end` there (it is a collective). Design:

- One small float64 all-reduce carries everything the record and the check read: the interval's per-task
  loss sums, its non-finite steps and rank-steps (:class:`~recsys_hdet.components.train_state.LoopState`'s
  window), rank 0's training NE per task (the other ranks add zeros) and every rank's positive labels per
  task and rows (:meth:`~recsys_hdet.components.train_metrics.TrainMetrics.interval_positives`). Every rank
  thus holds the same numbers and takes the same decision (roll back, stop as diverged, go on) with no
  broadcast of the verdict.
- The torchrec training metrics (NE, calibration, AUC) are computed only when due: at every interval when
  ``trainer.metrics_every`` is unset, else every ``metrics_every`` steps, at the pass's last step, at
  ``stop_at_step`` and at a forced check. Between two computations the record carries the loss alone and the
  collapse check reads the interval's mean loss over the entropy of its positive rate
  (:func:`~recsys_hdet.components.train_metrics.entropy_ne`, not recorded).
- The interval's loss is the mean over its finite rank-steps; with none it is NaN (0/0), never a loss of 0.
  Where the LR control tolerates a non-finite replica (it is excluded and restored at its next sync) the
  interval counts as non-finite only when no replica produced a finite loss in it.
- The rules of the check are :func:`~recsys_hdet.components.divergence.interval_failure`'s; a forced reason
  wins and skips them (the collapse check's arming is then left as it was).

This module owns the interval's end, not its two consumers: the rules stay pure in ``divergence.py`` and
the metrics in ``train_metrics.py``; here is the one collective that feeds both, and the record's shape.

Limits: the record's ``examples_per_sec`` is this rank's window steps times the global batch over the
interval's seconds (the caller's clock, checkpoint stalls left out); the loop's window is reset here, and the
interval's sums are returned for ``LoopState.end_interval``, which the caller applies once it knows whether
the interval was rolled back.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from recsys_hdet.components.divergence import interval_failure
from recsys_hdet.components.train_metrics import TrainMetrics, entropy_ne, weighted_task_mean
from recsys_hdet.components.train_state import LoopState


class IntervalCheck:
    """Ends the logging intervals of one pass. ``trainer``: the config's ``trainer`` group (``metrics_every``,
    ``stop_at_step`` and the check's thresholds); ``examples_per_step``: the global batch."""

    def __init__(self, tasks: List[str], task_weights: torch.Tensor, rank: int, trainer: Any, total_steps: int,
                 examples_per_step: int, train_metrics: TrainMetrics) -> None:
        self.tasks = list(tasks)
        self.task_weights = task_weights
        self.rank = rank
        self.trainer = trainer
        self.total_steps = total_steps
        self.examples_per_step = examples_per_step
        self.train_metrics = train_metrics

    def end(self, loop: LoopState, seconds: float, forced: str, lrs: Dict[str, float],
            tolerates_non_finite: bool) -> Tuple[str, Dict[str, Any], torch.Tensor]:
        """The interval that ends at ``loop.step`` (``seconds`` long; ``forced``: the LR control's reason to fail
        the check; ``lrs``: each group's LR as logged). Returns (why the interval diverged or '', the
        RunDir.METRICS record: rank 0 writes it, the interval's all-reduced sums for LoopState.end_interval)."""
        examples_per_step, num_tasks = self.examples_per_step, len(self.tasks)
        every: Optional[int] = self.trainer.metrics_every
        due = every is None or loop.step % int(every) == 0 or bool(forced) \
            or loop.step in (self.total_steps, self.trainer.stop_at_step)
        # ne, calibration, auc: {task: value} on rank 0 (a collective: every rank takes the same decision); between
        # two computations the records carry the loss alone and the rows wait for the next one
        train_metrics = self.train_metrics.compute() if due else {}
        # Rank 0's training NE rides on the all-reduce (the other ranks add zeros): every rank checks the same NE;
        # so do the interval's positive labels and rows, for the NE the check reads between two computations.
        ne = [float((train_metrics.get("ne") or {}).get(t, math.nan)) if self.rank == 0 else 0.0 for t in self.tasks]
        stats = torch.cat([loop.window, torch.tensor([float(loop.window_steps), *ne], dtype=torch.float64),
                           self.train_metrics.interval_positives()])
        dist.all_reduce(stats)
        good_steps = stats[num_tasks + 1] - stats[num_tasks]
        mean = stats[:num_tasks] / good_steps  # no finite step in the interval: NaN (0/0), never a loss of 0
        avg = weighted_task_mean(mean, self.task_weights)
        metrics_record = {
            "step": loop.step,
            "examples": loop.step * examples_per_step,
            "loss": {**{t: float(mean[i]) for i, t in enumerate(self.tasks)}, "avg": avg},
            "lr": lrs,
            **train_metrics,
            "examples_per_sec": loop.window_steps * examples_per_step / max(seconds, 1e-9),
        }
        loop.window.zero_()
        loop.window_steps = 0
        non_finite = (good_steps == 0) if tolerates_non_finite else (stats[num_tasks] > 0)
        if due:
            ne_all = {t: float(stats[num_tasks + 2 + i]) for i, t in enumerate(self.tasks)}
        else:  # the interval's loss over the entropy of its positive rate (the collapse check's NE, not recorded)
            positives, rows = stats[2 * num_tasks + 2:3 * num_tasks + 2], float(stats[-1])
            ne_all = {t: entropy_ne(float(mean[i]), float(positives[i]), rows) for i, t in enumerate(self.tasks)}
        return forced or interval_failure(avg, bool(non_finite), ne_all, self.trainer, loop), metrics_record, stats
