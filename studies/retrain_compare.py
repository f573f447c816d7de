"""``python -m studies.retrain_compare``: carried learning rates vs the static config, day by day.

Per seed (``--seeds``, paired: both arms of a seed share its cold start and the job's ``seed``), one
cold start (version 1, on the first 3 days of the retrain_demo data set) is copied into two
registries; then for each of ``--days`` new days (appended to the shared data set, same ground
truth, drift continued) both run the scheduled job: ``carried`` with ``carry_lr=true`` (each day
starts every group's max LR from the bases the published model's controller ended with) and
``static`` with ``carry_lr=false`` (the preset's LRs every day). Writes ``docs/retraining.{md,json}``:
per day and arm, the candidate's held-out NE per task (the day's held-out slice), the oracle's NE
on the same rows, the gate's decision and the LRs the day started from.

The report gives, per day, each seed's carried - static difference of the mean held-out NE, each
seed's mean over its days, and the mean over every (seed, day) pair with a 95% t-interval taking
the pairs as independent (a seed's days are chained through its registry: the true one is wider).

Resumable: the data set (shared by the seeds) is appended only up to the days asked for, and the
job itself skips days already trained, so a rerun continues where it stopped. Options: ``--out DIR``
(default ``outputs/retrain_compare``), ``--days N`` (default 5), ``--seeds S ...`` (default 0 1),
``--nproc N`` (default 2), ``--docs DIR``.
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
from studies.harness import paired
from pipelines.registry import Registry
from pipelines.retrain_demo import retrain_command
from recsys_hdet.constants import TASKS
from recsys_hdet.exit_status import ExitStatus

ARMS = {"carried": "carry_lr=true", "static": "carry_lr=false"}


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
    """{day: {arm: row}} from one seed's two registries."""
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


def seed_dir(out: str, seed: int) -> str:
    return os.path.join(out, f"seed{seed}")


def _ci(p: Any) -> str:
    if p is None:
        return "-"
    ci = p["ci95"]
    return f"{p['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")


def write_docs(out: str, docs: str, days_asked: int, seeds: List[int]) -> None:
    per_seed = {s: collect(seed_dir(out, s)) for s in seeds}
    days = sorted({d for rows in per_seed.values() for d in rows})
    both = lambda s, d: set(per_seed[s].get(d, {})) == set(ARMS)
    mean = lambda r: statistics.fmean(r["ne"][t] for t in TASKS)
    diff = {(s, d): mean(per_seed[s][d]["carried"]) - mean(per_seed[s][d]["static"])
            for s in seeds for d in days if both(s, d)}
    complete_days = [d for d in days if all(both(s, d) for s in seeds)]
    table = ["| day | seed | carried NE (mean) | static NE (mean) | carried - static | oracle NE (mean) "
             "| carried: published? | static: published? | carried max LR embedding / transformer "
             "| static max LR embedding / transformer | carried: bases it ended with |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lrs = lambda r: f"{r['max_lr']['embedding']:.3g} / {r['max_lr']['transformer']:.3g}"
    decision = lambda r: r["status"] + (f" ({'; '.join(r['reasons'])})" if r["reasons"] else "")
    for d in days:
        for s in seeds:
            if not both(s, d):
                continue
            c, st = per_seed[s][d]["carried"], per_seed[s][d]["static"]
            ended = f"{c['hdet_bases']['embedding']:.3g} / {c['hdet_bases']['transformer']:.3g}" if c["hdet_bases"] else "-"
            table.append(f"| {d} | {s} | {mean(c):.4f} | {mean(st):.4f} | {diff[(s, d)]:+.4f} | "
                         f"{statistics.fmean(c['oracle_ne'][t] for t in TASKS):.4f} "
                         f"| {decision(c)} | {decision(st)} | {lrs(c)} | {lrs(st)} | {ended} |")
    per_task = ["| day | seed | arm | " + " | ".join(TASKS) + " |", "|---|---|---|" + "---|" * len(TASKS)]
    for d in days:
        for s in seeds:
            if both(s, d):
                for arm in ARMS:
                    per_task.append(f"| {d} | {s} | {arm} | "
                                    + " | ".join(f"{per_seed[s][d][arm]['ne'][t]:.4f}" for t in TASKS) + " |")
    seed_means = [statistics.fmean(diff[(s, d)] for d in complete_days) for s in seeds] if complete_days else []
    over_seeds, over_pairs = paired(seed_means), paired([diff[(s, d)] for s in seeds for d in complete_days])
    published = {arm: sum(per_seed[s][d][arm]["status"] == "published" for s in seeds for d in complete_days)
                 for arm in ARMS}
    runs = len(seeds) * len(complete_days)
    verdict = ("no day finished in both arms of every seed yet" if not complete_days else
               f"Over {len(complete_days)} day(s) x {len(seeds)} seed(s): published days carried {published['carried']} "
               f"of {runs}, static {published['static']} of {runs}. Carried minus static mean NE (negative = carried "
               "better), per seed over its days: " + ", ".join(f"seed {s} {m:+.4f}" for s, m in zip(seeds, seed_means))
               + f"; over the {runs} (seed, day) pairs {_ci(over_pairs)} (95% t-interval taking the pairs as "
               "independent: a seed's days are chained through its registry, so the true interval is wider).")
    partial = "" if len(complete_days) >= days_asked else (
        f"**PARTIAL: {len(complete_days)} of {days_asked} days finished in both arms of every seed;** rerun the "
        "command to continue.\n\n")
    from omegaconf import OmegaConf

    job = OmegaConf.load(os.path.join(R.CONF_DIR, "retrain.yaml"))
    md = f"""# Scheduled retraining: carried learning rates vs the static config

{partial}Produced by `python -m studies.retrain_compare --seeds {' '.join(map(str, seeds))}` on {platform.machine()},
{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}. Data: the retrain_demo synthetic set (`conf/data/retrain_demo.yaml`), 3
days for each seed's cold start (version 1), then one day appended at a time. Each day both registries
of a seed run `python -m pipelines.retrain seed=S` (experiment `retrain_daily`: HDET with
conf/hdet/enabled.yaml's controller, 2 workers); `carried` starts each group's max LR from the bases the
published model's controller ended its day with, clamped to [preset / {job.carry_lr_clamp}, preset x
{job.carry_lr_clamp}] (`carry_lr_clamp`), `static` from the preset's LRs every day. NE: the day's held-out
slice (10% of the day, about 1,600 rows, never trained on), scored by the candidate of that day; the
oracle is the generator's true probabilities on the same rows.

{verdict}

{chr(10).join(table)}

Per task (held-out NE of each day's candidate):

{chr(10).join(per_task)}

Raw figures: `docs/retraining.json`.
"""
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, "retraining.json"), "w") as f:
        json.dump({"seeds": {str(s): per_seed[s] for s in seeds},
                   "difference_carried_minus_static": {"per_seed_day": {f"{s}/{d}": v for (s, d), v in diff.items()},
                                                       "over_seeds": over_seeds, "over_pairs": over_pairs}},
                  f, indent=1)
    with open(os.path.join(docs, "retraining.md"), "w") as f:
        f.write(md)


