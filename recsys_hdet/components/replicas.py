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

from collections import defaultdict
from typing import Dict, List

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


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


def embedding_state_tensors(model: nn.Module) -> List[torch.Tensor]:
    """Every local embedding shard and every tensor of its fused-optimizer state."""
    tensors: List[torch.Tensor] = []
    for kernel in tbe_kernels(model):
        tensors += [w for w in kernel.split_embedding_weights() if w.numel()]
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
def average_(tensors: List[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Replaces every tensor by its mean over ``group``, one all-reduce per dtype."""
    size = dist.get_world_size(group)
    if size == 1 or not tensors:
        return
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        by_dtype[t.dtype].append(t)
    for same_dtype in by_dtype.values():
        flat = _flatten_dense_tensors(same_dtype)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(size)
        for t, averaged in zip(same_dtype, _unflatten_dense_tensors(flat, same_dtype)):
            t.copy_(averaged)


class ReplicaAverager:
    """Holds the lists of replicated tensors once; averages them on request."""

    def __init__(self, model: nn.Module, replica_group: dist.ProcessGroup, world_group: dist.ProcessGroup) -> None:
        self.replica_group = replica_group
        self.world_group = world_group
        self.embedding_tensors = embedding_state_tensors(model)
        self.dense_tensors = dense_state_tensors(model)

    @property
    def has_embedding_replicas(self) -> bool:
        return dist.get_world_size(self.replica_group) > 1

    def average_embeddings(self) -> None:
        average_(self.embedding_tensors, self.replica_group)

    def average_dense(self) -> None:
        average_(self.dense_tensors, self.world_group)
