"""Process groups, the 2-D parallel layout, model sharding, and the local launcher.

Layout (product.md): ``world = sharding_group_size x replicas``. Sharding group ``g`` is the
contiguous block of ranks ``[g*S, (g+1)*S)``; the TorchRec planner shards the embedding tables
within each group, so every group holds one full copy of the tables (TorchRec's own 2-D layout
with ``use_inter_host_allreduce``, built here with ``ShardingEnv2D`` because TorchRec's
``DMPCollection`` asserts CUDA). Rank ``r``'s replica group is the set of ranks that hold the
same shards in the other groups: ``{r % S + g*S}``. Dense parameters are replicated on every rank
and all-reduced over the whole world by DDP.

The launcher: under torchrun (``RANK``/``WORLD_SIZE`` set) a process joins the job as it is; a
plain ``python -m recsys_hdet.train`` on one machine starts ``trainer.nproc`` local workers itself.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


@dataclass(frozen=True)
class ParallelLayout:
    """Where this rank sits in the 2-D layout. Pure arithmetic: tested without process groups."""

    rank: int
    world_size: int
    sharding_group_size: int

    def __post_init__(self) -> None:
        if self.sharding_group_size < 1 or self.world_size % self.sharding_group_size:
            raise ValueError(
                f"trainer.sharding_group_size={self.sharding_group_size} must divide the world size "
                f"{self.world_size}"
            )

    @property
    def replicas(self) -> int:
        """How many full copies of the embedding tables the world holds."""
        return self.world_size // self.sharding_group_size

    @property
    def sharding_group(self) -> int:
        """Index of this rank's sharding group (= which embedding replica it belongs to)."""
        return self.rank // self.sharding_group_size

    def sharding_group_ranks(self) -> List[List[int]]:
        s = self.sharding_group_size
        return [list(range(g * s, (g + 1) * s)) for g in range(self.replicas)]

    def replica_group_ranks(self) -> List[List[int]]:
        s = self.sharding_group_size
        return [[p + g * s for g in range(self.replicas)] for p in range(s)]


@dataclass
class ProcessGroups:
    layout: ParallelLayout
    device: torch.device
    mesh: Any  # DeviceMesh with dims ("replicate", "shard")
    world: dist.ProcessGroup
    sharding: dist.ProcessGroup
    replica: dist.ProcessGroup


def backend_and_device(local_rank: int) -> tuple[str, torch.device]:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def quiet_library_warnings() -> None:
    """TorchRec and torch.distributed warn loudly on CPU; none of it is actionable for a user."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("torchrec", "torch", "fbgemm_gpu"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _restart_safe_store(timeout_s: float) -> Dict[str, Any]:
    """Under torchrun's agent store, the store of a restarted attempt: the same TCPStore server as
    the attempt before, so the process groups' keys get the restart count as a prefix. Without it
    a restarted rank can read a dead peer's address left by the previous attempt and fail with
    "Gloo connectFullMesh failed ... Connection refused" (measured with --max-restarts=1; the
    stale-store problem of pytorch/pytorch#135712). Empty (env:// as usual) otherwise."""
    from datetime import timedelta

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"recsys_hdet/attempt{attempt}", store), "rank": int(os.environ["RANK"]),
            "world_size": world}


def init_process_groups(sharding_group_size: int, timeout_s: float = 300.0) -> ProcessGroups:
    """Initializes the default group from the environment (torchrun's variables) and the 2-D mesh.

    ``timeout_s`` bounds every collective: a peer that died mid-collective makes the others fail
    after it instead of torch's default 30 minutes (the local launcher and torchrun's agent notice
    a dead worker within seconds and stop the rest sooner; this is the bound when nothing else
    does, e.g. a hung host)."""
    from datetime import timedelta

    from torch.distributed.device_mesh import DeviceMesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend, device = backend_and_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **_restart_safe_store(timeout_s))
    layout = ParallelLayout(dist.get_rank(), dist.get_world_size(), sharding_group_size)
    mesh = DeviceMesh(device.type, layout.sharding_group_ranks(), mesh_dim_names=("replicate", "shard"))
    return ProcessGroups(
        layout=layout,
        device=device,
        mesh=mesh,
        world=dist.group.WORLD,
        sharding=mesh.get_group("shard"),
        replica=mesh.get_group("replicate"),
    )


