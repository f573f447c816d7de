"""``python -m benchmarks.train_loop [--quick | --tiny] [--repeats N] [--baseline-rev REV] [--write]``:
the training loop's step time on TorchRec's train pipelines against the loop they replaced.

Contenders, each a plain run (no HDET) of ``benchmarks/run.py``'s setup (benchmark data set, 4 local
gloo workers, 512 examples per rank per step, one sharding group), interleaved ``--repeats`` times
with the order rotating every repeat:

- ``loop_before``: the code at ``--baseline-rev`` (default dd515aa: the trainer before the loop was
  rewritten, with HDET inside ``Trainer``, no pipeline and no device copy), checked out into a
  temporary git worktree and run with the same command;
- ``base``: ``trainer.train_pipeline=base`` (TorchRec's TrainPipelineBase: the copy to the device);
- ``sparse_dist``: the default, TrainPipelineSparseDist (the input all-to-all a batch ahead).

Figures are ``RunDir.SUMMARY``'s ``examples_per_sec`` (the pass, data loading included), as step time
in milliseconds, medians over the repeats with min..max, and each one's ratio to ``loop_before``.
The three train the same numbers (the loop's arithmetic is unchanged; tests check the pipelines
against each other): the final train loss is printed beside them as a check.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.processes import check
from benchmarks.recording import REPO, replace_benchmarks_section
from benchmarks.run_contenders import ensure_data, modes, pipeline_overrides

BASELINE_REV = "dd515aa"
HEADING = "## Training loop: TorchRec train pipelines against the loop before them (benchmarks/train_loop.py)"


def run_once(tree: str, mode: Dict[str, Any], workdir: str, extra: List[str]) -> Dict[str, Any]:
    from recsys_hdet.run_dir import RunDir

    run_dir = os.path.join(workdir, f"run_{time.time_ns()}")
    # the baseline's code predates run_dir= (issue 47) and spells the run directory as Hydra does
    spelled = f"run_dir={run_dir}" if tree == REPO else f"hydra.run.dir={run_dir}"
    cmd = [sys.executable, "-m", "recsys_hdet.train", spelled,
           *pipeline_overrides(mode, mode["nproc"]), *extra]
    env = {**os.environ, "RECSYS_HDET_DATA": os.environ.get("RECSYS_HDET_DATA", os.path.join(REPO, ".cache", "data"))}
    check(subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env), cmd)
    s = RunDir(run_dir).summary()
    return {"examples_per_sec": s["examples_per_sec"], "steps": s["steps"], "train_loss": s["train_loss"]["avg"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--tiny", action="store_true")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--write", action="store_true", help="record the table in BENCHMARKS.md")
    args = ap.parse_args(argv)
    mode = modes()["tiny" if args.tiny else "quick" if args.quick else "full"]
    repeats = args.repeats or mode["repeats"]
    ensure_data(mode)
    workdir = tempfile.mkdtemp(prefix="bench_loop_")
    baseline = os.path.join(workdir, "baseline")
    subprocess.run(["git", "worktree", "add", "--detach", baseline, args.baseline_rev], cwd=REPO, check=True,
                   capture_output=True)
    os.symlink(os.path.join(REPO, ".venv"), os.path.join(baseline, ".venv"))
    contenders = {"loop_before": (baseline, []), "base": (REPO, ["trainer.train_pipeline=base"]),
                  "sparse_dist": (REPO, ["trainer.train_pipeline=sparse_dist"])}
    samples: Dict[str, List[Dict[str, Any]]] = {name: [] for name in contenders}
    try:
        names = list(contenders)
        for rep in range(repeats):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                tree, extra = contenders[name]
                samples[name].append(run_once(tree, mode, workdir, extra))
                print(f"repeat {rep + 1}/{repeats} {name}: {samples[name][-1]['examples_per_sec']:.0f} ex/s", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", baseline], cwd=REPO, capture_output=True)
    per_step = mode["batch_size"] * mode["nproc"]
    rows = {}
    for name, runs in samples.items():
        ms = [1000.0 * per_step / r["examples_per_sec"] for r in runs]
        rows[name] = {"step_ms": statistics.median(ms), "min": min(ms), "max": max(ms),
                      "train_loss": runs[0]["train_loss"], "steps": runs[0]["steps"]}
    before = rows["loop_before"]["step_ms"]
    lines = ["| loop | step time, ms (median) | min..max | vs loop_before | final train loss |",
             "|---|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['step_ms']:.2f} | {r['min']:.2f}..{r['max']:.2f} | "
                     f"{r['step_ms'] / before:.3f} | {r['train_loss']:.6f} |")
    body = "\n".join(lines)
    command = "python -m benchmarks.train_loop" + (" --tiny" if args.tiny else " --quick" if args.quick else "") + \
        (f" --repeats {args.repeats}" if args.repeats else "")
    print(body)
    if args.write:
        replace_benchmarks_section(HEADING, (
            f"{HEADING}\n\n`{command}` on {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPU "
            f"cores; {repeats} interleaved repeat(s), medians; {mode['nproc']} local gloo workers, "
            f"{mode['batch_size']} examples per rank per step, data set `{mode['data']}` "
            f"({rows['sparse_dist']['steps']} steps per run); loop_before = {args.baseline_rev}.\n\n{body}\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
