"""``python -m benchmarks.contender_cost``: what the LR-finding contenders cost against plain + rollback, side by side.

The recovery study's runs were made in different sessions, under different loads: their seconds cannot be
compared. Here the contenders that choose their own rates run one after another, interleaved over repeats
(each repeat in a rotated order, so that load drifts hit every contender alike), from one start of the
recovery study, with its preset, layout, contract and seed:

- ``plain_rollback``: the plain run at the start's rates (the reference);
- ``hdet_range_test``: the range test on the replicas (a 100-step sweep before the pass, in the same job);
- ``hdet_range_test_revised``: its revised rule (the same sweep, another point of the curve read), on a setting
  whose study runs it (``Setting.contenders``);
- ``lr_finder``: ``python -m recsys_hdet.lr_find`` (two sweeps of 100 steps, one after the other on one launch
  of the workers), then the plain run at its suggestion.

A contender's cost is the wall seconds of every process it needs (job start-up included: a user pays it too)
and its optimizer steps; the ratios are to ``plain_rollback``'s of the same repeat, and the figure kept is
their median over the repeats. Writes ``contender_cost`` into ``benchmarks/results.json`` (``--write``; else
``outputs/benchmarks/contender_cost.json``), which the recovery study's report reads as each contender's
wall-time ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from recsys_hdet.run_dir import RunDir
from studies.contract import CONTRACT
from studies.provenance import REPO
from studies.range_tests import HDET_RANGE_TEST, HDET_RANGE_TEST_REVISED
from studies.reporting import machine_line
from studies.runs import train_run
from studies.settings import COST_FILE, SETTINGS, Setting
from studies.starts import PRESET, lr_overrides, recovery_anchor, start_lrs

CONTENDERS = ("plain_rollback", "hdet_range_test", "hdet_range_test_revised", "lr_finder")
RANGE_TESTS = {"hdet_range_test": HDET_RANGE_TEST, "hdet_range_test_revised": HDET_RANGE_TEST_REVISED}


def contenders_of(setting: Optional[Setting]) -> tuple:
    """The contenders measured: the setting's (its study's), or on the benchmark all but the revised rule."""
    return tuple(c for c in CONTENDERS if c in setting.contenders) if setting else \
        tuple(c for c in CONTENDERS if c != "hdet_range_test_revised")


def _common(start: str, seed: int, setting: Optional[Setting] = None) -> List[str]:
    """A contender's overrides: the study's preset, the setting's (``--setting``), the contract, the start's rates
    (factors of the benchmark's best cell, or of the setting's own: its study's ``anchor``)."""
    anchor = recovery_anchor(setting.path("lr_recovery.json")) if setting else recovery_anchor()
    e, d = start_lrs(start, anchor)
    return [f"+experiment={PRESET}", *(setting.overrides if setting else ()), f"seed={seed}", *CONTRACT.overrides(),
            *lr_overrides(e, d), "trainer.tensorboard=false"]


def _train(work: str, name: str, overrides: Sequence[str], env: Dict[str, str]) -> Dict[str, Any]:
    run = train_run(os.path.join(work, name), overrides, env)
    if not run["finished"]:
        raise RuntimeError(f"{name}: the job failed (exit status {run['exit_status']}); see {run['log']}")
    summary = RunDir(os.path.join(work, name)).summary()
    sweep = ((summary.get("hdet") or {}).get("range_test") or {}).get("steps", 0)
    return {"seconds": run["process_seconds"], "steps": summary["steps"] + sweep, "commit": run["commit"],
            "clean": run["clean"]}


def contender(name: str, work: str, start: str, seed: int, env: Dict[str, str],
              setting: Optional[Setting] = None) -> Dict[str, Any]:
    common = _common(start, seed, setting)
    if name == "plain_rollback":
        return _train(work, name, common, env)
    if name in RANGE_TESTS:
        return _train(work, name, [*common, *RANGE_TESTS[name]], env)
    find_dir = os.path.join(work, "lr_finder_sweeps")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "recsys_hdet.lr_find", *[o for o in common if o != "trainer.tensorboard=false"],
                           f"run_dir={find_dir}"], cwd=REPO, env=env, capture_output=True, text=True)
    finder_seconds = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"lr_find exited {proc.returncode}: {proc.stderr[-2000:]}")
    record = json.load(open(os.path.join(find_dir, "lr_find.json")))
    run = _train(work, "lr_finder", [*common, *(f"optim.lr.{g}={v:.6g}" for g, v in record["lr"].items())], env)
    sweep_steps = sum(s["steps"] for s in record["sweeps"].values())
    return {**run, "seconds": run["seconds"] + finder_seconds, "steps": run["steps"] + sweep_steps,
            "finder_seconds": finder_seconds}


def measure(work: str, start: str, seed: int, repeats: int, data_cache: str | None,
            setting: Optional[Setting] = None) -> Dict[str, Any]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **({"RECSYS_HDET_DATA": data_cache} if data_cache else {})}
    rows: List[Dict[str, Any]] = []
    names = contenders_of(setting)
    for k in range(repeats):
        order = names[k % len(names):] + names[:k % len(names)]
        repeat: Dict[str, Any] = {}
        for name in order:
            repeat[name] = contender(name, os.path.join(work, f"repeat{k}"), start, seed, env, setting)
            print(f"repeat {k}: {name} {repeat[name]['seconds']:.0f} s, {repeat[name]['steps']} steps", flush=True)
        rows.append(repeat)
    ratio = {c: statistics.median(r[c]["seconds"] / r["plain_rollback"]["seconds"] for r in rows) for c in names}
    steps = {c: statistics.median(r[c]["steps"] / r["plain_rollback"]["steps"] for r in rows) for c in names}
    return {"setting": setting.name if setting else None, "start": start, "seed": seed, "repeats": rows, "ratio": ratio, "steps_ratio": steps,
            "order": "rotated per repeat", "commit": rows[0]["plain_rollback"]["commit"],
            "clean": all(r[c]["clean"] for r in rows for c in names), "machine": machine_line(),
            "date": time.strftime("%Y-%m-%d")}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.contender_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", default="all_low", help="a start of the recovery study (default: all_low)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(REPO, "outputs", "benchmarks", "contender_cost"))
    ap.add_argument("--data-cache", help="data directory (RECSYS_HDET_DATA)")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default=None,
                    help="a setting of studies/settings.py: its overrides, the starts factors of its own best cell "
                         "(its study's lr_recovery.json anchor); --write records into its contender_cost.json under "
                         "docs/results/rule_travels/NAME/, which its study's report reads")
    ap.add_argument("--write", action="store_true", help="record into benchmarks/results.json (or the setting's file)")
    args = ap.parse_args(argv)
    setting = SETTINGS[args.setting] if args.setting else None
    work = os.path.join(args.work, setting.name) if setting else args.work
    result = measure(work, args.start, args.seed, args.repeats, args.data_cache, setting)
    if args.write:
        path = setting.path(COST_FILE) if setting else os.path.join(REPO, "benchmarks", "results.json")
        data = json.load(open(path)) if os.path.isfile(path) else {}
        data["contender_cost"] = result
    else:
        path, data = os.path.join(REPO, "outputs", "benchmarks", "contender_cost.json"), result
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)  # as benchmarks.run writes results.json
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(json.dumps({"ratio": result["ratio"], "steps_ratio": result["steps_ratio"]}), flush=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