def shard_model(
    model: nn.Module,
    pgs: ProcessGroups,
    fused_params: Dict[str, Any],
    sharding_types: Sequence[str],
    dense_gradients: str = "allreduce",
) -> nn.Module:
    """Wraps ``model`` in ``DistributedModelParallel`` with a planner-chosen plan per sharding group.

    The plan is computed once (rank 0, for a topology of one sharding group) and broadcast; each
    group then moves it onto its own ranks, as TorchRec's DMPCollection does. ``sharding_types``
    restricts the planner to kernels that use the fused optimizer (on CPU: table_wise,
    column_wise), so every table is trained by it. ``dense_gradients``: "allreduce" (DDP's average over
    the world, :func:`finite_mean_allreduce_hook`) or "local" (:func:`local_gradient_hook`: none).
    """
    from torch.distributed.remote_device import _remote_device
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv2D

    layout = pgs.layout
    sharder = EmbeddingBagCollectionSharder(fused_params=fused_params)
    constraints = {
        table.name: ParameterConstraints(sharding_types=list(sharding_types))
        for ebc in model.modules()
        if hasattr(ebc, "embedding_bag_configs")
        for table in ebc.embedding_bag_configs()
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=layout.sharding_group_size, compute_device=pgs.device.type),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, [sharder], pgs.world)
    offset = layout.sharding_group * layout.sharding_group_size
    for module_plan in plan.plan.values():
        for param_sharding in module_plan.values():
            param_sharding.ranks = [r + offset for r in param_sharding.ranks or []]
            spec = param_sharding.sharding_spec
            for shard in spec.shards if spec is not None else []:
                shard.placement = _remote_device(f"rank:{shard.placement.rank() + offset}/{pgs.device}")
    env = ShardingEnv2D(
        sharding_pg=pgs.sharding,
        replica_pg=pgs.replica,
        global_pg=pgs.world,
        device_mesh=pgs.mesh,
        use_inter_host_allreduce=True,
    )
    dmp = DistributedModelParallel(model, env=env, device=pgs.device, plan=plan, sharders=[sharder])
    hooks = {"allreduce": finite_mean_allreduce_hook, "local": local_gradient_hook}
    if dense_gradients not in hooks:
        raise ValueError(f"trainer.dense_gradients={dense_gradients!r}: choose one of {sorted(hooks)}")
    reduction = DenseGradientReduction(hooks[dense_gradients], pgs.world)
    dmp._dmp_wrapped_module.register_comm_hook(reduction, reduce_dense_gradients)
    dmp.dense_gradient_reduction = reduction  # the job may narrow it for a while (HDET's range test)
    return dmp


class DenseGradientReduction:
    """The state of DDP's communication hook (:func:`reduce_dense_gradients`): the hook and a process group
    that can change: the world by default; for a while another group (:meth:`within`: HDET's range test
    reduces the dense gradients within each replica, so that the replicas' sweeps do not share a gradient)."""

    def __init__(self, hook: Callable[..., Any], group: Any) -> None:
        self.hook = hook
        self.group = group

    @contextmanager
    def within(self, group: Any) -> Iterator[None]:
        """The dense gradients reduced over ``group`` inside the block, over the earlier group after it."""
        before, self.group = self.group, group
        try:
            yield
        finally:
            self.group = before


