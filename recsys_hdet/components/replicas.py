"""Averaging replicated state across replicas, in place, with one collective per dtype.

Two kinds of replicated state in the 2-D layout (see ``recsys_hdet.distributed``):
- embedding shards and their fused-optimizer state: one copy per sharding group, averaged over
  the rank's replica process group. Found as TorchRec's DMPCollection finds them: every fbgemm
  TBE kernel's ``split_embedding_weights()`` and ``get_optimizer_state()`` tensors, which are
  views of the kernel's own storage, so writing into them updates what the kernel trains.
- dense parameters and buffers: one copy per rank, averaged over the world. (Plain DDP keeps them
  identical already; HDET's per-replica learning rates make them drift between syncs.)

State that exists once (a model-parallel shard with no replica, i.e. one sharding group) is left
alone: :meth:`ReplicaAverager.average_embeddings` is a no-op then.

Collectives: tensors are flattened into one buffer per dtype and all-reduced once (SUM, then
divided: gloo has no AVG), i.e. coalesced, never one call per tensor. Works on gloo and nccl.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
from torch import nn


def tbe_kernels(model: nn.Module) -> List[nn.Module]:
    """The fbgemm kernels under ``model``. Sharded TorchRec modules keep their lookups in a plain
    list (``_lookups``), outside ``nn.Module.modules()``, so the walk follows it as DMPCollection does."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    found: Dict[int, nn.Module] = {}

    def walk(module: nn.Module) -> None:
        if isinstance(module, SplitTableBatchedEmbeddingBagsCodegen):
            found.setdefault(id(module), module)
        for lookup in getattr(module, "_lookups", None) or []:
            walk(lookup)
        for child in module.children():
            walk(child)

    walk(model)
    return list(found.values())


def embedding_weight_tensors(model: nn.Module) -> List[torch.Tensor]:
    """Every local embedding shard (views of the kernels' weights)."""
    return [w for kernel in tbe_kernels(model) for w in kernel.split_embedding_weights() if w.numel()]


def embedding_state_tensors(model: nn.Module) -> List[torch.Tensor]:
    """Every local embedding shard and every tensor of its fused-optimizer state."""
    tensors: List[torch.Tensor] = embedding_weight_tensors(model)
    for kernel in tbe_kernels(model):
        for state in kernel.get_optimizer_state():
            tensors += [t for t in state.values() if isinstance(t, torch.Tensor) and t.numel()]
    return tensors


def dense_state_tensors(model: nn.Module) -> List[torch.Tensor]:
    """Parameters and floating-point buffers outside the embedding kernels (replicated on every rank).

    A sharded EBC also exposes each table it owns as a parameter: a view of the kernel's storage.
    Those are excluded by storage, since they are per-shard state, not replicated state.
    """
    kernel_storages = set()
    for kernel in tbe_kernels(model):
        for t in [*kernel.split_embedding_weights(), *kernel.parameters(), *kernel.buffers()]:
            kernel_storages.add(t.untyped_storage().data_ptr())

    def replicated(t: torch.Tensor) -> bool:
        return t.numel() > 0 and t.untyped_storage().data_ptr() not in kernel_storages

    tensors = [p.data for p in model.parameters() if replicated(p)]
    tensors += [b for b in model.buffers() if b.is_floating_point() and replicated(b)]
    return tensors


@torch.no_grad()
def average_(tensors: List[torch.Tensor], group: dist.ProcessGroup, include: bool = True) -> None:
    """Replaces every tensor by its mean over the members of ``group`` that pass ``include=True``.

    One all-reduce per dtype (the include count rides in the same buffer). An excluded member
    contributes zeros (not its values: NaN * 0 is NaN) and receives the others' mean: restored.
    """
    if dist.get_world_size(group) == 1 or not tensors:
        if not include:
            raise FloatingPointError("the only replica is excluded: nothing to restore it from")
        return
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        by_dtype[t.dtype].append(t)
    for dtype, same_dtype in by_dtype.items():
        # One buffer per dtype: the tensors copied in once (with the include count at the end),
        # all-reduced, then divided straight back into the tensors: two passes over the bytes.
        numel = sum(t.numel() for t in same_dtype)
        buffer = torch.empty(numel + 1, dtype=dtype, device=same_dtype[0].device)
        if include:
            torch.cat([t.reshape(-1) for t in same_dtype], out=buffer[:numel])
        else:  # contributes zeros (not its values: NaN * 0 is NaN) and receives the others' mean
            buffer[:numel].zero_()
        buffer[numel] = 1.0 if include else 0.0
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
        included = buffer[numel].item()
        if included == 0:
            raise FloatingPointError("every replica in the group is excluded: nothing to restore from")
        offset = 0
        for t in same_dtype:
            torch.div(buffer[offset:offset + t.numel()].view_as(t), included, out=t)
            offset += t.numel()


