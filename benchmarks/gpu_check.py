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
6. With ``--artifact MODEL_DIR`` (``python -m recsys_hdet.export``; its inputs and CPU probabilities saved
   beside it by ``--save-inputs DAY_FILE`` where the model was exported): the exported program loaded
   with torch alone, moved to cuda:0, scores the saved rows within 1e-5 of the CPU, and its forward
   throughput (rows/s) on the GPU and on this machine's CPU side by side. Needs no torchrec: it runs
   where steps 2-5 cannot.

Steps 2-5 need torchrec and fbgemm-gpu; without them (step 1b fails) they are not run. Each run writes under ``--work`` (default: a temporary directory); the tiny data set is generated
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
    return f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}, torch {torch.__version__}, " \
           f"CUDA {torch.version.cuda}"


def check_fbgemm() -> str:
    import torch

    import fbgemm_gpu  # noqa: F401
    import torchrec  # noqa: F401

    torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2], device="cuda"))  # a CUDA fbgemm op
    return f"fbgemm_gpu {getattr(fbgemm_gpu, '__version__', '?')}, torchrec {getattr(torchrec, '__version__', '?')}"


INPUTS_FILE = "gpu_check_inputs.pt"  # beside an exported model: rows, their program inputs, CPU probabilities


def save_inputs(model_dir: str, day_file: str, rows: int = 4096) -> str:
    """Writes ``model_dir/gpu_check_inputs.pt``: the program's inputs for the first ``rows`` rows of a
    processed day and the probabilities the program gives for them on this machine's CPU."""
    import polars as pl
    import torch

    from recsys_hdet.serving.manifest import read_manifest
    from recsys_hdet.serving.predict import check_processed, model_inputs

    manifest = read_manifest(model_dir)
    df = pl.read_parquet(day_file).head(rows)
    check_processed(df, day_file, manifest)
    dense, ids, values, offsets = model_inputs(df, manifest)
    program = torch.export.load(os.path.join(model_dir, manifest["program"])).module()
    with torch.no_grad():
        probs = program(dense, ids, values, offsets)
    path = os.path.join(model_dir, INPUTS_FILE)
    torch.save({"dense": dense, "ids": ids, "values": values, "offsets": offsets, "probs": probs,
                "torch": str(torch.__version__)}, path)
    return path


def _rows_per_second(program, args, device: str, seconds: float = 3.0) -> float:
    import time

    import torch

    with torch.no_grad():
        for _ in range(3):
            program(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            program(*args)
            calls += 1
        if device == "cuda":
            torch.cuda.synchronize()
        return calls * args[0].shape[0] / (time.perf_counter() - start)


def check_exported_program(model_dir: str, device: str = "cuda") -> str:
    """Step 6: the exported program on ``device`` against the CPU's probabilities, and its throughput."""
    import torch

    with open(os.path.join(model_dir, "manifest.json")) as f:
        manifest = json.load(f)
    saved = torch.load(os.path.join(model_dir, INPUTS_FILE), weights_only=True)
    program = torch.export.load(os.path.join(model_dir, manifest["program"])).module()
    cpu_args = (saved["dense"], saved["ids"], saved["values"], saved["offsets"])
    cpu_rate = _rows_per_second(program, cpu_args, "cpu")
    with torch.no_grad():
        cpu_here = program(*cpu_args)
    # An exported program is traced for the device of its example inputs (CPU) and asserts it:
    # torch.export's own pass rewrites its constants and device assertions for another device.
    from torch.export.passes import move_to_device_pass

    program = move_to_device_pass(
        torch.export.load(os.path.join(model_dir, manifest["program"])), device).module()
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else [t.to(device) for t in a] for a in cpu_args)
    with torch.no_grad():
        probs = program(*args).cpu()
    err = float((probs - saved["probs"]).abs().max())
    if not err < 1e-5:
        raise RuntimeError(f"cuda probabilities differ from the CPU's ({saved['torch']}) by {err:.2e}")
    gpu_rate = _rows_per_second(program, args, device)
    big = tuple(a.repeat(8, 1) if a.dim() == 2 else a for a in args[:2])
    values = [v.repeat(8) for v in args[2]]
    offsets = [torch.cat([o[:-1] + k * o[-1] for k in range(8)] + [o[-1:] * 8]) for o in args[3]]
    gpu_big = _rows_per_second(program, (*big, values, offsets), device)
    return (f"exported with torch {manifest['torch_version']}, loaded with {torch.__version__}: max |{device} - cpu| "
            f"{err:.1e} over {probs.shape[0]} rows (this CPU vs the exporting CPU: "
            f"{float((cpu_here - saved['probs']).abs().max()):.1e}); forward rows/s: {device} {gpu_rate:,.0f} at batch "
            f"{probs.shape[0]}, {gpu_big:,.0f} at batch {8 * probs.shape[0]}; this machine's CPU "
            f"({torch.get_num_threads()} threads) {cpu_rate:,.0f} at batch {probs.shape[0]}")


