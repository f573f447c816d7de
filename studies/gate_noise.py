"""``python -m studies.gate_noise``: how often the retraining gate rejects ordinary days, and how often
it catches planted bad ones (issue 37's measurement; docs/operations.md quotes it).

The retraining job (``pipelines.retrain``, the demo's overrides, ``conf/data/retrain_demo.yaml``'s
generator with enough days) runs in *record* mode: its gate set so wide that every day publishes, so
the lineage is that of a gate that accepts ordinary days, and each version's manifest keeps what the
gate saw per task (the candidate's and the published model's NE and calibration on the day's held-out
rows, and the paired interval of their difference). Then:

1. cold start on the first 3 days, then ``--ordinary`` (10) ordinary days one at a time: the same
   generator, no damage;
2. for each planted kind, a copy of the data set and registry after the ordinary days, the next day
   damaged in the copy, the job run once:
   - ``shuffled_labels``: the day's labels permuted across rows (the demo's planted day);
   - ``dropped_feature``: the video id missing (row 0) on every row of the day, an upstream join lost;
   - ``lost_positives``: 70% of every task's positive labels set to 0 (a logging outage).

Each day's record is then replayed through :func:`pipelines.gate.gate` under several settings (the
old point-difference rule at tolerance 0.002 and 0.01, the paired rule at z 1.64, 1.96, 2.58 and
tolerance 0 or 0.002): rejections of ordinary days are false rejects, of planted days true ones.
Replay limit: a rejected ordinary day would have changed the next day's parent; the replay keeps the
recorded lineage (every day published).

Resumable: the job skips days its registry has; ``results.jsonl`` gets one line per day (with the
commit, from a clean tree); ``--report-only`` rebuilds ``gate_noise.md`` / ``.json`` from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np
import polars as pl

from data_tools.contract import LABEL_PREFIX, read_meta
from studies.provenance import REPO, code_state
from studies.results import append, load, work_dir

KINDS = ("shuffled_labels", "dropped_feature", "lost_positives")
RECORD_GATE = ["gate.ne_tolerance=1e9", "gate.max_ne=1e9", "gate.calibration=[1e-9,1e9]"]
SETTINGS = [  # (name, ne_tolerance, z): z 0 = the old rule, the point difference against the tolerance
    ("point difference > 0.002 (the old default)", 0.002, 0.0),
    ("point difference > 0.01 (the old demo's)", 0.01, 0.0),
    ("paired interval above 0, z 1.64", 0.0, 1.64),
    ("paired interval above 0, z 1.96 (default)", 0.0, 1.96),
    ("paired interval above 0, z 2.58", 0.0, 2.58),
    ("paired interval above 0.002, z 1.96", 0.002, 1.96),
]


def damage(root: str, day: str, kind: str, seed: int = 0) -> None:
    """Plants ``kind`` into the processed day file of ``root`` (atomically)."""
    from pipelines.retrain_demo import shuffle_labels
    from recsys_hdet.components.dataset import DatasetMeta

    if kind == "shuffled_labels":
        return shuffle_labels(root, day, seed)
    path = DatasetMeta.load(root).day_path(day)
    df = pl.read_parquet(path)
    if kind == "dropped_feature":
        df = df.with_columns(pl.lit(0, pl.Int64).alias("video_id"))
    elif kind == "lost_positives":
        rng = np.random.default_rng(seed)
        df = df.with_columns(*[pl.Series(c, np.where(rng.uniform(size=df.height) < 0.7, 0.0, df[c].to_numpy())
                                         .astype(np.float32)) for c in df.columns if c.startswith(LABEL_PREFIX)])
    else:
        raise ValueError(kind)
    df.write_parquet(path + ".tmp")
    os.replace(path + ".tmp", path)


def job(registry: str, data: str, until: str, nproc: int) -> int:
    from pipelines.retrain_demo import retrain_command

    cmd = retrain_command(registry, data, nproc, [f"until={until}", "create=true"]) + RECORD_GATE  # the first run creates it
    with open(os.path.join(os.path.dirname(registry), "job.log"), "a") as log:
        return subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def day_record(registry: str, day: str, kind: str, state: Dict[str, Any]) -> Dict[str, Any]:
    from pipelines.registry import Registry

    reg = Registry(registry)
    (version,) = [v for v in reg.list_versions() if reg.manifest(v).get("day") == day]
    nan_to_none = lambda x: {k: nan_to_none(v) for k, v in x.items()} if isinstance(x, dict) else \
        (None if isinstance(x, float) and x != x else x)
    tasks = nan_to_none(reg.manifest(version)["gate"]["tasks"])
    return {"name": f"{kind}/{day}", "kind": kind, "day": day, "version": version, "tasks": tasks,
            "commit": state["commit"], "clean": state["clean"]}


def replay(record: Dict[str, Any], tolerance: float, z: float) -> List[str]:
    """The gate's reasons for this day under one setting (empty: published)."""
    from omegaconf import OmegaConf

    from pipelines.gate import gate

    cand = {"rows": None, "eval": {t: {"ne": r["candidate_ne"], "calibration": r["candidate_calibration"]}
                                   for t, r in record["tasks"].items()}}
    paired = {}
    for t, r in record["tasks"].items():
        p = r["paired"]
        half = (p["high"] - p["low"]) / 2 * (z / 1.96)
        paired[t] = {"diff": p["diff"], "low": p["diff"] - half, "high": p["diff"] + half, "rows": p["rows"]}
    pub = {"eval": {t: {"ne": r["published_ne"]} for t, r in record["tasks"].items()}, "paired": paired}
    cfg = OmegaConf.create({"gate": {"ne_tolerance": tolerance, "z": z, "max_ne": 1.0, "calibration": [0.8, 1.25]}})
    return gate(cfg, {"status": "completed"}, cand, pub)["reasons"]


