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
7. With ``--artifact`` exported with ``raw_program=true``: the raw-feature program (``raw_model.pt2``) the
   same way, on the raw request saved beside it by ``--save-raw-inputs LOG USERS VIDEOS`` where it was
   exported (KuaiRand-schema files, made into a request by :mod:`recsys_hdet.serving.raw_request`) with
   its CPU probabilities. SKIP when the artifact has no raw program.

Steps 6 and 7 read the artifact and the saved tensors with torch alone (no torchrec, fbgemm-gpu, polars,
pyarrow or project import): the saved files are plain ``torch.save`` dicts of tensors. ``--device cpu``
runs them on this machine's CPU instead (a dry run on the exporting machine: it checks that the saved
files load and the moved programs run, not CUDA). The rows/s are the program's forward on inputs already
on the device (no host-to-device copy, no request batching), synchronized: not a serving latency.

Steps 2-5 need torchrec and fbgemm-gpu; without them (step 1b fails) they are not run. Each run writes under
``--work`` (default: a temporary directory); the tiny data set is generated there on first use (about a minute).
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
RAW_INPUTS_FILE = "gpu_check_raw_inputs.pt"  # beside it too: a raw request and the raw program's CPU probabilities


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


def save_raw_inputs(model_dir: str, log: str, users: str, videos: str, rows: int = 4096) -> str:
    """Writes ``model_dir/gpu_check_raw_inputs.pt``: the raw program's request for the first ``rows`` rows of
    a raw KuaiRand-schema log dated the artifact's last held-out day (the log's first rows when it has none
    of that day), with the user and video feature files joined (:func:`recsys_hdet.serving.raw_request.raw_request`),
    and the probabilities the raw program gives for it on this machine's CPU."""
    import polars as pl
    import torch

    from recsys_hdet.serving.manifest import read_manifest
    from recsys_hdet.serving.raw_request import raw_request

    manifest = read_manifest(model_dir)
    if "raw_program" not in manifest:
        raise ValueError(f"{model_dir}: no raw program (export it with raw_program=true)")
    df = pl.read_csv(log, infer_schema=False)
    held_out = df.filter(pl.col("date") == manifest["eval_days"][-1]) if manifest.get("eval_days") else df.clear()
    request, _ = raw_request((held_out if held_out.height else df).head(rows), users, videos, manifest)
    program = torch.export.load(os.path.join(model_dir, manifest["raw_program"]["file"])).module()
    with torch.no_grad():
        probs = program(request)
    path = os.path.join(model_dir, RAW_INPUTS_FILE)
    torch.save({"request": request, "probs": probs, "torch": str(torch.__version__)}, path)
    return path


def _rows_per_second(program, args, device: str, rows: int, seconds: float = 3.0) -> float:
    """Calls of ``program(*args)`` for ``seconds`` after 3 warm-up calls, times ``rows``, per second;
    synchronized on CUDA."""
    import time

    import torch

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    with torch.no_grad():
        for _ in range(3):
            program(*args)
        sync()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            program(*args)
            calls += 1
        sync()
        return calls * rows / (time.perf_counter() - start)


def _on_device(model_dir: str, file: str, device: str):
    """The exported program in ``file`` moved to ``device``. An exported program is traced for the device of
    its example inputs (CPU) and asserts it; ``.module().to(device)`` does not rewrite that, torch.export's
    own pass rewrites its constants and device assertions."""
    import torch
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(torch.export.load(os.path.join(model_dir, file)), device).module()


