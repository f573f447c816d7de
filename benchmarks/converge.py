"""Time of HDET's converge step (``recsys_hdet.components.replicas.average_``) against replicated bytes.

Spawns ``--nproc`` gloo workers; each averages a set of float32 tensors totalling S MB (split
into 8 tensors, as real state is many tensors) ``--reps`` times per size. Rank 0 writes the
median seconds per size and a least-squares line ``seconds = intercept + slope * MB``.

    python -m benchmarks.converge --sizes 1 4 16 64 --out converge.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import List

import numpy as np
import torch
import torch.distributed as dist


def _worker(sizes: List[float], reps: int, out: str) -> int:
    from recsys_hdet.components.replicas import average_

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    medians = []
    for mb in sizes:
        numel = int(mb * 2**20 / 4)
        tensors = [torch.full((numel // 8,), float(rank)) for _ in range(8)]
        average_(tensors, dist.group.WORLD)  # warm-up (buffers, connections)
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            average_(tensors, dist.group.WORLD)
            times.append(time.perf_counter() - start)
        # Every rank holds the mean of 0..world-1 (checks the benchmark measured a real average).
        expected = (dist.get_world_size() - 1) / 2
        assert abs(float(tensors[0][0]) - expected) < 1e-5
        worst = torch.tensor([statistics.median(times)])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the step takes as long as its slowest rank
        medians.append(float(worst))
    if rank == 0:
        slope, intercept = np.polyfit(np.array(sizes), np.array(medians), 1)
        pred = intercept + slope * np.array(sizes)
        ss_res = float(((np.array(medians) - pred) ** 2).sum())
        ss_tot = float(((np.array(medians) - np.mean(medians)) ** 2).sum()) or 1e-30
        with open(out, "w") as f:
            json.dump({"sizes_mb": sizes, "seconds": medians, "seconds_per_mb": float(slope),
                       "intercept_seconds": float(intercept), "r2": 1 - ss_res / ss_tot,
                       "nproc": dist.get_world_size(), "reps": reps}, f, indent=2)
    dist.destroy_process_group()
    return 0


def main(argv=None) -> None:
    from recsys_hdet.distributed import launch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64], help="replicated MB per rank")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    code = launch(_worker, (args.sizes, args.reps, args.out), args.nproc)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
