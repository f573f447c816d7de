"""Averaging replicated state across replicas: real 4-process gloo runs."""
import pytest
import torch
import torch.distributed as dist

from dist_helpers import random_batch, spawn, tiny_sharded_model, train_steps


def _gather(t, group):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


def _average_worker(sharding_group_size):
    from recsys_hdet.components.replicas import ReplicaAverager
    from recsys_hdet.distributed import init_process_groups

    pgs = init_process_groups(sharding_group_size)
    model, opt = tiny_sharded_model(pgs)
    # Each rank trains on its own data: embedding replicas (one per sharding group) drift apart.
    train_steps(model, opt, seed=dist.get_rank(), steps=3)
    averager = ReplicaAverager(model, pgs.replica, pgs.world)
    assert averager.embedding_tensors, "the fused kernels' weights and optimizer state are found"
    before = [t.clone() for t in averager.embedding_tensors]
    before_gathered = [_gather(t, pgs.replica) for t in before]
    averager.average_embeddings()
    after = averager.embedding_tensors
    if pgs.layout.replicas == 1:
        # Single-copy shards: nothing to average, nothing touched.
        assert all(torch.equal(a, b) for a, b in zip(after, before))
    else:
        assert any(not torch.equal(g[0], g[1]) for g in before_gathered), "replicas had diverged"
        for t, gathered_before in zip(after, before_gathered):
            copies = _gather(t, pgs.replica)
            assert all(torch.equal(copies[0], c) for c in copies[1:]), "bit-identical after averaging"
            torch.testing.assert_close(t, torch.stack(gathered_before).mean(0), rtol=1e-6, atol=1e-7)
        # The kernel trains what was averaged: the same input gives the same output on every replica.
        dense, kjt, _ = random_batch(seed=99)
        model.eval()
        with torch.no_grad():
            out = model(dense, kjt)
        copies = _gather(out, pgs.replica)
        assert all(torch.equal(copies[0], c) for c in copies[1:])
    # Dense state is replicated on every rank (DDP): averaging it over the world changes nothing.
    dense_before = [t.clone() for t in averager.dense_tensors]
    averager.average_dense()
    for a, b in zip(averager.dense_tensors, dense_before):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    dist.destroy_process_group()


@pytest.mark.parametrize("sharding_group_size", [2, 1, 4])
def test_embedding_replicas_average_to_bit_identical_copies(sharding_group_size):
    spawn(_average_worker, 4, sharding_group_size)
