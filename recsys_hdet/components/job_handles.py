"""What a training job has built, handed as one typed object to the parts that act on the job from
outside the training loop: an LR control (HDET's signals score the reserved rows, train a cooldown
step, average the replicas and write explored hyperparameters through these handles).

Built by the trainer after the model, the optimizers, the data stream and the train step, and before
the LR control, so that nothing in it refers to something built later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List

import torch

from recsys_hdet.components.hparam_bindings import LossSettings
from recsys_hdet.components.optimizer import GroupedOptimizer
from recsys_hdet.components.replicas import ReplicaAverager


@dataclass(frozen=True)
class JobHandles:
    model: torch.nn.Module          # the sharded model (DistributedModelParallel)
    optimizer: GroupedOptimizer     # the named parameter groups: dense optimizer and fused embedding optimizer
    averager: ReplicaAverager       # the replicas' tensors and their process groups
    stream: Any                     # the data stream (components.dataloader.ParquetBatchStream): the reserved rows
    layout: Any                     # this rank's place in the 2-D layout (distributed.ParallelLayout)
    process_group: Any              # the world's process group
    sharding_group: Any             # the process group of this rank's replica (its sharding group)
    dense_gradients: Any            # distributed.DenseGradientReduction: over which ranks dense gradients are averaged
    task_weights: torch.Tensor      # the loss's per-task weights
    loss_settings: LossSettings     # the loss's knobs the training step reads
    run_dir: str
    log: Callable[[str], None]
    #: this replica's per-task mean loss on some batches as it serves (eval mode), outside the training step
    served_loss: Callable[[List[Any]], torch.Tensor]
    #: one training step on a batch outside the train pipeline (forward, backward, the optimizers' step); its loss
    train_outside: Callable[[Any], torch.Tensor]