def check_batch() -> str:
    import torch
    from torchrec import KeyedJaggedTensor

    from recsys_hdet.components.batch import Batch

    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2], dtype=torch.int32))
    batch = Batch(torch.ones(2, 3), kjt, torch.zeros(2, 1), torch.ones(2, dtype=torch.bool)).pin_memory()
    moved = batch.to(torch.device("cuda", 0), non_blocking=True)
    torch.cuda.synchronize()
    where = {moved.dense.device.type, moved.labels.device.type, moved.mask.device.type, moved.sparse.values().device.type}
    if where != {"cuda"}:
        raise RuntimeError(f"batch tensors on {where}")
    return "dense, KeyedJaggedTensor, labels and mask on cuda:0"


def train(work: str, name: str, nproc: int, *overrides: str) -> str:
    from recsys_hdet.run_dir import RunDir

    run_dir = os.path.join(work, name)
    env = {**os.environ, "RECSYS_HDET_DATA": os.path.join(work, "data"), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}", "data=tiny",
           "trainer.log_every=10", f"trainer.nproc={nproc}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-1500:] or proc.stdout[-1500:]}")
    summary = RunDir(run_dir).summary()
    ne = {t: m["ne"] for t, m in summary.get("eval", {}).items()}
    if summary["status"] != "completed" or not ne or not all(math.isfinite(v) for v in ne.values()):
        raise RuntimeError(f"status {summary['status']}, held-out NE {ne}")
    return f"{summary['steps']} steps, {summary['examples_per_sec']:.0f} ex/s, NE " + \
        " ".join(f"{t}={v:.4f}" for t, v in ne.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", help="where the runs and the tiny data set go (default: a temporary directory)")
    ap.add_argument("--artifact", help="an exported model (recsys_hdet.export) to run on the GPU: step 6")
    ap.add_argument("--save-inputs", metavar="DAY_FILE", help="with --artifact, on the exporting machine: save the "
                    "first 4096 rows of this processed day as the program's inputs with their CPU probabilities, then stop")
    ap.add_argument("--only-artifact", action="store_true", help="run steps 1 and 6 only")
    args = ap.parse_args(argv)
    if args.save_inputs:
        print(f"wrote {save_inputs(args.artifact, args.save_inputs)}")
        return 0
    work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    step("1a CUDA", check_cuda)
    if RESULTS[-1][0] == "FAIL":
        print("no CUDA: the remaining steps are not run")
        return 1
    import torch

    gpus = torch.cuda.device_count()
    if args.artifact:
        step("6 the exported program on cuda:0 (torch alone)", lambda: check_exported_program(args.artifact))
    if not args.only_artifact:
        _training_steps(work, gpus)
    failed = [r for r in RESULTS if r[0] == "FAIL"]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} steps passed or skipped; runs in {work}")
    return 1 if failed else 0


def _training_steps(work: str, gpus: int) -> None:
    step("1b fbgemm's CUDA kernels and torchrec", check_fbgemm)
    if RESULTS[-1][0] == "FAIL":
        print("steps 2-5 need torchrec and fbgemm-gpu: not run")
        return
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


if __name__ == "__main__":
    sys.exit(main())