def digest(tensors: List[torch.Tensor]) -> str:
    """A hash of the tensors' bytes: equal on two ranks exactly when their copies are bit-identical."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def all_finite(tensors: List[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


class ReplicaAverager:
    """Holds the lists of replicated tensors once; averages them on request."""

    def __init__(self, model: nn.Module, replica_group: dist.ProcessGroup, world_group: dist.ProcessGroup) -> None:
        self.replica_group = replica_group
        self.world_group = world_group
        self.embedding_weights = embedding_weight_tensors(model)
        self.embedding_tensors = embedding_state_tensors(model)
        self.dense_tensors = dense_state_tensors(model)

    @property
    def has_embedding_replicas(self) -> bool:
        return dist.get_world_size(self.replica_group) > 1

    def average_embeddings(self, include: bool = True) -> None:
        average_(self.embedding_tensors, self.replica_group, include)

    def average_dense(self, include: bool = True) -> None:
        average_(self.dense_tensors, self.world_group, include)

    def differing_state(self) -> List[str]:
        """Which replicated state is not bit-identical across its replicas: ``"dense"`` (compared over
        the world) and/or ``"embedding"`` (over each replica group). Empty when every replica holds
        the same model, as it must after a final average: DCP saves one copy of replicated state, so
        a difference would silently drop the other copies. The same answer on every rank."""
        kinds = (("dense", self.dense_tensors, self.world_group),
                 ("embedding", self.embedding_tensors, self.replica_group))
        differs = torch.zeros(len(kinds))
        for i, (_, tensors, group) in enumerate(kinds):
            if dist.get_world_size(group) > 1:
                digests: List[str] = [""] * dist.get_world_size(group)
                dist.all_gather_object(digests, digest(tensors), group=group)
                differs[i] = float(len(set(digests)) > 1)
        dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=self.world_group)
        return [kind for (kind, _, _), d in zip(kinds, differs.tolist()) if d]

    def local_state_is_finite(self) -> bool:
        """Whether this rank's *replicated* state is finite: what an average can restore. Single-copy
        embedding shards (one sharding group) have no replica to restore them from, so they do not count."""
        embeddings = self.embedding_tensors if self.has_embedding_replicas else []
        return all_finite(self.dense_tensors) and all_finite(embeddings)


@torch.no_grad()
class PeriodicEmbeddingAveraging:
    """The step hook that averages the embedding replicas (one per sharding group) every ``every()`` steps
    and after the pass's last step, as TorchRec's ``DMPCollection.sync()`` does: the loop calls
    :meth:`after_step` after every step. ``every()`` is asked at each step (the LR control's
    ``embedding_sync_every``): 0 is never (no embedding replicas, or the LR control averages them itself:
    HDET at its syncs while their LR is spread)."""

    def __init__(self, averager: ReplicaAverager, every: Callable[[], int], total_steps: int) -> None:
        self.averager, self.every, self.total_steps = averager, every, int(total_steps)

    def after_step(self, step: int) -> None:
        """After training step ``step`` (1-based: the number of steps trained)."""
        every = int(self.every())
        if every and (step % every == 0 or step == self.total_steps):
            self.averager.average_embeddings()


def mixed_replica_loss(averager: ReplicaAverager, score: Callable[[], float], dense_mix: float,
                       embedding_mix: float) -> float:
    """``score()`` of ``avg + c (own - avg)``: this replica's weights pulled toward the replicas' average
    (``c`` = ``dense_mix`` for the dense tensors, ``embedding_mix`` for the embedding weights), then
    this replica's own weights restored exactly (its optimizer state is never touched).

    Why: a replica trains on 1/N of the data, so its own weights carry N times the noise that the
    averaged model keeps, and scoring the replica itself (c = 1) charges a higher learning rate for
    noise that the average removes: a bias toward lower rates. To second order the loss at
    ``c = 1/N`` weighs progress against noise as a plain run at that learning rate would.
    A non-finite replica is left out of the average (it still scores, as inf). Collective: every
    rank calls it at the same point.
    """
    finite = averager.local_state_is_finite()
    parts = [(averager.dense_tensors, averager.world_group, dense_mix)]
    if averager.has_embedding_replicas and embedding_mix != 1.0:
        parts.append((averager.embedding_weights, averager.replica_group, embedding_mix))
    own = [[t.clone() for t in tensors] for tensors, _, _ in parts]
    try:
        for (tensors, group, c), mine in zip(parts, own):
            try:
                average_(tensors, group, include=finite)
            except FloatingPointError:  # every member non-finite: this part keeps its own weights
                finite = False
                continue
            for t, m in zip(tensors, mine):
                t.mul_(1.0 - c).add_(m, alpha=c)
        # Scored even when non-finite: a sharded forward is collective within the sharding group.
        loss = score()
    finally:
        for (tensors, _, _), mine in zip(parts, own):
            for t, m in zip(tensors, mine):
                t.copy_(m)
    return loss if finite else float("inf")
