"""``python -m studies.retrain_compare``: HDET on each new day vs plain, in the scheduled retraining job.

``--arm hdet`` (the default): the controller (``hdet=controller``), into ``retraining.{md,json}``; ``--arm range_test``:
the range test on the replicas (``hdet=enabled``, sweeping from each day's warm start), into
``retraining_range_test.{md,json}``, with each day's committed multipliers and off-the-map flags. The plain arm is
the reference of both (one registry per seed, shared).

Per seed (``--seeds``, paired: both arms of a seed share its cold start and the job's ``seed``), one
cold start (version 1, plain, on the first 3 days of the retrain_demo data set) is copied into two
registries; then for each of ``--days`` new days (appended to the shared data set, same ground
truth, drift continued) both run the scheduled job (experiment ``retrain_daily``, warm start from the
published model, ``carry_lr`` off): ``hdet`` with ``hdet=controller`` (conf/hdet/controller.yaml's controller
explores on every day), ``plain`` with ``hdet=disabled``. The ``hdet`` arm's setting differs from the
plain cold start's, so it runs with ``allow_config_change=true`` until it has published a day of its own. Writes
``docs/results/retrain_compare/retraining.{md,json}``: per day and arm, the candidate's held-out NE per task (the
day's held-out slice), the oracle's NE on the same rows, the gate's decision and the LRs the day trained with.

The report gives, per day, each seed's hdet - plain difference of the mean held-out NE, each seed's
mean over its days, and the mean over every (seed, day) pair with a 95% t-interval taking the pairs as
independent (a seed's days are chained through its registry: the true one is wider). The retraining
job explores each day only if this shows it helps (docs/results/hdet_history.md, "The rule applied").

Resumable: the data set (shared by the seeds) is appended only up to the days asked for, and the
job itself skips days already trained, so a rerun continues where it stopped. Options: ``--out DIR``
(default ``outputs/retrain_compare``), ``--days N`` (default 5), ``--seeds S ...`` (default 0 1),
``--nproc N`` (default 2), ``--docs DIR`` (default ``docs/results/retrain_compare``). The earlier form of this
study (carried learning rates against the static config, both arms HDET) is kept as recorded in
docs/results/retrain_compare/retraining_carry_lr.md.
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
from studies.provenance import code_state
from studies.stats import paired
from pipelines.registry import Registry
from pipelines.retrain_demo import DEMO_CONTROLLER, retrain_command
from recsys_hdet.config import CONF_DIR
from recsys_hdet.constants import TASKS
from data_tools.contract import has_meta, read_meta
from data_tools.exit_status import ExitStatus

# arm -> the training overrides of its days (after the demo overrides); the cold start trains plain. Every run
# reserves the HDET probe's rows (hdet.probe_rows in the controller's demo overrides), so all arms train the same rows.
SAME_ROWS = ("data.reserve_rows=1024",)
ARMS = {"hdet": (*DEMO_CONTROLLER, *SAME_ROWS), "range_test": ("hdet=enabled", *SAME_ROWS),
        "plain": ("hdet=disabled", *SAME_ROWS)}
# The contender arm (--arm) -> its report's name and what it runs (the plain arm is every contender's reference).
CONTENDERS = {"hdet": ("retraining", "`hdet=controller` (conf/hdet/controller.yaml's controller, exploring on every day)"),
              "range_test": ("retraining_range_test", "`hdet=enabled` (the range test on the replicas, sweeping "
                             "from the warm start on every day; an axis whose curve never descends keeps the "
                             "preset's rates: hdet.range_test.off_map=keep)")}
COLD_START = ("hdet=disabled", *SAME_ROWS)


def _run(cmd: List[str], log_path: str) -> int:
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)


def _max_lrs(version_dir: str) -> Dict[str, float]:
    """The max LR per group the version's run trained with (its resolved config)."""
    from recsys_hdet.run_dir import RunDir

    lr = RunDir(version_dir).config().optim.lr
    return {g: float(lr[g]) for g in lr}


def collect(out: str, arms: List[str]) -> Dict[str, Any]:
    """{day: {arm: row}} from one seed's registries of ``arms``."""
    rows: Dict[str, Dict[str, Any]] = {}
    for arm in arms:
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
                "max_lr": _max_lrs(reg.version_dir(v)), "reasons": m["gate"].get("reasons", []),
                "range_test": _range_test(reg.version_dir(v))}
    return rows


def _range_test(version_dir: str) -> Any:
    """What the version's range test committed and flagged per axis (None without one)."""
    from recsys_hdet.run_dir import RunDir

    record = ((RunDir(version_dir).summary() or {}).get("hdet") or {}).get("range_test")
    if not record:
        return None
    return {axis: {"multiplier": a["multiplier"], "suggested": a.get("suggested"), "off_map": a.get("off_map", []),
                   "descent": a.get("descent")} for axis, a in record["axes"].items()}


