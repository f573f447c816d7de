"""HDET's cost over the same run without spread, measured side by side in one invocation.

Runs the training job (4 local workers, 2x2 layout, benchmark data set) in these configurations,
interleaved ``--repeats`` times so that drift in machine load spreads over all of them:

- ``plain``: HDET off (embedding replicas averaged every step, the plain 2-D baseline)
- ``alpha0_T{T}``: HDET on with alpha = 0 (no spread, no controller signal) and sync every T
- ``hdet_T{T}``: HDET on with alpha = 1/9 and the controller, sync every T

for T in ``--sync`` (default 1000 and 100). Reported per configuration: training seconds
(median), examples/s, the time rank 0 spent inside HDET's hooks (gather, converge, controller,
value updates; measured by the trainer), and the cost over ``alpha0`` at the same T and over
``plain``. Prints a Markdown table and, with ``--write``, records it in BENCHMARKS.md.

    .venv/bin/python benchmarks/hdet_overhead.py --write
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ~1M examples at 128 per rank: ~1950 steps, so T = 1000 syncs once mid-run and once at the end.
COMMON = ["+experiment=hdet_no_warm_init", "data.train_days=4", "data.batch_size=128",
          "trainer.checkpoint=false", "trainer.log_every=100", "hdet.controller_start=0"]


def configurations(syncs):
    configs = {"plain": ["hdet=disabled"]}
    for T in syncs:
        configs[f"alpha0_T{T}"] = [f"hdet.sync_every={T}", "hdet.alpha=0"]
        configs[f"hdet_T{T}"] = [f"hdet.sync_every={T}"]
    return configs


def run(name, overrides, workdir):
    from recsys_hdet.run_dir import RunDir

    run_dir = os.path.join(workdir, f"{name}_{time.time_ns()}")
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}", *COMMON, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return RunDir(run_dir).summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sync", type=int, nargs="+", default=[1000, 100])
    parser.add_argument("--no-plain", action="store_true", help="skip the plain (HDET off) configuration")
    parser.add_argument("--write", action="store_true", help="record the table in BENCHMARKS.md")
    args = parser.parse_args()
    configs = configurations(args.sync)
    if args.no_plain:
        del configs["plain"]
    results = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for name, overrides in configs.items():
                s = run(name, overrides, workdir)
                results[name].append(s)
                print(f"[{repeat + 1}/{args.repeats}] {name}: {s['train_seconds']:.1f} s train, "
                      f"{s['examples_per_sec']:.0f} ex/s", flush=True)
    median = lambda name, f: statistics.median(f(s) for s in results[name])
    train_s = {n: median(n, lambda s: s["train_seconds"]) for n in configs}
    spread = {n: (min(s["train_seconds"] for s in results[n]), max(s["train_seconds"] for s in results[n])) for n in configs}
    lines = [
        "| configuration | steps | train s (median) | train s min..max | examples/s | syncs | s in HDET hooks | HDET hooks / train | vs alpha=0 same T | vs plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in configs:
        s0 = results[name][0]
        hooks = median(name, lambda s: s.get("hdet", {}).get("seconds", 0.0)) if "hdet" in s0 else None
        syncs = s0.get("hdet", {}).get("syncs", "-")
        T = name.split("_T")[-1] if "_T" in name else None
        vs_alpha0 = f"{(train_s[name] / train_s[f'alpha0_T{T}'] - 1) * 100:+.2f}%" if T and name.startswith("hdet") else "-"
        vs_plain = f"{(train_s[name] / train_s['plain'] - 1) * 100:+.2f}%" if "plain" in configs and name != "plain" else "-"
        hook_cells = f"{hooks:.2f} | {hooks / train_s[name] * 100:.2f}%" if hooks is not None else "- | -"
        lines.append(f"| {name} | {s0['steps']} | {train_s[name]:.1f} | {spread[name][0]:.1f}..{spread[name][1]:.1f} | "
                     f"{median(name, lambda s: s['examples_per_sec']):.0f} | "
                     f"{syncs} | {hook_cells} | {vs_alpha0} | {vs_plain} |")
    table = "\n".join(lines)
    header = (f"## HDET overhead (benchmarks/hdet_overhead.py)\n\n"
              f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, 4 local "
              f"gloo workers (2x2 layout), benchmark data set, 4 training days at 128 examples per rank "
              f"(~1M examples), {args.repeats} interleaved repeat(s); all rows from this one invocation.\n\n")
    print("\n" + header + table)
    if args.write:
        path = os.path.join(REPO, "BENCHMARKS.md")
        text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\nEvery table here is produced by the script named in its heading.\n"
        start = text.find("## HDET overhead")
        if start >= 0:
            end = text.find("\n## ", start + 1)
            text = text[:start] + text[end + 1 if end >= 0 else len(text):]
        with open(path, "w") as f:
            f.write(text.rstrip() + "\n\n" + header + table + "\n")


if __name__ == "__main__":
    main()