def check_exported_program(model_dir: str, device: str = "cuda", seconds: float = 3.0) -> str:
    """Step 6: the exported program on ``device`` against the CPU's probabilities, and its throughput."""
    import torch

    with open(os.path.join(model_dir, "manifest.json")) as f:
        manifest = json.load(f)
    saved = torch.load(os.path.join(model_dir, INPUTS_FILE), weights_only=True)
    program = torch.export.load(os.path.join(model_dir, manifest["program"])).module()
    cpu_args = (saved["dense"], saved["ids"], saved["values"], saved["offsets"])
    rows = saved["dense"].shape[0]
    cpu_rate = _rows_per_second(program, cpu_args, "cpu", rows, seconds)
    with torch.no_grad():
        cpu_here = program(*cpu_args)
    program = _on_device(model_dir, manifest["program"], device)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else [t.to(device) for t in a] for a in cpu_args)
    with torch.no_grad():
        probs = program(*args).cpu()
    err = float((probs - saved["probs"]).abs().max())
    if not err < 1e-5:
        raise RuntimeError(f"{device} probabilities differ from the CPU's ({saved['torch']}) by {err:.2e}")
    gpu_rate = _rows_per_second(program, args, device, rows, seconds)
    big = tuple(a.repeat(8, 1) if a.dim() == 2 else a for a in args[:2])
    values = [v.repeat(8) for v in args[2]]
    offsets = [_repeat_offsets(o, 8) for o in args[3]]
    gpu_big = _rows_per_second(program, (*big, values, offsets), device, 8 * rows, seconds)
    return (f"exported with torch {manifest['torch_version']}, loaded with {torch.__version__}: max |{device} - cpu| "
            f"{err:.1e} over {probs.shape[0]} rows (this CPU vs the exporting CPU: "
            f"{float((cpu_here - saved['probs']).abs().max()):.1e}); forward rows/s: {device} {gpu_rate:,.0f} at batch "
            f"{probs.shape[0]}, {gpu_big:,.0f} at batch {8 * probs.shape[0]}; this machine's CPU "
            f"({torch.get_num_threads()} threads) {cpu_rate:,.0f} at batch {probs.shape[0]}")


def _repeat_offsets(offsets, k: int):
    """The offsets of a list feature's values repeated ``k`` times (``values.repeat(k)``)."""
    import torch

    return torch.cat([offsets[:-1] + i * offsets[-1] for i in range(k)] + [offsets[-1:] * k])


