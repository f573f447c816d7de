"""``python -m benchmarks.loader_speed ROOT [--repeat 3] [--profile]``: the one-core loader's rows per CPU
second on a converted data set (issue 48, item 3), measured as the scaling benchmark measures it
(:func:`benchmarks.scaling_measure.loader_one_core`: a fresh process pinned to one core, one polars and
torch thread, the first training day read untimed, the others timed; CPU seconds of all its threads),
``--repeat`` times for rank 0 of 4 with ``own_row_groups`` and with ``whole_day``; prints the median and
every run. ``--baseline CHECKOUT``: another checkout's loader measured alternately with this one's. ``--profile``: where one rank's day goes, in a child on one core: reading the day (the
:class:`~recsys_hdet.components.day_arrays.DayArrays`) and cutting its batches, timed apart (CPU
seconds), and cProfile's top functions of both. Writes nothing."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

from benchmarks.processes import python
from benchmarks.scaling_measure import LOADER_KEYS, loader_one_core

RANKS = ((0, 4, "own_row_groups"), (0, 4, "whole_day"))


def profile_child(root: str, rank: str, world_size: str, read: str, top: str) -> None:
    """One rank's first timed day, read and cut in line on this thread (one core, one thread)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import cProfile
    import pstats
    import time

    import torch

    from benchmarks.scaling_measure import compose_config, config_overrides
    from recsys_hdet.components.dataloader import ParquetBatchStream
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_for

    torch.set_num_threads(1)
    cfg = compose_config(config_overrides(root, []))
    meta = DatasetMeta.load(root)
    days, _ = split_for(meta, cfg.data)
    s = ParquetBatchStream(meta, days, int(cfg.data.batch_size), int(rank), int(world_size), int(cfg.seed),
                           shuffle_within_day=bool(cfg.data.shuffle_within_day),
                           normalization=DenseNormalization.from_days(meta, days),
                           reserve_rows=int(cfg.data.reserve_rows or 0), read=read)
    s._make_batch(s._read_day(0), 0)  # warm-up (imports, first calls)
    n = s.batches_in_day(days[1])
    t0 = time.process_time()
    arrays = s._read_day(1)
    t1 = time.process_time()
    rows = sum(s._make_batch(arrays, i).labels.shape[0] for i in range(n))
    t2 = time.process_time()
    print(f"{read}: {rows:,} rows in {n} batches; read day {t1 - t0:.3f} s, batches {t2 - t1:.3f} s "
          f"({(t2 - t1) / max(n, 1) * 1e3:.3f} ms a batch): {rows / (t2 - t0):,.0f} rows per CPU second in line")
    prof = cProfile.Profile()
    prof.enable()
    arrays = s._read_day(1)
    for i in range(n):
        s._make_batch(arrays, i)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(int(top))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="a converted data set (layout 2) with at least 3 days")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25, help="cProfile's lines per read mode")
    ap.add_argument("--baseline", metavar="CHECKOUT", help="another checkout (e.g. a git worktree of an earlier "
                    "commit) whose loader is measured alternately with this tree's, on the same data")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    env = {**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if args.profile:
        for rank, world, read in RANKS:
            m = python("import sys\nfrom benchmarks.loader_speed import profile_child\nprofile_child(*sys.argv[1:])",
                       root, str(rank), str(world), read, str(args.top), env=env)
            print(m.stdout, flush=True)
    for rank, world, read in RANKS:
        runs: Dict[str, List[float]] = {"this tree": [], **({args.baseline: []} if args.baseline else {})}
        for _ in range(args.repeat):  # the two trees alternately, so that both see the same machine
            runs["this tree"].append(loader_one_core(root, rank, world, [], read)["rows_per_cpu_second"])
            if args.baseline:
                runs[args.baseline].append(baseline_rows_per_cpu_second(args.baseline, root, rank, world, read, env))
        for tree, values in runs.items():
            print(f"{tree}: rank {LOADER_KEYS[rank, world, read]}: {statistics.median(values):,.0f} rows per CPU "
                  f"second (median of {json.dumps([round(r) for r in values])})", flush=True)


def baseline_rows_per_cpu_second(checkout: str, root: str, rank: int, world: int, read: str,
                                 env: Dict[str, str]) -> float:
    """The same measurement with another checkout's loader (its own ``loader_child``: in
    ``benchmarks.scaling_measure``, or ``benchmarks.scaling`` before that module was split)."""
    module = "scaling_measure" if os.path.isfile(os.path.join(checkout, "benchmarks", "scaling_measure.py")) else "scaling"
    code = f"import sys\nfrom benchmarks.{module} import loader_child\nloader_child(*sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", code, root, str(rank), str(world), "[]", read], cwd=checkout, env=env,
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["rows"] / r["cpu_seconds"]


if __name__ == "__main__":
    main()
