"""``python -m benchmarks.peak [--threads N] [--data bench]``: the machine's practical GEMM peak and
the model's arithmetic, measured in the same run as the throughput they are compared with.

Speed on these machines changes from day to day (a 2-thread GEMM peak of 138 GFLOP/s one day,
220-265 another), so a throughput figure means little alone: ``benchmarks/run.py`` divides the
trainer's FLOP rate by the peak measured minutes before on the same machine.

- ``gemm_peak(threads)``: large square float32 GEMMs (n = 1024, 1536, 2048), best of several
  repetitions each, at ``threads`` intra-op threads: the practical peak, GFLOP/s;
- ``model_arithmetic(data, batch)``: the model's FLOPs per training example (forward and backward
  of one batch, counted by ``torch.utils.flop_counter.FlopCounterMode``: the dense towers,
  attention and the GEMMs; the embedding lookups are memory-bound and count nothing), and the
  model's own GEMM shapes from that pass, each timed at ``threads`` threads (GFLOP/s beside the
  peak: small GEMMs reach a fraction of it).

Each measurement runs in a fresh subprocess so its thread count is its own (``--threads``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK_SIZES = (1024, 1536, 2048)


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (allocation, thread pool)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _gemm_peak(threads: int) -> Dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    by_size = {}
    for n in PEAK_SIZES:
        a, b = torch.randn(n, n), torch.randn(n, n)
        seconds = _best_seconds(lambda: torch.mm(a, b), repeats=5)
        by_size[str(n)] = 2 * n ** 3 / seconds / 1e9
    return {"threads": threads, "gflops": max(by_size.values()), "by_size": by_size}


def _model_arithmetic(data: str, batch: int, threads: int) -> Dict[str, Any]:
    import torch
    from recsys_hdet.config import compose
    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, split_for
    from recsys_hdet.components.dataloader import ParquetBatchStream
    from recsys_hdet.models.ranker import build_model
    from recsys_hdet.job_inputs import prepare_data

    torch.set_num_threads(threads)
    cfg = compose("config", [f"data={data}"])
    root = prepare_data(cfg)
    meta = DatasetMeta.load(root if isinstance(root, str) else cfg.data.root)
    train_days, _ = split_for(meta, cfg.data)
    stream = ParquetBatchStream(meta, train_days[:1], batch, 0, 1, seed=0,
                                normalization=DenseNormalization.from_days(meta, train_days))
    example = next(iter(stream))
    torch.manual_seed(0)
    model = build_model(cfg, meta, device="cpu")
    model.train()

    shapes: Counter = Counter()

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm"):
                a, b = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
                shapes[(int(a.shape[0]), int(a.shape[1]), int(b.shape[1]))] += 1
            return func(*args, **(kwargs or {}))

    counter = FlopCounterMode(display=False)
    with counter, Shapes():
        logits = model(example.dense, example.sparse)
        logits.sum().backward()
    flops = counter.get_total_flops()
    gemms = []
    for (m, k, n), count in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2] * kv[1]):
        a, b = torch.randn(m, k), torch.randn(k, n)
        seconds = _best_seconds(lambda: torch.mm(a, b), repeats=20)
        gemms.append({"m": m, "k": k, "n": n, "calls_per_step": count, "gflops": 2 * m * k * n / seconds / 1e9})
    return {"flops_per_example": flops / batch, "batch": batch, "threads": threads, "gemm_shapes": gemms}


def measure(what: str, threads: int, **kwargs: Any) -> Dict[str, Any]:
    """``what`` ("peak" or "model") measured in a fresh subprocess at ``threads`` threads."""
    cmd = [sys.executable, "-m", "benchmarks.peak", "--what", what, "--threads", str(threads), "--json",
           *(f"--{k}={v}" for k, v in kwargs.items())]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=("peak", "model", "both"), default="both")
    ap.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0))))
    ap.add_argument("--data", default="bench")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json", action="store_true", help="one JSON line (what benchmarks/run.py reads)")
    args = ap.parse_args(argv)
    out: Dict[str, Any] = {}
    if args.what in ("peak", "both"):
        out["peak"] = _gemm_peak(args.threads)
    if args.what in ("model", "both"):
        out["model"] = _model_arithmetic(args.data, args.batch, args.threads)
    if args.json:
        print(json.dumps(out.get("peak") if args.what == "peak" else out.get("model") if args.what == "model" else out))
        return 0
    if "peak" in out:
        p = out["peak"]
        print(f"GEMM peak at {p['threads']} thread(s): {p['gflops']:.1f} GFLOP/s ("
              + ", ".join(f"n={n}: {g:.1f}" for n, g in p["by_size"].items()) + ")")
    if "model" in out:
        m = out["model"]
        print(f"model: {m['flops_per_example'] / 1e6:.3f} MFLOP per training example (forward + backward, batch {m['batch']})")
        print("| GEMM (m x k x n) | calls per step | GFLOP/s |\n|---|---:|---:|")
        for g in m["gemm_shapes"]:
            print(f"| {g['m']} x {g['k']} x {g['n']} | {g['calls_per_step']} | {g['gflops']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
