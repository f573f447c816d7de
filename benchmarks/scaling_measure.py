"""The scaling benchmark's measurements of one converted data set (:mod:`benchmarks.scaling`): one rank's
input pipeline on one core (:func:`loader_one_core`, run in a fresh process as :func:`loader_child`),
training (:func:`train`), and every figure of a size together with its conversion (:func:`measure`)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

from benchmarks.processes import python, run_measured
from benchmarks.scaling_data import convert, data_facts
from recsys_hdet.run_dir import RunDir

LOG_EVERY = 25  # trainer.log_every: RunDir.METRICS's intervals (the steady examples/s)
# (rank, world_size, data.read) of the one-core loader: the first is the target's (the kuairand preset's
# own_row_groups), the second the same rank decoding whole days (the layout-1 way), side by side
LOADER_RANKS = ((0, 4, "own_row_groups"), (0, 4, "whole_day"), (0, 1, "own_row_groups"))
LOADER_KEYS = {(0, 4, "own_row_groups"): "0/4", (0, 4, "whole_day"): "0/4 whole_day", (0, 1, "own_row_groups"): "0/1"}


def config_overrides(root: str, extra: List[str]) -> List[str]:
    """The Hydra overrides of every training run (and of the loader's config): the processed data set
    read as a converted one (no generator), then ``--train-override``'s."""
    return ["data=kuairand", f"data.root={root}", *extra]


def compose_config(overrides: List[str]):
    from recsys_hdet.config import compose

    return compose("config", overrides)


def loader_child(root: str, rank: str, world_size: str, extra: str, read: str) -> None:
    """In a fresh process (POLARS_MAX_THREADS=1 in its environment): pinned to one core, one torch
    thread; prints the timed stream's rows, wall seconds and CPU seconds (all its threads) as JSON."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    from recsys_hdet.components.dataloader import ParquetBatchStream
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_for

    torch.set_num_threads(1)
    cfg = compose_config(config_overrides(root, json.loads(extra)))
    meta = DatasetMeta.load(root)
    days, _ = split_for(meta, cfg.data)
    normalization = DenseNormalization.from_days(meta, days)

    def stream(which: List[str]) -> ParquetBatchStream:
        return ParquetBatchStream(meta, which, int(cfg.data.batch_size), int(rank), int(world_size), int(cfg.seed),
                                  shuffle_within_day=bool(cfg.data.shuffle_within_day), normalization=normalization,
                                  reserve_rows=int(cfg.data.reserve_rows or 0), read=read)

    for _ in stream(days[:1]):
        pass
    start, cpu_start = time.perf_counter(), time.process_time()
    rows = sum(b.labels.shape[0] for b in stream(days[1:]))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds}))


def loader_one_core(root: str, rank: int, world_size: int, extra: List[str], read: str) -> Dict[str, float]:
    """Rows/s over wall time (the target's figure) and per CPU second (what contention from other
    processes on the core does not change), and the process's peak RSS."""
    m = python("import sys\nfrom benchmarks.scaling_measure import loader_child\nloader_child(*sys.argv[1:])",
               root, str(rank), str(world_size), json.dumps(extra), read,
               env={**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"})
    r = json.loads(m.stdout.strip().splitlines()[-1])
    return {"rows_per_sec": r["rows"] / r["seconds"], "rows_per_cpu_second": r["rows"] / r["cpu_seconds"],
            "peak_rss_mb": m.peak_rss_mb}


def train(root: str, nproc: int, steps: int, extra: List[str], workdir: str, group: int = 0) -> Dict[str, float]:
    """``recsys_hdet.train`` on ``root`` with ``nproc`` workers in sharding groups of ``group`` (0: one group)."""
    run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}", "experiment_name=scaling",
           f"trainer.nproc={nproc}", f"trainer.sharding_group_size={group or nproc}", f"trainer.stop_at_step={steps}",
           f"trainer.log_every={LOG_EVERY}", "trainer.checkpoint=false", "trainer.periodic_checkpoint.every_steps=0",
           "trainer.tensorboard=false", *config_overrides(root, extra)]
    run_measured(cmd)
    run = RunDir(run_dir)
    s = run.summary()
    if s["steps"] != steps:
        raise SystemExit(f"{' '.join(cmd)}: trained {s['steps']} steps, not {steps} (too few training rows?)")
    intervals = [r["examples_per_sec"] for r in run.metrics()]
    return {"examples_per_sec": s["examples_per_sec"], "steady_examples_per_sec": statistics.median(intervals[1:]),
            "peak_rss_mb_per_worker": max(s["peak_rss_mb_per_worker"]), "threads_per_worker": s["threads_per_worker"]}


def measure(raw: Dict[str, Any], root: str, nprocs: List[int], steps: int, extra: List[str],
            workdir: str) -> Dict[str, Any]:
    """Every figure of one data set: convert, the one-core loaders, training at each of ``nprocs``
    (``extra``: ``--train-override``'s)."""
    row: Dict[str, Any] = convert(raw, root)
    row.update(data_facts(root))
    print(f"  convert: {row['convert_seconds']:.1f} s, peak RSS {row['convert_peak_rss_mb']:.0f} MB; "
          f"{row['distinct_videos']:,} distinct videos", flush=True)
    row["loader"] = {LOADER_KEYS[r, w, read]: loader_one_core(root, r, w, extra, read) for r, w, read in LOADER_RANKS}
    print("  loader on one core: " + ", ".join(f"rank {k}: {v['rows_per_sec']:,.0f} rows/s "
                                                f"({v['rows_per_cpu_second']:,.0f} per CPU second)"
                                                for k, v in row["loader"].items()), flush=True)
    row["train"] = {}
    for n in nprocs:
        row["train"][str(n)] = t = train(root, n, steps, extra, workdir)
        print(f"  train nproc={n}: {t['examples_per_sec']:,.0f} examples/s "
              f"(steady {t['steady_examples_per_sec']:,.0f}), peak RSS per worker {t['peak_rss_mb_per_worker']:.0f} MB",
              flush=True)
    return row
