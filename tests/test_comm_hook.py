"""The DDP communication hook (recsys_hdet.distributed.finite_mean_allreduce_hook), in real
2-process gloo runs: its arithmetic (a float64 mean over the ranks whose bucket is finite) and
where it runs (on the training thread: it returns a completed future, so no callback is left for
gloo's worker thread, whose OpenMP team slowed every parallel region of the training thread 2x)."""

import threading

import torch
import torch.distributed as dist
from torch import nn

from dist_helpers import spawn


def _hook_worker():
    from recsys_hdet.distributed import finite_mean_allreduce_hook

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
    calls = []

    def recording_hook(group, bucket):
        future = finite_mean_allreduce_hook(group, bucket)
        calls.append((future.done(), threading.get_ident()))
        return future

    model.register_comm_hook(None, recording_hook)
    inputs = {0: torch.tensor([[1.0, 2.0, 3.0]]), 1: torch.tensor([[0.5, -1.0, 0.25]])}
    # Each rank's own gradient, to check the mean against.
    probe = nn.Linear(3, 2)
    probe.load_state_dict(model.module.state_dict())
    own = []
    for r in (0, 1):
        probe.zero_grad()
        probe(inputs[r]).sum().backward()
        own.append([p.grad.clone() for p in probe.parameters()])
    model(inputs[rank]).sum().backward()
    for p, a, b in zip(model.module.parameters(), own[0], own[1]):
        expected = ((a.double() + b.double()) / 2).float()
        assert torch.equal(p.grad, expected), (p.grad, expected)
    # Rank 1's gradient non-finite: the mean is rank 0's alone, on both ranks.
    model.zero_grad()
    x = inputs[rank] * (float("nan") if rank == 1 else 1.0)
    model(x).sum().backward()
    for p, a in zip(model.module.parameters(), own[0]):
        assert torch.equal(p.grad, a), (p.grad, a)
    # Every future was complete when the hook returned, on the thread that ran backward.
    assert calls and all(done for done, _ in calls), calls
    assert {t for _, t in calls} == {threading.get_ident()}
    # Kept alive until the worker's os._exit (dist_helpers._entry): freeing the model here, right
    # after a backward's all-reduce, destroyed the process group while gloo's thread was still
    # releasing that work, and the two threads deadlocked on the GIL.
    return model


def test_the_comm_hook_averages_the_finite_ranks_in_float64_and_leaves_no_callback_to_gloos_thread():
    spawn(_hook_worker, 2)


def _local_hook_worker():
    from recsys_hdet.distributed import local_gradient_hook

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
    model.register_comm_hook(None, local_gradient_hook)
    probe = nn.Linear(3, 2)
    probe.load_state_dict(model.module.state_dict())
    x = torch.tensor([[1.0, 2.0, 3.0]]) * (rank + 1)
    probe(x).sum().backward()
    model(x).sum().backward()
    for p, own in zip(model.module.parameters(), probe.parameters()):
        assert torch.equal(p.grad, own.grad), (rank, p.grad, own.grad)
    return model


def test_the_local_hook_leaves_each_rank_its_own_gradient():
    """trainer.dense_gradients=local: no average between syncs (rank 1's input is twice rank 0's, so
    any mixing would show)."""
    spawn(_local_hook_worker, 2)


def _narrowed_worker():
    from recsys_hdet.distributed import DenseGradientReduction, finite_mean_allreduce_hook, reduce_dense_gradients

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    alone = [dist.new_group([r]) for r in (0, 1)][rank]  # every rank creates every group, in the same order
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
    reduction = DenseGradientReduction(finite_mean_allreduce_hook, dist.group.WORLD)
    model.register_comm_hook(reduction, reduce_dense_gradients)
    probe = nn.Linear(3, 2)
    probe.load_state_dict(model.module.state_dict())
    inputs = [torch.tensor([[1.0, 2.0, 3.0]]) * (r + 1) for r in (0, 1)]
    own = []
    for x in inputs:
        probe.zero_grad()
        probe(x).sum().backward()
        own.append([p.grad.clone() for p in probe.parameters()])
    with reduction.within(alone):  # narrowed to this rank alone: its own gradient
        model(inputs[rank]).sum().backward()
        assert reduction.group is alone
    for p, mine in zip(model.module.parameters(), own[rank]):
        assert torch.equal(p.grad, mine), (rank, p.grad, mine)
    assert reduction.group is dist.group.WORLD  # back to the world after the block
    model.zero_grad()
    model(inputs[rank]).sum().backward()
    for p, a, b in zip(model.module.parameters(), *own):
        assert torch.equal(p.grad, ((a.double() + b.double()) / 2).float())
    return model


def test_the_reduction_narrowed_for_a_block_leaves_each_group_its_own_gradient_then_averages_the_world():
    spawn(_narrowed_worker, 2)
