"""``python -m benchmarks.run [--quick | --tiny] [--repeats N] [--write]``: the benchmark harness.

In one invocation, on the same model, data and batch size (benchmark data set, 512 examples per
rank, 4 local gloo workers), and interleaved ``--repeats`` times (the order rotates every repeat)
so that drift in machine load hits every contender alike:

- ``torch_reference``: the ranker in plain PyTorch (``benchmarks/torch_reference.py``:
  ``nn.EmbeddingBag`` replicated on every rank, DDP, sparse Adagrad + Adam)
- ``torchrec_ddp``: our pipeline without HDET in TorchRec's standard layout (one sharding group of
  4: the planner shards the tables over all ranks, DDP for the dense part). Every replica takes
  identical updates, which is what alpha = 0 means, and no HDET hook runs at all
- ``hdet_T1000``, ``hdet_T100``: the same with HDET on (conf/hdet/controller.yaml's spread and
  controller, on from the first sync, with the training-loss signal) and converge every 1000 / 100 steps
- ``scaling_1``, ``scaling_2``: ``torchrec_ddp`` on 1 and 2 workers (4 is ``torchrec_ddp`` itself)
- ``checkpoint_every_100``: HDET on a 2 x 2 layout with a periodic checkpoint every 100 steps:
  seconds per checkpoint, its share of training time at the default interval (250 steps of
  ``torchrec_ddp``), and bytes written per byte of model state (every rank's own copy)
- ``hdet_probe_T100``: ``hdet_T100`` with the probe signal (every replica scores the same
  ``hdet.probe_rows`` rows at each sync; the HDET contenders above use the training-loss signal,
  the default controller otherwise); the difference
  in hook time from ``hdet_T100`` per sync is the probe's cost, reported as its share of training
  time at T = 1000 (per-sync cost / 1000 steps of ``torchrec_ddp``)

plus, outside the interleaving, the input pipeline alone (rank 0 of 4's ``ParquetBatchStream``:
rows per second delivered as ready batches, KeyedJaggedTensor included) and the converge step's
time against replicated bytes (``benchmarks/converge.py``).

Throughput is examples per second over the training loop (``RunDir.SUMMARY``'s
``examples_per_sec``: the pass, data loading included, start-up and evaluation excluded). Every
figure in ``results.json`` is a median over the repeats; min..max spreads are kept beside it.
``--write`` records the table in ``BENCHMARKS.md``. ``--tiny`` runs everything on the tiny data
set with 2 workers in about a minute (the smoke test); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List

from benchmarks.recording import REPO, RESULTS, command_line
from benchmarks.run_contenders import (BEFORE, contenders, converge, ensure_data, loader_rows_per_sec,
                                       loader_rows_per_sec_one_core, modes)
from benchmarks.run_results import summarize, table, write_benchmarks_md, write_results


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="one training day, one repeat (a few minutes)")
    group.add_argument("--tiny", action="store_true", help="the tiny data set, 2 workers (smoke test; numbers mean nothing)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: 3 full, 1 quick)")
    ap.add_argument("--out", default=None,
                    help="where results.json goes (default: benchmarks/results.json, the committed figures, for the "
                         "full mode; outputs/benchmarks/results-<mode>.json for --quick and --tiny, so a trial never "
                         "replaces them)")
    ap.add_argument("--write", action="store_true", help="record the table in BENCHMARKS.md")
    ap.add_argument("--before", action="store_true",
                    help="also run torchrec_ddp with the settings the profiling fixes replaced (" + " ".join(BEFORE) + ")")
    args = ap.parse_args(argv)
    args.mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    if args.out is None:
        args.out = RESULTS if args.mode_name == "full" else \
            os.path.join(REPO, "outputs", "benchmarks", f"results-{args.mode_name}.json")
    return args


def interleaved(runs: Dict[str, Callable[[str], Dict[str, Any]]], mode: Dict[str, Any], repeats: int) -> Dict[str, Any]:
    """Every contender ``repeats`` times, the order rotating every repeat, each repeat followed by the input
    pipeline alone and the GEMM peaks; then the converge step. :func:`summarize`'s inputs, by name."""
    from benchmarks import peak
    from recsys_hdet.distributed import usable_cores

    samples: Dict[str, List[Dict[str, Any]]] = {n: [] for n in runs}
    loader: List[float] = []
    loader_one_core: List[float] = []
    peaks: Dict[str, List[Dict[str, Any]]] = {}
    retries: List[str] = []
    names = list(runs)
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: no fixed position
            for name in order:
                try:
                    s = runs[name](workdir)
                except SystemExit as failure:  # one retry (a teardown crash was seen once); a second failure stops the run
                    print(f"[{rep + 1}/{repeats}] {name} failed, retrying once:\n{str(failure)[-1500:]}", flush=True)
                    retries.append(f"{name} (repeat {rep + 1}): {str(failure).splitlines()[0]}")
                    s = runs[name](workdir)
                samples[name].append(s)
                print(f"[{rep + 1}/{repeats}] {name}: {s['examples_per_sec']:,.0f} ex/s, {s['train_seconds']:.1f} s, "
                      f"peak RSS {s['peak_rss_mb']:.0f} MB", flush=True)
            loader.append(loader_rows_per_sec(mode))
            loader_one_core.append(loader_rows_per_sec_one_core(mode))
            print(f"[{rep + 1}/{repeats}] loader: {loader[-1]:,.0f} rows/s; on one core {loader_one_core[-1]:,.0f}", flush=True)
            for threads in sorted({1, usable_cores()}):
                peaks.setdefault(str(threads), []).append(peak.measure("peak", threads))
            print(f"[{rep + 1}/{repeats}] GEMM peak: " + ", ".join(
                f"{t} thread(s) {ps[-1]['gflops']:.1f} GFLOP/s" for t, ps in peaks.items()), flush=True)
        conv = converge(mode, workdir)
    arithmetic = peak.measure("model", usable_cores(), data=mode["data"], batch=mode["batch_size"])
    return {"samples": samples, "loader": loader, "conv": conv, "peaks": peaks, "arithmetic": arithmetic,
            "loader_one_core": loader_one_core, "retries": retries}


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = modes()[args.mode_name]
    repeats = args.repeats or mode["repeats"]
    command = command_line("benchmarks.run", argv)
    ensure_data(mode)
    m = interleaved(contenders(mode, args.before), mode, repeats)
    result = summarize(m["samples"], m["loader"], m["conv"], args.mode_name, mode, command, m["peaks"],
                       m["arithmetic"], m["loader_one_core"])
    result["retried_after_failure"] = m["retries"]
    body = table(result)
    print("\n" + body)
    write_results(result, args.out)
    print(f"\nwrote {args.out}")
    if args.write:
        write_benchmarks_md(result, body)
        print("recorded the table in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
