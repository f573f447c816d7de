"""The training step, driven by one of TorchRec's train pipelines (``trainer.train_pipeline``).

- ``sparse_dist`` (default): ``TrainPipelineSparseDist``. It copies each batch to the model's
  device (a :class:`~recsys_hdet.components.dataloader.Batch` is TorchRec ``Pipelineable``: on
  CUDA from pinned memory, on a side stream) and starts the sharded embedding's input all-to-all
  for the next batch while the current one runs forward and backward. It reads two batches ahead
  of the one it trains on. On CPU it runs without streams.
- ``base``: ``TrainPipelineBase``: the copy to the device only, no overlap (one batch ahead).

Either calls ``model(batch) -> (loss, output)``
(:class:`~recsys_hdet.models.ranker.TrainingRanker`), then backward and ``optimizer.step()``;
the order of the arithmetic is the plain loop's (zero_grad, forward, backward, step), so the
pipelines train the same numbers and reading ahead changes only when batches are read. What the
job must know of the read-ahead: a checkpoint records the position after the batches trained on
(:class:`~recsys_hdet.components.dataloader.TrainedPosition`), and any other forward pass of the
model (HDET's probe, the held-out evaluation) runs on :meth:`TrainStep.model_detached`: the
pipeline replaces the sharded modules' forward with one that reads the input distribution it
started, and puts it back after.

Limits: DMPCollection's own embedding sync is off (the job averages the embedding replicas itself:
``trainer.embedding_sync_every`` or HDET's converge).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

TRAIN_PIPELINES = ("sparse_dist", "base")


class TrainStep:
    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device, kind: str = "sparse_dist") -> None:
        from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

        if kind not in TRAIN_PIPELINES:
            raise ValueError(f"trainer.train_pipeline={kind!r}: choose one of {list(TRAIN_PIPELINES)}")
        self.kind = kind
        self.model = model
        self.device = device
        if kind == "sparse_dist":
            self.pipeline = TrainPipelineSparseDist(model, optimizer, device, execute_all_batches=True,
                                                    dmp_collection_sync_interval_batches=None)
        else:
            self.pipeline = TrainPipelineBase(model, optimizer, device)

    def progress(self, batches: Iterator[Any]) -> Any:
        """One step on the next batch; the model's output. Raises StopIteration after the last."""
        return self.pipeline.progress(batches)

    def train_outside(self, batch: Any, optimizer: Any) -> torch.Tensor:
        """One training step (forward, backward, ``optimizer.step``) on ``batch``, outside the
        pipeline's queue (HDET's cooldown before a probe, its range test): on the detached model, the
        batch moved to the pipeline's device here. Returns the step's loss (detached, not read on the host)."""
        with self.model_detached() as model:
            optimizer.zero_grad()
            loss, _ = model(batch.to(self.device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return loss.detach()

    @contextmanager
    def model_detached(self) -> Iterator[torch.nn.Module]:
        """The model with its own forward, for a forward pass outside the training step; the pipeline
        takes it back after (the batches it has read ahead keep their started input distribution)."""
        if self.kind != "sparse_dist":
            yield self.model
            return
        model = self.pipeline.detach()
        try:
            yield model
        finally:
            self.pipeline.attach(model, sparse_dist=False)


class TimedBatches:
    """An iterator of batches that counts the seconds the training thread spends waiting for the
    next one (``seconds``): the pipeline's ``next()`` on it is where a step waits for data."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = batches
        self.seconds = 0.0

    def __iter__(self) -> "TimedBatches":
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.batches)
        finally:
            self.seconds += time.perf_counter() - start