def from_cold_start(registry: str) -> bool:
    """Whether the registry's published version is still the cold start (no day of its own published)."""
    reg = Registry(registry)
    current = reg.current()
    return current is None or bool(reg.manifest(current).get("cold_start"))


def seed_dir(out: str, seed: int) -> str:
    return os.path.join(out, f"seed{seed}")


def _ci(p: Any) -> str:
    if p is None:
        return "-"
    ci = p["ci95"]
    return f"{p['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")


def write_docs(out: str, docs: str, days_asked: int, seeds: List[int], arm: str = "hdet") -> None:
    arms = [arm, "plain"]
    name, what = CONTENDERS[arm]
    per_seed = {s: collect(seed_dir(out, s), arms) for s in seeds}
    days = sorted({d for rows in per_seed.values() for d in rows})
    both = lambda s, d: set(per_seed[s].get(d, {})) >= set(arms)
    mean = lambda r: statistics.fmean(r["ne"][t] for t in TASKS)
    diff = {(s, d): mean(per_seed[s][d][arm]) - mean(per_seed[s][d]["plain"])
            for s in seeds for d in days if both(s, d)}
    complete_days = [d for d in days if all(both(s, d) for s in seeds)]
    table = [f"| day | seed | {arm} NE (mean) | plain NE (mean) | {arm} - plain | oracle NE (mean) "
             f"| {arm}: published? | plain: published? | {arm}: " + ("bases it ended with, embedding / transformer |"
                                                                  if arm == "hdet" else "committed multiplier per axis "
                                                                  "(the rule's, flags) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    decision = lambda r: r["status"] + (f" ({'; '.join(r['reasons'])})" if r["reasons"] else "")
    for d in days:
        for s in seeds:
            if not both(s, d):
                continue
            h, p = per_seed[s][d][arm], per_seed[s][d]["plain"]
            ended = f"{h['hdet_bases']['embedding']:.3g} / {h['hdet_bases']['transformer']:.3g}" if h["hdet_bases"] else "-"
            if h.get("range_test"):
                ended = "; ".join(f"{a} x{x['multiplier']:.3g} (x{x['suggested']:.3g}"
                                  + (f", {', '.join(x['off_map'])}" if x["off_map"] else "") + ")"
                                  for a, x in h["range_test"].items())
            table.append(f"| {d} | {s} | {mean(h):.4f} | {mean(p):.4f} | {diff[(s, d)]:+.4f} | "
                         f"{statistics.fmean(h['oracle_ne'][t] for t in TASKS):.4f} "
                         f"| {decision(h)} | {decision(p)} | {ended} |")
    per_task = ["| day | seed | arm | " + " | ".join(TASKS) + " |", "|---|---|---|" + "---|" * len(TASKS)]
    for d in days:
        for s in seeds:
            if both(s, d):
                for a in arms:
                    per_task.append(f"| {d} | {s} | {a} | "
                                    + " | ".join(f"{per_seed[s][d][a]['ne'][t]:.4f}" for t in TASKS) + " |")
    seed_means = [statistics.fmean(diff[(s, d)] for d in complete_days) for s in seeds] if complete_days else []
    over_seeds, over_pairs = paired(seed_means), paired([diff[(s, d)] for s in seeds for d in complete_days])
    published = {a: sum(per_seed[s][d][a]["status"] == "published" for s in seeds for d in complete_days)
                 for a in arms}
    runs = len(seeds) * len(complete_days)
    verdict = ("no day finished in both arms of every seed yet" if not complete_days else
               f"Over {len(complete_days)} day(s) x {len(seeds)} seed(s): published days {arm} {published[arm]} "
               f"of {runs}, plain {published['plain']} of {runs}. {arm} minus plain mean NE (negative = {arm} "
               "better), per seed over its days: " + ", ".join(f"seed {s} {m:+.4f}" for s, m in zip(seeds, seed_means))
               + f"; over the {runs} (seed, day) pairs {_ci(over_pairs)} (95% t-interval taking the pairs as "
               "independent: a seed's days are chained through its registry, so the true interval is wider).")
    partial = "" if len(complete_days) >= days_asked else (
        f"**PARTIAL: {len(complete_days)} of {days_asked} days finished in both arms of every seed;** rerun the "
        "command to continue.\n\n")
    commit = code_state()
    md = f"""# Scheduled retraining: {arm} on each new day vs plain

{partial}Produced by `python -m studies.retrain_compare --arm {arm} --seeds {' '.join(map(str, seeds))} --days {days_asked}` on
{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, commit {commit['commit']}{'' if commit['clean'] else ' (dirty tree)'}.
Data: the retrain_demo synthetic set (`conf/data/retrain_demo.yaml`), 3 days for each seed's cold start
(version 1, plain), then one day appended at a time. Each day both registries of a seed run
`python -m pipelines.retrain seed=S` (experiment `retrain_daily`, warm start from the published model,
2 workers, `carry_lr` off): `{arm}` with {what}, `plain` with `hdet=disabled`. NE: the day's held-out slice (10% of the day, about 1,600 rows,
never trained on), scored by the candidate of that day; the oracle is the generator's true
probabilities on the same rows. Both arms train the same rows (1,024 of each day reserved for HDET's probe,
in the plain arm too) with rollback on (the trainer's default).

{verdict}

{chr(10).join(table)}

Per task (held-out NE of each day's candidate):

{chr(10).join(per_task)}

Raw figures: `docs/results/retrain_compare/{name}.json`. The earlier form of this study (carried learning rates against the
static config, both arms HDET): [retraining_carry_lr.md](retraining_carry_lr.md).
"""
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, f"{name}.json"), "w") as f:
        json.dump({"commit": commit["commit"], "clean": commit["clean"], "seeds": {str(s): per_seed[s] for s in seeds},
                   f"difference_{arm}_minus_plain": {"per_seed_day": {f"{s}/{d}": v for (s, d), v in diff.items()},
                                                   "over_seeds": over_seeds, "over_pairs": over_pairs},
                   "published": published, "days": len(complete_days)},
                  f, indent=1)
    with open(os.path.join(docs, f"{name}.md"), "w") as f:
        f.write(md)


