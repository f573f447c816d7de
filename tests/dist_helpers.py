"""Helpers for tests that run real multi-process (gloo) jobs with torch.multiprocessing."""
import faulthandler
import os
import signal
import socket
import time

import torch
import torch.multiprocessing as mp
from torchrec import KeyedJaggedTensor

from recsys_hdet.models.ranker import MultiTaskRanker, SparseFeature

FEATURES = [SparseFeature("user_id", 40), SparseFeature("video_id", 60), SparseFeature("tab", 8),
            SparseFeature("tag", 30, multi=True)]
NUM_DENSE = 4


def _entry(rank, world, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    # spawn() asks a rank that outlives its deadline for its threads' stacks (into the test's output).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # What fn returns lives until os._exit: a worker may return the objects that hold its process
    # group (a DDP model) so that no gloo process group is destroyed on this thread while gloo's
    # thread still releases a work it ran. That release can need the GIL, which the destructor's
    # thread holds while it joins gloo's thread: a deadlock (seen: the comm-hook test hung CI).
    kept = fn(*args)  # noqa: F841
    # As the launcher does (recsys_hdet.distributed._worker_entry): skip C++ teardown, where a
    # background thread's destructor can abort a process whose work has finished.
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world, *args, timeout_s=600.0):
    """Runs ``fn(*args)`` on ``world`` gloo ranks; a failing rank fails the test with its traceback.

    A job still running after ``timeout_s`` fails the test instead of hanging the suite (a gloo
    collective waits 30 minutes by default): its live ranks print their threads' stacks, then are
    killed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(_entry, args=(world, port, fn, args), nprocs=world, start_method="spawn",
                                 join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() < deadline:
            continue
        alive = [p for p in context.processes if p.is_alive()]
        for p in alive:  # one at a time, so their stacks do not interleave
            os.kill(p.pid, signal.SIGUSR1)
            time.sleep(1.0)
        for p in alive:
            p.kill()
        raise AssertionError(f"{fn.__name__} on {world} gloo ranks was still running after {timeout_s:.0f} s "
                             f"(ranks {[context.processes.index(p) for p in alive]} alive; their stacks are in "
                             "the captured stderr)")


def tiny_sharded_model(pgs, lr=0.1):
    from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params
    from recsys_hdet.optim_schema import DenseOptimizerConfig, EmbeddingOptimizerConfig
    from recsys_hdet.distributed import shard_model

    torch.manual_seed(0)
    model = MultiTaskRanker(FEATURES, NUM_DENSE, ["a", "b"], embedding_dim=8, device="meta")
    model = shard_model(model, pgs, fused_params(EmbeddingOptimizerConfig(type="rowwise_adagrad"), lr), ["table_wise", "column_wise"])
    opt = GroupedOptimizer(model, DenseOptimizerConfig(type="adam"), {g: lr for g in ("embedding", "transformer", "non_embedding", "no_decay")})
    return model, opt


def random_batch(seed, batch_size=16):
    g = torch.Generator().manual_seed(seed)
    lengths = [torch.ones(batch_size, dtype=torch.int32) for f in FEATURES if not f.multi]
    lengths.append(torch.randint(0, 4, (batch_size,), generator=g, dtype=torch.int32))
    values = [torch.randint(0, f.vocab, (int(l.sum()),), generator=g) for f, l in zip(FEATURES, lengths)]
    kjt = KeyedJaggedTensor(keys=[f.name for f in FEATURES], values=torch.cat(values), lengths=torch.cat(lengths))
    return torch.randn(batch_size, NUM_DENSE, generator=g), kjt, torch.randint(0, 2, (batch_size, 2), generator=g).float()


def train_steps(model, opt, seed, steps):
    for i in range(steps):
        dense, kjt, y = random_batch(seed * 1000 + i)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
