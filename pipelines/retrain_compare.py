"""``python -m pipelines.retrain_compare``: carried learning rates vs the static config, day by day.

One cold start (version 1, on the first 3 days of the retrain_demo data set) is copied into two
registries; then for each of ``--days`` new days (appended to the shared data set, same ground
truth, drift continued) both run the scheduled job: ``carried`` with ``carry_lr=true`` (each day
starts every group's max LR from the bases the published model's controller ended with) and
``static`` with ``carry_lr=false`` (the preset's LRs every day). Writes ``docs/retraining.{md,json}``:
per day and arm, the candidate's held-out NE per task (the day's held-out slice), the oracle's NE
on the same rows, the gate's decision and the LRs the day started from.

Resumable: the data set is appended only up to the days asked for, and the job itself skips days
already trained, so a rerun continues where it stopped. Options: ``--out DIR`` (default
``outputs/retrain_compare``), ``--days N`` (default 5), ``--nproc N`` (default 2), ``--docs DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from pipelines import retrain as R
from pipelines.registry import Registry
from pipelines.retrain_demo import retrain_command

ARMS = {"carried": "carry_lr=true", "static": "carry_lr=false"}
TASKS = ("contribution", "like", "long_dwell")


def _run(cmd: List[str], log_path: str) -> int:
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


def _max_lrs(version_dir: str) -> Dict[str, float]:
    """The max LR per group the version's run trained with (its resolved config)."""
    from omegaconf import OmegaConf

    lr = OmegaConf.load(os.path.join(version_dir, ".hydra", "config.yaml")).optim.lr
    return {g: float(lr[g]) for g in lr}


def collect(out: str) -> Dict[str, Any]:
    rows: Dict[str, Dict[str, Any]] = {}
    for arm in ARMS:
        reg = Registry(os.path.join(out, arm))
        for v in reg.list_versions():
            m = reg.manifest(v)
            if m.get("cold_start"):
                continue
            tasks = m["gate"]["tasks"]
            rows.setdefault(m["day"], {})[arm] = {
                "version": v, "status": m["status"], "parent": m["parent"],
                "ne": {t: tasks[t]["candidate_ne"] for t in TASKS},
                "published_ne": {t: tasks[t].get("published_ne") for t in TASKS},
                "oracle_ne": {t: tasks[t].get("oracle_ne") for t in TASKS},
                "lr_start": m["lr_start"], "hdet_bases": m["hdet_bases"], "train_seconds": m.get("train_seconds"),
                "max_lr": _max_lrs(reg.version_dir(v)), "reasons": m["gate"].get("reasons", [])}
    return rows


