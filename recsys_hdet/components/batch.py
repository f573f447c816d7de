"""The batch the loader yields and the train pipeline moves: dense inputs, a KeyedJaggedTensor of the sparse
features, labels, a padding mask and evaluation-only extras (:class:`Batch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

import torch
from torchrec import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class Batch(Pipelineable):
    """One rank's rows. A TorchRec ``Pipelineable``: the train pipeline moves it to the model's
    device (``to``, on its copy stream on CUDA, from pinned memory) and marks the streams that use it."""

    dense: torch.Tensor  # [B, num_dense] float32
    sparse: KeyedJaggedTensor  # keys = sparse feature names, B rows each
    labels: torch.Tensor  # [B, num_tasks] float32
    mask: torch.Tensor  # [B] bool, False on padding rows (evaluation only)
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)  # oracle/raw ids, eval only

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.sparse.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking),
                     self.mask.to(device, non_blocking=non_blocking),
                     {k: v.to(device, non_blocking=non_blocking) for k, v in self.extras.items()})

    def record_stream(self, stream: torch.Stream) -> None:
        for t in (self.dense, self.labels, self.mask, *self.extras.values()):
            t.record_stream(stream)
        self.sparse.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(),
                     self.mask.pin_memory(), {k: v.pin_memory() for k, v in self.extras.items()})
