"""``python -m benchmarks.gpu_check``: does the CUDA path work on this machine? Prints PASS, FAIL or
SKIP per step and exits 1 if any step failed. Tests never need a GPU; run this where one is.

Steps:
1. CUDA: torch sees a GPU, and fbgemm's CUDA embedding kernels load (the fbgemm-gpu package, not
   fbgemm-gpu-cpu: ``make setup`` picks it where ``nvidia-smi`` lists a GPU).
2. A Batch (dense, KeyedJaggedTensor, labels) moved to the GPU the way the train pipeline moves it.
3. A 1-process training run on the tiny data set (cuda:0, nccl, TrainPipelineSparseDist): exit 0,
   status completed, a finite held-out NE per task.
4. The same run under HDET with the serving signal and a periodic checkpoint (the served loss, the
   sync, a checkpoint write of GPU tensors).
5. A 2-process nccl run (plain, then HDET with two sharding groups of one): needs 2 GPUs, else SKIP.

Each run writes under ``--work`` (default: a temporary directory); the tiny data set is generated
there on first use (about a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Callable, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS: List[Tuple[str, str, str]] = []


def step(name: str, fn: Callable[[], str]) -> None:
    try:
        detail = fn() or ""
        outcome = "SKIP" if detail.startswith("SKIP") else "PASS"
    except Exception as e:  # a failed check is reported, and the next one still runs
        outcome, detail = "FAIL", f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    RESULTS.append((outcome, name, detail))
    print(f"{outcome:4}  {name}  {detail}", flush=True)


def check_cuda() -> str:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    import fbgemm_gpu  # noqa: F401

    torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2], device="cuda"))  # a CUDA fbgemm op
    return f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}, torch {torch.__version__}"


def check_batch() -> str:
    import torch
    from torchrec import KeyedJaggedTensor

    from recsys_hdet.components.dataloader import Batch

    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2], dtype=torch.int32))
    batch = Batch(torch.ones(2, 3), kjt, torch.zeros(2, 1), torch.ones(2, dtype=torch.bool)).pin_memory()
    moved = batch.to(torch.device("cuda", 0), non_blocking=True)
    torch.cuda.synchronize()
    where = {moved.dense.device.type, moved.labels.device.type, moved.mask.device.type, moved.sparse.values().device.type}
    if where != {"cuda"}:
        raise RuntimeError(f"batch tensors on {where}")
    return "dense, KeyedJaggedTensor, labels and mask on cuda:0"


def train(work: str, name: str, nproc: int, *overrides: str) -> str:
    run_dir = os.path.join(work, name)
    env = {**os.environ, "RECSYS_HDET_DATA": os.path.join(work, "data"), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"hydra.run.dir={run_dir}", "data=tiny",
           "trainer.log_every=10", f"trainer.nproc={nproc}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-1500:] or proc.stdout[-1500:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    ne = {t: m["ne"] for t, m in summary.get("eval", {}).items()}
    if summary["status"] != "completed" or not ne or not all(math.isfinite(v) for v in ne.values()):
        raise RuntimeError(f"status {summary['status']}, held-out NE {ne}")
    return f"{summary['steps']} steps, {summary['examples_per_sec']:.0f} ex/s, NE " + \
        " ".join(f"{t}={v:.4f}" for t, v in ne.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", help="where the runs and the tiny data set go (default: a temporary directory)")
    args = ap.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    step("1 CUDA and fbgemm's CUDA kernels", check_cuda)
    if RESULTS[-1][0] == "FAIL":
        print("no CUDA: the remaining steps are not run")
        return 1
    import torch

    gpus = torch.cuda.device_count()
    step("2 a Pipelineable batch to the GPU", check_batch)
    step("3 1-process run (nccl, TrainPipelineSparseDist)",
         lambda: train(work, "one", 1, "trainer.sharding_group_size=1"))
    step("4 1-process HDET run (serving signal, periodic checkpoint)",
         lambda: train(work, "one_hdet", 1, "trainer.sharding_group_size=1", "hdet=enabled", "hdet.alpha=0.2",
                       "hdet.sync_every=4", "hdet.signal=serving", "trainer.periodic_checkpoint.every_steps=20"))
    two = (lambda: train(work, "two", 2, "trainer.sharding_group_size=2")) if gpus >= 2 else \
        (lambda: f"SKIP: {gpus} GPU (nccl needs one per rank)")
    step("5a 2-process nccl run (one sharding group)", two)
    two_hdet = (lambda: train(work, "two_hdet", 2, "trainer.sharding_group_size=1", "hdet=enabled", "hdet.alpha=0.2",
                              "hdet.sync_every=4")) if gpus >= 2 else (lambda: f"SKIP: {gpus} GPU")
    step("5b 2-process nccl HDET run (two embedding replicas)", two_hdet)
    failed = [r for r in RESULTS if r[0] == "FAIL"]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} steps passed or skipped; runs in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
