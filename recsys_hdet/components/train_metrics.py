"""Recommender metrics while training: torchrec.metrics' ``RecMetricModule``.

Per task, over each logging interval (the examples of every rank since the last record: at most
``trainer.log_every`` steps), on the predictions the model trained on (train mode, before the step's
update):

- ``ne``: normalized entropy (log loss over the entropy of the interval's positive rate);
- ``calibration``: sum of predictions over sum of labels;
- ``auc``: the interval's ROC AUC.

Each rank keeps the interval's predictions and labels (detached, on the device) and feeds them to
the module in one ``update`` at the interval's end, after a ``reset``. Updating the module every step
cost 6.6 ms a step on one CPU thread (512 rows, 4 tasks: per task and metric a dozen small ops and a
window buffer); one update and compute of a 100-step interval take about 90 ms, under 1 ms a step.
``compute()`` (every ``log_every`` steps and at forced checks, on every rank: it is a collective)
reduces the states over the process group, so the figures are exactly those of the interval's rows,
however long the interval. These are what a dashboard shows (``RunDir.METRICS``, TensorBoard, the console); the held-out evaluation (``RunDir.SUMMARY``'s ``eval``)
is computed separately, on rows never trained on.

Limits: under HDET the replicas' predictions are pooled, so the figures are those of the ensemble
of replicas, not of the averaged model; a rolled-back interval is recorded as trained (its record
carries the rollback). torchrec 1.8's metrics need torchmetrics 1.0.x (its own pin): newer ones reject its reports.
"""

from __future__ import annotations

import math
from typing import Dict, List

import torch


def entropy_ne(mean_loss: float, positives: float, rows: float) -> float:
    """Normalized entropy from an interval's mean log loss and its positive rate: the loss over the entropy of
    the base-rate predictor (the NE torchrec.metrics computes, up to its clamping of predictions); NaN without
    rows or with a rate of 0 or 1."""
    p = positives / rows if rows > 0 else math.nan
    if not 0 < p < 1:
        return math.nan
    return mean_loss / -(p * math.log(p) + (1 - p) * math.log(1 - p))


def weighted_task_mean(per_task: torch.Tensor, weights: torch.Tensor) -> float:
    """The task-weighted mean of per-task losses: the objective per unit weight."""
    w = weights.double()
    return float((per_task.double() * w).sum() / w.sum())

METRICS = ("ne", "calibration", "auc")


class TrainMetrics:
    def __init__(self, tasks: List[str], batch_size: int, world_size: int, rank: int, window_steps: int,
                 device: torch.device, process_group=None) -> None:
        from torchrec.metrics.metric_module import RecMetricModule, generate_metric_module
        from torchrec.metrics.metrics_config import (MetricsConfig, RecComputeMode, RecMetricDef, RecMetricEnum,
                                                     RecTaskInfo)

        self.tasks = list(tasks)
        self.device = device
        rec_tasks = [RecTaskInfo(name=t, label_name=f"label_{t}", prediction_name=f"prediction_{t}",
                                 weight_name=f"weight_{t}") for t in self.tasks]
        self.window = max(1, int(window_steps)) * batch_size  # this rank's rows in one interval at most
        config = MetricsConfig(
            rec_tasks=rec_tasks,
            rec_metrics={RecMetricEnum(m): RecMetricDef(rec_task_indices=list(range(len(rec_tasks))),
                                                        window_size=self.window * world_size) for m in METRICS},
            throughput_metric=None, state_metrics=[], rec_compute_mode=RecComputeMode.UNFUSED_TASKS_COMPUTATION,
            compute_interval_steps=1)
        self.module = generate_metric_module(RecMetricModule, config, batch_size=batch_size, world_size=world_size,
                                             my_rank=rank, state_metrics_mapping={}, device=device,
                                             process_group=process_group)
        self._predictions: List[torch.Tensor] = []
        self._labels: List[torch.Tensor] = []
        # positive labels per task, then the rows, on the labels' device (no host copy per step)
        self._positives = torch.zeros(len(self.tasks) + 1, dtype=torch.float64, device=device)
        if world_size == 1:
            # Nothing to reduce over. torchmetrics would still all-gather every state (the AUC's whole
            # window) through the process group, and gloo copies it on its own thread: a copy that
            # size starts an OpenMP team there, and with more OpenMP threads than cores every
            # parallel region of the training thread pays a sleep and wake (components/openmp.py;
            # one worker with 2 threads, trainer.log_every=100: 14,388 ex/s with the gather, 27,808 without).
            from torchmetrics import Metric

            for m in self.module.modules():
                if isinstance(m, Metric):
                    m.sync_on_compute = m._to_sync = False  # _to_sync: what compute() reads

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        """One step's predicted probabilities and labels, [batch, tasks] in ``tasks`` order (kept until
        ``compute``)."""
        self._predictions.append(predictions.detach())
        self._labels.append(labels.detach())
        self._positives[:-1] += labels.detach().double().sum(0)
        self._positives[-1] += labels.shape[0]

    def interval_positives(self) -> torch.Tensor:
        """This rank's positive labels per task and rows (the last entry) since the previous call, float64 on the
        CPU: with the interval's mean loss, the training NE the divergence check reads between two
        :meth:`compute` (:func:`entropy_ne`); restarts the count."""
        out, self._positives = self._positives.cpu(), torch.zeros_like(self._positives)
        return out

    def compute(self) -> Dict[str, Dict[str, float]]:
        """The interval's ``{metric: {task: value}}`` over every rank (a collective: call on all ranks)."""
        predictions, labels = torch.cat(self._predictions), torch.cat(self._labels)
        self._predictions, self._labels = [], []
        if predictions.shape[0] > self.window:
            raise ValueError(f"{predictions.shape[0]} rows since the last compute exceed the metrics' window of "
                             f"{self.window} (trainer.log_every steps)")
        self.module.reset()
        self.module.update({**{f"prediction_{t}": predictions[:, i] for i, t in enumerate(self.tasks)},
                            **{f"label_{t}": labels[:, i] for i, t in enumerate(self.tasks)},
                            **{f"weight_{t}": torch.ones_like(labels[:, 0]) for t in self.tasks}})
        values = self.module.compute()
        out: Dict[str, Dict[str, float]] = {m: {} for m in METRICS}
        for key, value in values.items():  # e.g. "ne-like|window_ne"
            head, _, kind = key.partition("|")
            metric, _, task = head.partition("-")
            if metric in out and kind == f"window_{metric}":
                out[metric][task] = float(value)
        return out