def check_raw_program(model_dir: str, device: str = "cuda", seconds: float = 3.0) -> str:
    """Step 7: the raw-feature program (``raw_model.pt2``) on ``device`` against the exporting CPU's
    probabilities for the saved raw request (``--save-raw-inputs``), within 1e-5, and its forward rows/s at
    the request's size and 8 times it (each input repeated as the manifest's shapes say), with this
    machine's CPU side by side. SKIP when the artifact has no raw program."""
    import torch

    with open(os.path.join(model_dir, "manifest.json")) as f:
        manifest = json.load(f)
    spec = manifest.get("raw_program")
    if not spec or not os.path.isfile(os.path.join(model_dir, spec["file"])):
        return f"SKIP: {model_dir} has no raw program (raw_model.pt2: exported with raw_program=true)"
    path = os.path.join(model_dir, RAW_INPUTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no saved raw request (gpu_check --save-raw-inputs, where it was exported)")
    saved = torch.load(path, weights_only=True)
    request, rows = saved["request"], saved["probs"].shape[0]
    program = torch.export.load(os.path.join(model_dir, spec["file"])).module()
    cpu_rate = _rows_per_second(program, (request,), "cpu", rows, seconds)
    with torch.no_grad():
        cpu_here = program(request)
    program = _on_device(model_dir, spec["file"], device)
    moved = {name: t.to(device) for name, t in request.items()}
    with torch.no_grad():
        probs = program(moved).cpu()
    err = float((probs - saved["probs"]).abs().max())
    if not err < 1e-5:
        raise RuntimeError(f"{device} probabilities differ from the CPU's ({saved['torch']}) by {err:.2e}")
    rate = _rows_per_second(program, (moved,), device, rows, seconds)
    shapes = {name: spec["inputs"][name]["shape"] for name in moved}
    big = {name: _repeat_offsets(t, 8) if shapes[name] == "[B+1]" else t.repeat(8) for name, t in moved.items()}
    rate_big = _rows_per_second(program, (big,), device, 8 * rows, seconds)
    return (f"exported with torch {manifest['torch_version']}, loaded with {torch.__version__}: max |{device} - cpu| "
            f"{err:.1e} over {rows} rows x {probs.shape[1]} tasks (this CPU vs the exporting CPU: "
            f"{float((cpu_here - saved['probs']).abs().max()):.1e}); forward rows/s: {device} {rate:,.0f} at batch "
            f"{rows}, {rate_big:,.0f} at batch {8 * rows}; this machine's CPU ({torch.get_num_threads()} threads) "
            f"{cpu_rate:,.0f} at batch {rows}")


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
    ap.add_argument("--artifact", help="an exported model (recsys_hdet.export) to run on the GPU: steps 6 and 7")
    ap.add_argument("--save-inputs", metavar="DAY_FILE", help="with --artifact, on the exporting machine: save the "
                    "first 4096 rows of this processed day as the program's inputs with their CPU probabilities, then stop")
    ap.add_argument("--save-raw-inputs", nargs=3, metavar=("LOG", "USERS", "VIDEOS"),
                    help="with --artifact (raw_program=true), on the exporting machine: save a raw request of 4096 "
                    "rows of this KuaiRand-schema log (its held-out day's) and feature files with the raw program's "
                    "CPU probabilities, then stop")
    ap.add_argument("--only-artifact", action="store_true", help="run steps 1, 6 and 7 only")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where steps 6 and 7 run; cpu: a dry run of them here (steps 1-5 not run)")
    args = ap.parse_args(argv)
    if args.save_inputs or args.save_raw_inputs:
        if not args.artifact:
            ap.error("--save-inputs and --save-raw-inputs need --artifact")
        if args.save_inputs:
            print(f"wrote {save_inputs(args.artifact, args.save_inputs)}")
        if args.save_raw_inputs:
            print(f"wrote {save_raw_inputs(args.artifact, *args.save_raw_inputs)}")
        return 0
    if args.device == "cpu" and not args.artifact:
        ap.error("--device cpu runs steps 6 and 7 only: it needs --artifact")
    work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    if args.device == "cpu":
        step("1a CUDA", lambda: "SKIP: --device cpu, a dry run of steps 6 and 7 on this machine's CPU")
    else:
        step("1a CUDA", check_cuda)
        if RESULTS[-1][0] == "FAIL":
            print("no CUDA: the remaining steps are not run")
            return 1
    where = "cuda:0" if args.device == "cuda" else "cpu"
    if args.artifact:
        step(f"6 the exported program on {where} (torch alone)",
             lambda: check_exported_program(args.artifact, args.device))
        step(f"7 the raw-feature program on {where} (torch alone)",
             lambda: check_raw_program(args.artifact, args.device))
    if not args.only_artifact and args.device == "cuda":
        import torch

        _training_steps(work, torch.cuda.device_count())
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
         lambda: train(work, "one_hdet", 1, "trainer.sharding_group_size=1", "hdet=controller", "hdet.alpha=0.2",
                       "hdet.sync_every=4", "hdet.signal=serving", "trainer.periodic_checkpoint.every_steps=20"))
    two = (lambda: train(work, "two", 2, "trainer.sharding_group_size=2")) if gpus >= 2 else \
        (lambda: f"SKIP: {gpus} GPU (nccl needs one per rank)")
    step("5a 2-process nccl run (one sharding group)", two)
    two_hdet = (lambda: train(work, "two_hdet", 2, "trainer.sharding_group_size=1", "hdet=controller", "hdet.alpha=0.2",
                              "hdet.sync_every=4")) if gpus >= 2 else (lambda: f"SKIP: {gpus} GPU")
    step("5b 2-process nccl HDET run (two embedding replicas)", two_hdet)


if __name__ == "__main__":
    sys.exit(main())