def reduce_dense_gradients(state, bucket):  # (DenseGradientReduction, GradBucket) -> Future
    """DDP's hook: ``state.hook`` over ``state.group`` (the group as it is at this step)."""
    return state.hook(state.group, bucket)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit), not the
    machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def threads_per_worker(configured, local_workers: int) -> int:
    """The thread policy: ``configured`` (trainer.threads_per_worker) when set, else the usable cores
    shared evenly by the local workers, at least one each. Never more threads than cores per worker:
    with more OpenMP threads than cores libgomp stops spinning and every parallel region pays a sleep
    and wake; under load from other processes even 2 threads per worker collapsed (1.3-1.8k rows/s)."""
    if configured:
        return int(configured)
    return max(1, usable_cores() // max(1, int(local_workers)))


def finite_mean_allreduce_hook(group, bucket):  # (ProcessGroup, GradBucket) -> Future; DDP rejects
    # string annotations (this module uses postponed evaluation), so they are left off.
    """DDP's gradient all-reduce, averaged over the ranks whose bucket is finite.

    With DDP's own hook one rank's NaN or inf gradient (a replica whose state blew up at its own
    HDET learning rate) becomes every rank's gradient at the next step, so no replica is left to
    restore it from. Here a non-finite bucket contributes zeros and is not counted: the healthy
    ranks train on, and the non-finite rank is excluded and restored at the next HDET sync. When
    every rank is non-finite the result is non-finite too (nothing to average), and the run stops
    as diverged. One all-reduce per bucket, as DDP's (the count rides at the end of the buffer).
    """
    grad = bucket.buffer()
    # Summed in float64: the sum of a few float32 values is then exact, so it does not depend on
    # the order the collective adds them in. With a float32 sum over more than two ranks a resumed
    # run drifted from the uninterrupted one by rounding (measured: 3e-9 of the train loss on 4
    # ranks; exact on 2, where a + b == b + a): something in a new job (not DDP's first-step bucket
    # rebuild alone: replaying it did not help) changes that order. The price: twice the bytes of
    # the dense gradient all-reduce.
    buffer = torch.empty(grad.numel() + 1, dtype=torch.float64, device=grad.device)
    finite = bool(torch.isfinite(grad).all())
    if finite:
        buffer[:-1].copy_(grad)
    else:
        buffer[:-1].zero_()
    buffer[-1] = 1.0 if finite else 0.0
    # The all-reduce and the division run here, on the training thread, and the hook returns a
    # completed future: a ``future.then()`` callback would run its tensor ops on gloo's worker
    # thread, which gets its own OpenMP team; with more OpenMP threads than cores libgomp stops
    # spinning and every parallel region of the training thread pays a sleep and wake (measured
    # 2x on a whole step at one worker with two threads). On CUDA the collective and the division
    # are ordered on the stream as before; the overlap with backward that an async hook allows on
    # CPU is worth less than that.
    dist.all_reduce(buffer, group=group)
    count = buffer[-1]
    mean = (buffer[:-1] / count.clamp(min=1.0)).to(grad.dtype)
    result = torch.where(count > 0, mean, torch.full_like(mean, float("nan")))
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return future


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_entry(local_rank: int, nproc: int, port: int, fn: Callable[..., int], args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
    )
    code = fn(*args)
    # Leave without interpreter/C++ teardown: with the work done and the process group destroyed,
    # a background thread's destructor (gloo, fbgemm) can abort the process at exit ("terminate
    # called without an active exception"), which would turn a finished run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


_FAILURE_GRACE_S = 10.0


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_follower() -> bool:
    """A torchrun rank other than 0: the job's one-time work (preparing the data, the run directory's
    config record and lock, Hydra's ``.hydra/``) is rank 0's."""
    return under_torchrun() and os.environ["RANK"] != "0"


def launch(fn: Callable[..., int], args: tuple, nproc: int) -> int:
    """Runs ``fn(*args)`` on ``nproc`` local workers (spawned) and returns the job's exit status.

    ``fn`` returns a status code; the job's status is the first non-zero worker code (a worker
    killed by a signal counts as 1), so a distinct status such as "diverged" reaches the shell.
    """
    if under_torchrun():
        return fn(*args)
    ctx = mp.start_processes(
        _worker_entry, args=(nproc, _free_port(), fn, args), nprocs=nproc, join=False, start_method="spawn"
    )
    # A worker that dies leaves its peers blocked in a collective: give them a grace period to
    # fail on their own, then stop them, so a crash never hangs the job.
    failed_at: Optional[float] = None
    stopped: List[int] = []  # workers this launcher terminated after another one failed
    while any(p.is_alive() for p in ctx.processes):
        time.sleep(0.2)
        if failed_at is None and any(p.exitcode not in (None, 0) for p in ctx.processes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > _FAILURE_GRACE_S:
            for rank, p in enumerate(ctx.processes):
                if p.is_alive():
                    p.terminate()
                    stopped.append(rank)
    codes: List[Optional[int]] = [p.exitcode for p in ctx.processes]
    _report_failed_workers(codes, ctx.error_files, stopped)
    nonzero = [c for c in codes if c]
    if not nonzero:
        return 0
    return nonzero[0] if nonzero[0] > 0 else 1


def _report_failed_workers(codes: List[Optional[int]], error_files: List[str], stopped: Sequence[int] = ()) -> None:
    """Says on stderr how each crashed worker ended: its traceback (torch.multiprocessing leaves it
    in the worker's error file, which nobody reads unless the parent joins), or the signal."""
    import pickle

    for rank, (code, path) in enumerate(zip(codes, error_files)):
        if not code:
            continue
        trace = None
        if path and os.path.isfile(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as f:
                trace = pickle.load(f)
        if rank in stopped:
            print(f"worker {rank} was stopped by the launcher {_FAILURE_GRACE_S:.0f} s after another worker failed",
                  file=sys.stderr, flush=True)
        elif code < 0:
            print(f"worker {rank} was killed by signal {signal.Signals(-code).name}", file=sys.stderr, flush=True)
        elif trace:
            print(f"worker {rank} failed (exit status {code}):\n{trace.rstrip()}", file=sys.stderr, flush=True)
        # else: a status the worker returned (e.g. diverged), which the job reports itself


def local_gradient_hook(group, bucket):  # (ProcessGroup, GradBucket) -> Future
    """No dense all-reduce: each rank keeps its own gradient (``trainer.dense_gradients=local``).

    Local SGD for HDET: between syncs each rank's dense replica follows its own data and its own
    learning rate, a real trajectory rather than a step size along the world's shared direction; the
    sync averages the replicas (``recsys_hdet.components.replicas``). What it saves: the dense
    gradient all-reduce of every step (one all-reduce of the dense state per sync remains). What it
    costs: each replica's gradient comes from 1 / world of the global batch. A completed future, on the
    training thread (see :func:`finite_mean_allreduce_hook`)."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