def main(argv=None) -> int:
    from omegaconf import OmegaConf

    from data_tools.prepare import append_synthetic_days, ensure_dataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/retrain_compare")
    ap.add_argument("--days", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--docs", default="docs/results/retrain_compare")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--arm", choices=sorted(CONTENDERS), default="hdet",
                    help="the contender against plain: hdet (the controller; retraining.md) or range_test (hdet=enabled; "
                         "retraining_range_test.md)")
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)
    arms = {a: ARMS[a] for a in (args.arm, "plain")}
    if args.report_only:
        write_docs(out, args.docs, args.days, args.seeds, args.arm)
        return 0
    data = os.path.join(out, "data")
    log = os.path.join(out, "compare.log")
    os.makedirs(out, exist_ok=True)
    spec = OmegaConf.load(os.path.join(CONF_DIR, "data", "retrain_demo.yaml"))
    base_days = int(spec.generator.days)
    if not has_meta(data):
        ensure_dataset(data, OmegaConf.to_container(spec.generator), {})
    for seed in args.seeds:
        cold = os.path.join(seed_dir(out, seed), "cold")
        if not Registry(cold).current():
            code = _run(retrain_command(cold, data, args.nproc, ["create=true", "until=" + sorted(read_meta(data)["days"])[
                base_days - 1]], COLD_START) + [f"seed={seed}"], log)
            if code != ExitStatus.OK:
                print(f"the cold start of seed {seed} failed (exit {code}); see {log}")
                return 1
        for arm in arms:
            if not os.path.isdir(os.path.join(seed_dir(out, seed), arm)):
                shutil.copytree(cold, os.path.join(seed_dir(out, seed), arm), symlinks=True)
    for k in range(args.days):
        have = len(read_meta(data)["days"])
        if have < base_days + k + 1:
            append_synthetic_days(data, 1)
        day = sorted(read_meta(data)["days"])[base_days + k]
        for seed in args.seeds:
            for arm, overrides in arms.items():
                t0 = time.time()
                registry = os.path.join(seed_dir(out, seed), arm)
                # The hdet arm's setting differs from the plain cold start's until the arm publishes a day of its own.
                changed = ["allow_config_change=true"] if overrides != COLD_START and from_cold_start(registry) else []
                code = _run(retrain_command(registry, data, args.nproc, [f"until={day}"], overrides)
                            + [*changed, f"seed={seed}"], log)
                print(f"day {day} seed {seed} {arm}: exit {code}, {time.time() - t0:.0f} s", flush=True)
                if code not in (ExitStatus.OK, ExitStatus.REJECTED, ExitStatus.NOTHING_TO_DO):
                    print(f"failed; see {log}")
                    return 1
        write_docs(out, args.docs, args.days, args.seeds, args.arm)
    write_docs(out, args.docs, args.days, args.seeds, args.arm)
    print(f"wrote {args.docs}/{CONTENDERS[args.arm][0]}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
