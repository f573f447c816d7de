"""What :mod:`benchmarks.run` measures: its modes (the data set, workers, batch size and repeats of
``full``, ``quick`` and ``tiny``), the training command's overrides in them (which
:mod:`benchmarks.train_loop` and :mod:`benchmarks.checkpoint_stall` reuse), the contenders (each a
function of a work directory returning one run's figures), and the measurements outside the
interleaving: the input pipeline alone and the converge step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

from benchmarks.processes import check, run_checked
from benchmarks.recording import REPO


def modes() -> Dict[str, Dict[str, Any]]:
    return {
        # ~1M examples per run (4 of the 8 training days): ~45 s of training per pipeline run.
        "full": {"data": "bench", "train_days": 4, "nproc": 4, "batch_size": 512, "repeats": 3,
                 "converge_sizes": [1, 4, 16, 64]},
        "quick": {"data": "bench", "train_days": 1, "nproc": 4, "batch_size": 512, "repeats": 1,
                  "converge_sizes": [1, 4, 16]},
        "tiny": {"data": "tiny", "train_days": None, "nproc": 2, "batch_size": 256, "repeats": 1,
                 "converge_sizes": [0.25, 1], "checkpoint_every": 10, "log_every": 10},
    }


def data_root(data: str) -> str:
    return os.path.join(os.environ.get("RECSYS_HDET_DATA", os.path.join(REPO, ".cache", "data")), data)


def ensure_data(mode: Dict[str, Any]) -> None:
    """Make sure the data set exists before timing anything (generated on first use, like training)."""
    subprocess.run([sys.executable, "-c", "from recsys_hdet.config import compose\n"
                    "from recsys_hdet.job_inputs import prepare_data\n"
                    f"prepare_data(compose('config', ['data={mode['data']}']))"],
                   cwd=REPO, check=True)


def pipeline_overrides(mode: Dict[str, Any], nproc: int) -> List[str]:
    o = ["+experiment=baseline_low", f"data={mode['data']}", f"data.batch_size={mode['batch_size']}",
         f"trainer.nproc={nproc}", f"trainer.sharding_group_size={nproc}", "trainer.checkpoint=false",
         # a periodic checkpoint falls on a divergence check (rollback): log_every divides checkpoint_every
         f"trainer.log_every={mode.get('log_every', 100)}", "trainer.periodic_checkpoint.every_steps=0",
         "trainer.tensorboard=false"]
    if mode["data"] == "bench":
        o.append("data.skip_days=2")
    if mode["train_days"] is not None:
        o.append(f"data.train_days={mode['train_days']}")
    return o


# The settings the profiling fixes replaced (BENCHMARKS.md, "Profiling"): measured side by side
# as torchrec_ddp_before with --before.
BEFORE = ["model.sharding_types=[table_wise,column_wise]", "optim.dense.fused=false"]


def contenders(mode: Dict[str, Any], before: bool = False) -> Dict[str, Callable[[str], Dict[str, Any]]]:
    n = mode["nproc"]

    def pipeline(extra: List[str], nproc: int = n):
        def run(workdir: str) -> Dict[str, Any]:
            from recsys_hdet.run_dir import RunDir

            run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
            cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}",
                   *pipeline_overrides(mode, nproc), *extra]
            run_checked(cmd)
            s = RunDir(run_dir).summary()
            return {"examples_per_sec": s["examples_per_sec"], "train_seconds": s["train_seconds"],
                    "steps": s["steps"], "peak_rss_mb": s["peak_rss_mb"],
                    "peak_rss_mb_per_worker": s.get("peak_rss_mb_per_worker"),
                    "hdet_hook_seconds": s.get("hdet", {}).get("seconds"), "syncs": s.get("hdet", {}).get("syncs"),
                    "train_loss": s["train_loss"]["avg"],
                    "data_wait_fraction": s.get("data_wait_fraction"),
                    "checkpoints": s.get("periodic_checkpoints")}
        return run

    def reference(workdir: str) -> Dict[str, Any]:
        out = os.path.join(workdir, f"ref_{time.time_ns()}.json")
        cmd = [sys.executable, "-m", "benchmarks.torch_reference", "--data", data_root(mode["data"]),
               "--nproc", str(n), "--batch-size", str(mode["batch_size"]), "--out", out,
               "--skip-days", "2" if mode["data"] == "bench" else "0"]
        if mode["train_days"] is not None:
            cmd += ["--train-days", str(mode["train_days"])]
        run_checked(cmd)
        with open(out) as f:
            r = json.load(f)
        r["train_loss"] = r.pop("train_loss_avg")
        return r

    # The engine's own cost is measured with the training-loss signal (no probe); hdet_probe_T100 is the
    # same with the default probe signal, so their difference in hook time is the probe's cost.
    hdet = ["hdet=controller", "hdet.controller_start=0", "hdet.signal=train"]
    runs: Dict[str, Callable[[str], Dict[str, Any]]] = {
        "torch_reference": reference,
        "torchrec_ddp": pipeline([]),
        "hdet_T1000": pipeline([*hdet, "hdet.sync_every=1000"]),
        "hdet_T100": pipeline([*hdet, "hdet.sync_every=100"]),
        "hdet_probe_T100": pipeline([*hdet, "hdet.sync_every=100", "hdet.signal=probe"]),
    }
    # The periodic checkpoint's stall and size: torchrec_ddp with HDET's 2 x 2 replicas (every rank
    # writes its own state), a checkpoint every 100 steps.
    runs["checkpoint_every_100"] = pipeline([*hdet, "hdet.sync_every=100", f"trainer.sharding_group_size={max(1, n // 2)}",
                                             f"trainer.periodic_checkpoint.every_steps={mode.get('checkpoint_every', 100)}"])
    for k in (1, 2):
        if k < n:
            runs[f"scaling_{k}"] = pipeline([], nproc=k)
    # One worker with one thread beside scaling_1's default (the usable cores: two here).
    runs["scaling_1_1thread"] = pipeline(["trainer.threads_per_worker=1"], nproc=1)
    if before:
        runs["torchrec_ddp_before"] = pipeline(BEFORE)
    return runs


def loader_rows_per_sec(mode: Dict[str, Any]) -> float:
    """Rank 0 of ``nproc``'s training stream over the same days: rows delivered per second."""
    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_days
    from recsys_hdet.components.dataloader import ParquetBatchStream

    meta = DatasetMeta.load(data_root(mode["data"]))
    skip = 2 if mode["data"] == "bench" else 0
    days, _ = split_days(meta, 1, mode["train_days"], skip)
    stream = ParquetBatchStream(meta, days, mode["batch_size"], 0, mode["nproc"], 0, shuffle_within_day=True,
                                normalization=DenseNormalization.from_days(meta, days))
    start = time.perf_counter()
    rows = sum(b.labels.shape[0] for b in stream)
    return rows / (time.perf_counter() - start)


def loader_rows_per_sec_one_core(mode: Dict[str, Any]) -> float:
    """:func:`loader_rows_per_sec` in a subprocess pinned to one core with one thread (the day reader
    thread shares that core)."""
    code = ("import os, json, sys\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\nimport torch\n"
            "torch.set_num_threads(1)\nfrom benchmarks.run_contenders import loader_rows_per_sec\n"
            "print(loader_rows_per_sec(json.loads(sys.argv[1])))")
    cmd = [sys.executable, "-c", code, json.dumps(mode)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    check(proc, cmd[:2])
    return float(proc.stdout.strip().splitlines()[-1])


def converge(mode: Dict[str, Any], workdir: str) -> Dict[str, Any]:
    out = os.path.join(workdir, "converge.json")
    cmd = [sys.executable, "-m", "benchmarks.converge", "--nproc", str(mode["nproc"]), "--out", out,
           "--sizes", *map(str, mode["converge_sizes"])]
    run_checked(cmd)
    with open(out) as f:
        return json.load(f)
