"""Recommender metrics while training: torchrec.metrics' ``RecMetricModule``.

Per task, over each logging interval (a window of ``trainer.log_every`` steps' examples, all ranks'
rows), on the predictions the model trained on (train mode, before the step's update):

- ``ne``: normalized entropy (log loss over the entropy of the window's positive rate);
- ``calibration``: sum of predictions over sum of labels;
- ``auc``: the window's ROC AUC.

Each rank updates its own states every step; ``compute()`` (every ``log_every`` steps, on every rank:
it is a collective) reduces them over the process group. These are what a dashboard shows
(``metrics.jsonl``, TensorBoard, the console); the held-out evaluation (``summary.json``'s ``eval``)
is computed separately, on rows never trained on.

Limits: under HDET the replicas' predictions are pooled, so the figures are those of the ensemble
of replicas, not of the averaged model; a rolled-back interval stays in the window until it slides
out. torchrec 1.8's metrics need torchmetrics 1.0.x (its own pin): newer ones reject its reports.
"""

from __future__ import annotations

from typing import Dict, List

import torch

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
        window = max(1, int(window_steps)) * batch_size * world_size  # examples, all ranks
        config = MetricsConfig(
            rec_tasks=rec_tasks,
            rec_metrics={RecMetricEnum(m): RecMetricDef(rec_task_indices=list(range(len(rec_tasks))),
                                                        window_size=window) for m in METRICS},
            throughput_metric=None, state_metrics=[], rec_compute_mode=RecComputeMode.UNFUSED_TASKS_COMPUTATION,
            compute_interval_steps=1)
        self.module = generate_metric_module(RecMetricModule, config, batch_size=batch_size, world_size=world_size,
                                             my_rank=rank, state_metrics_mapping={}, device=device,
                                             process_group=process_group)
        self._weights = torch.ones(batch_size, device=device)

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        """One step's predicted probabilities and labels, [batch, tasks] in ``tasks`` order."""
        weights = self._weights if self._weights.shape[0] == labels.shape[0] else torch.ones(labels.shape[0],
                                                                                              device=labels.device)
        out = {}
        for i, t in enumerate(self.tasks):
            out[f"prediction_{t}"] = predictions[:, i]
            out[f"label_{t}"] = labels[:, i]
            out[f"weight_{t}"] = weights
        self.module.update(out)

    def compute(self) -> Dict[str, Dict[str, float]]:
        """The window's ``{metric: {task: value}}`` over every rank (a collective: call on all ranks)."""
        values = self.module.compute()
        out: Dict[str, Dict[str, float]] = {m: {} for m in METRICS}
        for key, value in values.items():  # e.g. "ne-like|window_ne"
            head, _, kind = key.partition("|")
            metric, _, task = head.partition("-")
            if metric in out and kind == f"window_{metric}":
                out[metric][task] = float(value)
        return out