def main(argv=None) -> int:
    from omegaconf import OmegaConf

    from data_tools.prepare import append_synthetic_days, ensure_dataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/retrain_compare")
    ap.add_argument("--days", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.report_only:
        write_docs(out, args.docs, args.days, args.seeds)
        return 0
    data = os.path.join(out, "data")
    log = os.path.join(out, "compare.log")
    os.makedirs(out, exist_ok=True)
    spec = OmegaConf.load(os.path.join(R.CONF_DIR, "data", "retrain_demo.yaml"))
    base_days = int(spec.generator.days)
    if not os.path.isfile(os.path.join(data, "meta.json")):
        ensure_dataset(data, OmegaConf.to_container(spec.generator), {})
    for seed in args.seeds:
        cold = os.path.join(seed_dir(out, seed), "cold")
        if not Registry(cold).current():
            code = _run(retrain_command(cold, data, args.nproc, ["--until", sorted(json.load(
                open(os.path.join(data, "meta.json")))["days"])[base_days - 1]]) + [f"seed={seed}"], log)
            if code != ExitStatus.OK:
                print(f"the cold start of seed {seed} failed (exit {code}); see {log}")
                return 1
        for arm in ARMS:
            if not os.path.isdir(os.path.join(seed_dir(out, seed), arm)):
                shutil.copytree(cold, os.path.join(seed_dir(out, seed), arm), symlinks=True)
    for k in range(args.days):
        have = len(json.load(open(os.path.join(data, "meta.json")))["days"])
        if have < base_days + k + 1:
            append_synthetic_days(data, 1)
        day = sorted(json.load(open(os.path.join(data, "meta.json")))["days"])[base_days + k]
        for seed in args.seeds:
            for arm, setting in ARMS.items():
                t0 = time.time()
                code = _run(retrain_command(os.path.join(seed_dir(out, seed), arm), data, args.nproc,
                                            ["--until", day]) + [setting, f"seed={seed}"], log)
                print(f"day {day} seed {seed} {arm}: exit {code}, {time.time() - t0:.0f} s", flush=True)
                if code not in (ExitStatus.OK, ExitStatus.REJECTED, ExitStatus.NOTHING_TO_DO):
                    print(f"failed; see {log}")
                    return 1
        write_docs(out, args.docs, args.days, args.seeds)
    write_docs(out, args.docs, args.days, args.seeds)
    print(f"wrote {args.docs}/retraining.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
