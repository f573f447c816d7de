"""``python -m benchmarks.checkpoint_stall [--quick | --tiny] [--repeats N]``: the periodic
checkpoint's stall, synchronous against DCP's async_save, side by side.

Both contenders are ``benchmarks.run``'s ``checkpoint_every_100`` (HDET on a 2 x 2 layout, every
rank writing its own state, a checkpoint every 100 steps; 10 in ``--tiny``), one with
``trainer.periodic_checkpoint.async_save=true``; runs interleaved, ``--repeats`` times. The stall is
the time the training loop spends in ``CheckpointManager.save`` per checkpoint (rank 0: the
synchronous write and publish, or async_save's copy into memory plus publishing the previous one),
from ``RunDir.SUMMARY``'s ``periodic_checkpoints``; also the examples per second of the pass. Prints
a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.processes import check
from benchmarks.recording import REPO
from benchmarks.run_contenders import modes, pipeline_overrides


def run_once(mode, async_save: bool, workdir: str):
    from recsys_hdet.run_dir import RunDir

    n = mode["nproc"]
    run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}", *pipeline_overrides(mode, n),
           "hdet=controller", "hdet.controller_start=0", "hdet.sync_every=100", f"trainer.sharding_group_size={max(1, n // 2)}",
           f"trainer.periodic_checkpoint.every_steps={mode.get('checkpoint_every', 100)}",
           f"trainer.periodic_checkpoint.async_save={str(async_save).lower()}"]
    check(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True), cmd)
    s = RunDir(run_dir).summary()
    c = s["periodic_checkpoints"]
    return {"seconds_per_checkpoint": c["seconds"] / max(c["saved"], 1), "saved": c["saved"],
            "examples_per_sec": s["examples_per_sec"], "step_seconds": s["train_seconds"] / s["steps"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_stall", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--tiny", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    mode = modes()["tiny" if args.tiny else "quick" if args.quick else "full"]
    samples = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.repeats):
            for name in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                res = run_once(mode, name == "async", workdir)
                samples[name].append(res)
                print(f"[{r + 1}/{args.repeats}] {name}: {res['seconds_per_checkpoint']:.3f} s per checkpoint "
                      f"({res['saved']} saved), {res['examples_per_sec']:,.0f} ex/s", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("seconds_per_checkpoint", "examples_per_sec", "step_seconds")}
           for k, v in samples.items()}
    print("\n| checkpoint write | stall per checkpoint (median) | share of training at every 250 steps | examples/s |")
    print("|---|---|---|---|")
    for k in ("sync", "async"):
        share = med[k]["seconds_per_checkpoint"] / (250 * med["sync"]["step_seconds"])
        print(f"| {k} | {med[k]['seconds_per_checkpoint']:.3f} s | {share * 100:.2f}% | {med[k]['examples_per_sec']:,.0f} |")
    print(f"\nasync / sync stall: {med['async']['seconds_per_checkpoint'] / med['sync']['seconds_per_checkpoint']:.2f}x "
          f"({args.repeats} interleaved repeats, {mode['data']} data)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