def write_docs(out: str, docs: str, days_asked: int) -> None:
    rows = collect(out)
    days = sorted(d for d, r in rows.items() if set(r) == set(ARMS))
    mean = lambda d: statistics.fmean(d[t] for t in TASKS)
    table = ["| day | carried NE (mean) | static NE (mean) | carried - static | oracle NE (mean) | carried: published? "
             "| static: published? | carried max LR embedding / transformer | static max LR embedding / transformer "
             "| carried: bases it ended with |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    diffs = []
    for d in days:
        c, s = rows[d]["carried"], rows[d]["static"]
        diffs.append(mean(c["ne"]) - mean(s["ne"]))
        lrs = lambda r: f"{r['max_lr']['embedding']:.3g} / {r['max_lr']['transformer']:.3g}"
        ended = f"{c['hdet_bases']['embedding']:.3g} / {c['hdet_bases']['transformer']:.3g}" if c["hdet_bases"] else "-"
        decision = lambda r: r["status"] + (f" ({'; '.join(r['reasons'])})" if r["reasons"] else "")
        table.append(f"| {d} | {mean(c['ne']):.4f} | {mean(s['ne']):.4f} | {diffs[-1]:+.4f} | {mean(c['oracle_ne']):.4f} "
                     f"| {decision(c)} | {decision(s)} | {lrs(c)} | {lrs(s)} | {ended} |")
    per_task = ["| day | arm | " + " | ".join(TASKS) + " |", "|---|---|" + "---|" * len(TASKS)]
    for d in days:
        for arm in ARMS:
            per_task.append(f"| {d} | {arm} | " + " | ".join(f"{rows[d][arm]['ne'][t]:.4f}" for t in TASKS) + " |")
        per_task.append(f"| {d} | oracle | " + " | ".join(f"{rows[d]['carried']['oracle_ne'][t]:.4f}" for t in TASKS)
                        + " |")
    published = {arm: sum(rows[d][arm]["status"] == "published" for d in days) for arm in ARMS}
    verdict = ("no day finished in both arms yet" if not diffs else
               f"published days: carried {published['carried']} of {len(days)}, static {published['static']} of "
               f"{len(days)}; " +
               f"over {len(diffs)} day(s), carried minus static mean NE: {statistics.fmean(diffs):+.4f} "
               f"(per day: {', '.join(f'{x:+.4f}' for x in diffs)}; negative = carried better)")
    partial = "" if len(days) >= days_asked else (
        f"**PARTIAL: {len(days)} of {days_asked} days finished in both arms;** rerun the command to continue.\n\n")
    md = f"""# Scheduled retraining: carried learning rates vs the static config

{partial}Produced by `python -m pipelines.retrain_compare` on {platform.machine()}, {os.cpu_count()} cores,
{time.strftime('%Y-%m-%d')}. Data: the retrain_demo synthetic set (`conf/data/retrain_demo.yaml`), 3 days for
the shared cold start (version 1), then one day appended at a time. Each day both registries run
`python -m pipelines.retrain` (experiment `retrain_daily`: HDET with the scale-free controller,
2 workers); `carried` starts each group's max LR from the bases the published model's controller
ended its day with, `static` from the preset's LRs every day. NE: the day's held-out slice (10% of
the day, never trained on), scored by the candidate of that day; the oracle is the generator's true
probabilities on the same rows. One seed per arm and about 1,600 held-out rows per day: the
differences include seed and sampling noise that this comparison does not measure.

{verdict}

{chr(10).join(table)}

Per task (held-out NE of each day's candidate, and the oracle's):

{chr(10).join(per_task)}

Raw figures: `docs/retraining.json`.
"""
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, "retraining.json"), "w") as f:
        json.dump({"days": rows, "mean_ne_difference_carried_minus_static": diffs}, f, indent=1)
    with open(os.path.join(docs, "retraining.md"), "w") as f:
        f.write(md)


def main(argv=None) -> int:
    from omegaconf import OmegaConf

    from data_tools.prepare import append_synthetic_days, ensure_dataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/retrain_compare")
    ap.add_argument("--days", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.report_only:
        write_docs(out, args.docs, args.days)
        return 0
    data = os.path.join(out, "data")
    log = os.path.join(out, "compare.log")
    os.makedirs(out, exist_ok=True)
    spec = OmegaConf.load(os.path.join(R.CONF_DIR, "data", "retrain_demo.yaml"))
    base_days = int(spec.generator.days)
    if not os.path.isfile(os.path.join(data, "meta.json")):
        ensure_dataset(data, OmegaConf.to_container(spec.generator), {})
    cold = os.path.join(out, "cold")
    if not Registry(cold).current():
        code = _run(retrain_command(cold, data, args.nproc, ["--until", sorted(json.load(
            open(os.path.join(data, "meta.json")))["days"])[base_days - 1]]), log)
        if code != R.EXIT_PUBLISHED:
            print(f"the cold start failed (exit {code}); see {log}")
            return 1
    for arm in ARMS:
        if not os.path.isdir(os.path.join(out, arm)):
            shutil.copytree(cold, os.path.join(out, arm), symlinks=True)
    for k in range(args.days):
        have = len(json.load(open(os.path.join(data, "meta.json")))["days"])
        if have < base_days + k + 1:
            append_synthetic_days(data, 1)
        day = sorted(json.load(open(os.path.join(data, "meta.json")))["days"])[base_days + k]
        for arm, setting in ARMS.items():
            t0 = time.time()
            code = _run(retrain_command(os.path.join(out, arm), data, args.nproc, ["--until", day]) + [setting], log)
            print(f"day {day} {arm}: exit {code}, {time.time() - t0:.0f} s", flush=True)
            if code not in (R.EXIT_PUBLISHED, R.EXIT_REJECTED, R.EXIT_NOTHING):
                print(f"failed; see {log}")
                return 1
        write_docs(out, args.docs, args.days)
    write_docs(out, args.docs, args.days)
    print(f"wrote {args.docs}/retraining.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
