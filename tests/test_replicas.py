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
    # Under HDET the ranks' dense copies differ (one LR each): the average is over the whole world,
    # not over a replica group (mutant: averaging dense state over pgs.replica).
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        for i, t in enumerate(averager.dense_tensors):
            t.add_(float(rank + 1) * (i + 1) * 1e-3)
    averager.average_dense()
    world_mean_offset = sum(range(1, world + 1)) / world * 1e-3
    for i, (a, b) in enumerate(zip(averager.dense_tensors, dense_before)):
        torch.testing.assert_close(a, b + world_mean_offset * (i + 1), rtol=1e-5, atol=1e-6)
    dist.destroy_process_group()


@pytest.mark.parametrize("sharding_group_size", [2, 1, pytest.param(4, marks=pytest.mark.slow)])
def test_embedding_replicas_average_to_bit_identical_copies(sharding_group_size):
    spawn(_average_worker, 4, sharding_group_size)


def _guard_worker():
    from recsys_hdet.components.replicas import ReplicaAverager
    from recsys_hdet.distributed import init_process_groups

    pgs = init_process_groups(2)  # sharding groups {0, 1} and {2, 3}
    rank = dist.get_rank()
    model, opt = tiny_sharded_model(pgs)
    train_steps(model, opt, seed=rank, steps=2)
    averager = ReplicaAverager(model, pgs.replica, pgs.world)
    dense_before = [_gather(t, pgs.world) for t in averager.dense_tensors]
    emb_before = [_gather(t, pgs.replica) for t in averager.embedding_tensors]
    if rank == 3:  # plant non-finite state in one replica (rank 3; its sharding group is 1)
        averager.dense_tensors[0].view(-1)[0] = float("nan")
        averager.embedding_tensors[0].view(-1)[0] = float("inf")
    assert averager.local_state_is_finite() == (rank != 3)
    excluded = [3]
    averager.average_dense(include=rank not in excluded)
    averager.average_embeddings(include=pgs.layout.sharding_group != 1)
    assert averager.local_state_is_finite(), "the excluded replica is restored"
    for t, before in zip(averager.dense_tensors, dense_before):
        copies = _gather(t, pgs.world)
        assert all(torch.equal(copies[0], c) for c in copies[1:])
        torch.testing.assert_close(t, torch.stack(before[:3]).mean(0), rtol=1e-6, atol=1e-7)
    for t, before in zip(averager.embedding_tensors, emb_before):
        # Replica group {r, r+2}: only sharding group 0's copy counts; both now hold it exactly.
        assert torch.equal(t, before[0])
    dist.destroy_process_group()


def test_a_non_finite_replica_is_left_out_of_the_average_and_restored_from_it():
    spawn(_guard_worker, 4)


def _differing_state_worker():
    from recsys_hdet.components.replicas import ReplicaAverager
    from recsys_hdet.distributed import init_process_groups

    pgs = init_process_groups(2)  # two embedding replicas (sharding groups), four dense replicas
    model, opt = tiny_sharded_model(pgs)
    averager = ReplicaAverager(model, pgs.replica, pgs.world)
    assert averager.differing_state() == [], "a freshly built model is the same on every replica"
    train_steps(model, opt, seed=dist.get_rank(), steps=2)  # each sharding group trains its own tables
    assert averager.differing_state() == ["embedding"]
    averager.average_embeddings()
    assert averager.differing_state() == []
    if dist.get_rank() == 1:  # one rank's dense copy moves by one ulp
        with torch.no_grad():
            averager.dense_tensors[-1].view(-1)[0] = torch.nextafter(averager.dense_tensors[-1].view(-1)[0],
                                                                    torch.tensor(float("inf")))
    assert averager.differing_state() == ["dense"], "the same answer on every rank, down to one ulp"
    dist.destroy_process_group()


def test_differing_state_names_what_the_replicas_disagree_on():
    spawn(_differing_state_worker, 4)


def _mixed_probe_worker():
    from recsys_hdet.components.replicas import ReplicaAverager, mixed_replica_loss
    from recsys_hdet.distributed import init_process_groups

    pgs = init_process_groups(2)  # 4 ranks: 2 sharding groups, so embeddings have 2 replicas
    model, opt = tiny_sharded_model(pgs)
    train_steps(model, opt, seed=dist.get_rank(), steps=3)
    averager = ReplicaAverager(model, pgs.replica, pgs.world)
    own_dense = [t.clone() for t in averager.dense_tensors]
    own_emb = [t.clone() for t in averager.embedding_weights]
    avg_dense = [torch.stack(_gather(t, pgs.world)).mean(0) for t in own_dense]
    avg_emb = [torch.stack(_gather(t, pgs.replica)).mean(0) for t in own_emb]
    seen = {}

    def score():  # records what the probe scored
        seen["dense"] = [t.clone() for t in averager.dense_tensors]
        seen["emb"] = [t.clone() for t in averager.embedding_weights]
        return 0.5

    assert mixed_replica_loss(averager, score, 0.25, 0.5) == 0.5
    for got, own, avg in zip(seen["dense"], own_dense, avg_dense):
        torch.testing.assert_close(got, avg + 0.25 * (own - avg), rtol=1e-5, atol=1e-6)
    for got, own, avg in zip(seen["emb"], own_emb, avg_emb):
        torch.testing.assert_close(got, avg + 0.5 * (own - avg), rtol=1e-5, atol=1e-6)
    # This replica's own weights come back bit for bit.
    assert all(torch.equal(a, b) for a, b in zip(averager.dense_tensors, own_dense))
    assert all(torch.equal(a, b) for a, b in zip(averager.embedding_weights, own_emb))


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores); `make test-all` runs it
def test_mixed_probe_scores_the_pulled_weights_and_restores_them():
    spawn(_mixed_probe_worker, 4)