def report(results: Dict[str, Dict[str, Any]]) -> tuple:
    records = sorted(results.values(), key=lambda r: (r["kind"] != "ordinary", r["kind"], r["day"]))
    ordinary = [r for r in records if r["kind"] == "ordinary"]
    planted = [r for r in records if r["kind"] != "ordinary"]
    rows, table = [], []
    for name, tol, z in SETTINGS:
        false = [r["day"] for r in ordinary if replay(r, tol, z)]
        caught = [r["kind"] for r in planted if replay(r, tol, z)]
        rows.append({"setting": name, "ne_tolerance": tol, "z": z, "false_rejects": len(false), "ordinary_days": len(ordinary),
                     "false_reject_days": false, "true_rejects": len(caught), "planted_days": len(planted), "caught": caught})
        table.append(f"| {name} | {len(false)} of {len(ordinary)} | {len(caught)} of {len(planted)} "
                     f"({', '.join(caught) or 'none'}) |")
    num = lambda x, spec: "–" if x is None else format(x, spec)
    per_day = []
    for r in records:
        cells = []
        for t, x in r["tasks"].items():
            p = x["paired"]
            cells.append(f"{t} {num(p['diff'], '+.4f')} [{num(p['low'], '+.4f')}, {num(p['high'], '+.4f')}] NE "
                         f"{num(x['candidate_ne'], '.3f')} cal {num(x['candidate_calibration'], '.2f')}")
        per_day.append(f"| {r['kind']} | {r['day']} | " + "; ".join(cells) + " |")
    commits = sorted({f"{r['commit'][:7]}{'' if r['clean'] else ' (dirty)'}" for r in records})
    md = "\n".join([
        "# The retraining gate: false rejects on ordinary days, true rejects on planted bad days",
        "", f"`python -m studies.gate_noise` (docs/results/gate_noise/results.jsonl, {len(records)} days, commit(s) "
        f"{', '.join(commits)}). Each day's record replayed through the gate under each setting (module docstring).",
        "", "| gate setting | ordinary days rejected | planted bad days rejected |", "|---|---|---|", *table,
        "", "Per day and task: the candidate's NE minus the published model's on the day's held-out rows, its 95% "
        "paired interval, the candidate's NE and calibration.", "",
        "| kind | day | per task |", "|---|---|---|", *per_day, ""])
    return {"settings": rows, "days": records}, md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "results", "gate_noise"))
    ap.add_argument("--ordinary", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    results_path = os.path.join(args.out, "results.jsonl")
    results = load(results_path)
    if not args.report_only:
        from omegaconf import OmegaConf

        from data_tools.prepare import ensure_dataset

        state = code_state()
        if not state["clean"]:
            print("refusing to record from a dirty tree (commit first)", file=sys.stderr)
            return 2
        work = work_dir(args.out)
        data, registry = os.path.join(work, "data"), os.path.join(work, "ordinary", "registry")
        spec = OmegaConf.to_container(OmegaConf.load(os.path.join(REPO, "conf", "data", "retrain_demo.yaml")).generator)
        spec["days"] = 3 + args.ordinary + 1
        ensure_dataset(data, spec, {})
        days = sorted(read_meta(data)["days"])
        os.makedirs(os.path.dirname(registry), exist_ok=True)
        for day in days[2:3 + args.ordinary]:  # the cold start (first 3 days), then one ordinary day at a time
            name = f"{'cold_start' if day == days[2] else 'ordinary'}/{day}"
            if name in results:
                continue
            code = job(registry, data, day, args.nproc)
            print(f"{name}: job exit {code}", flush=True)
            if code not in (0, 4, 5):
                print(f"the job failed (see {os.path.dirname(registry)}/job.log): stopping", file=sys.stderr)
                return 1
            if day != days[2]:
                append(results_path, day_record(registry, day, "ordinary", state))
            results = load(results_path)
        bad_day = days[3 + args.ordinary]
        for kind in KINDS:
            if f"{kind}/{bad_day}" in results:
                continue
            copy = os.path.join(work, kind)
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(data, os.path.join(copy, "data"))
            shutil.copytree(registry, os.path.join(copy, "registry"), symlinks=True)
            damage(os.path.join(copy, "data"), bad_day, kind)
            code = job(os.path.join(copy, "registry"), os.path.join(copy, "data"), bad_day, args.nproc)
            print(f"{kind}/{bad_day}: job exit {code}", flush=True)
            if code not in (0, 4):
                print(f"the job failed (see {copy}/job.log): stopping", file=sys.stderr)
                return 1
            append(results_path, day_record(os.path.join(copy, "registry"), bad_day, kind, state))
            results = load(results_path)
    result, md = report(load(results_path))
    with open(os.path.join(args.out, "gate_noise.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "gate_noise.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
