"""Small paired studies on the benchmark data: named sets of configurations, each trained on the
same seeds, compared by paired differences of held-out NE (mean over the three tasks).

Sets (``--set``), each at a start of the recovery study (``studies.starts.STARTS``: factors of the anchor
that ``docs/results/lr_recovery/lr_recovery.json`` names, the best cell of the recovery grid):
- ``embedding_window``: what averaging the embedding replicas only every T steps costs when the
  embedding LR is spread. HDET at ``old_tuned`` (embedding 10x below the best cell, dense 3x above it:
  not on the plateau) with the spread fixed (``hdet.autolr=false``, so the controller moves nothing),
  the embedding replicas averaged at every sync (T = 50, the default when spread) against every step
  (``hdet.embedding_sync_every=1``); the dense replicas are averaged every T in both; the HDET form of the
  earlier defaults (:data:`HDET_PROBE_REGRESSION`).
- ``local_sgd``: what independent dense replicas between syncs (``trainer.dense_gradients=local``,
  no dense gradient all-reduce; the syncs average the replicas) cost in NE, with the product's
  default HDET form (``studies.hdet_forms.HDET_ANNEAL_EFFECT``) at ``old_tuned``, against the same form with
  the all-reduce.
Both HDET-against-HDET sets ran before the fairness contract; they train the same rows and rollback
on both sides (the reserved probe rows and the trainer's default rollback), so their pairs are fair;
a set trained from now on gets the contract's overrides (:data:`studies.contract.CONTRACT`).

One line per run in ``docs/results/paired_runs/<set>/results.jsonl`` (:mod:`studies.results`; resumable;
``--report-only`` rebuilds ``docs/results/paired_runs/<set>.md`` and ``.json`` from it); run directories under
``outputs/studies/<set>``. A retired set (``recovery_rollback``: the earlier recovery study's dense-10x-high starts
rerun with rollback, superseded by the recovery study under the fairness contract) is no longer defined here: its
results file and report are kept as recorded, as data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from studies.contract import CONTRACT, StudyMismatch, outcome
from studies.hdet_forms import HDET_ANNEAL_EFFECT
from studies.provenance import REPO
from studies.results import StudyFiles, append, is_finished
from studies.runs import StudyError, add_study_arguments, print_verification, train_record, verify
from studies.starts import PRESET, lr_overrides, recovery_anchor, start_lrs
from studies.stats import paired_ci95

# The earlier defaults (probe signal, regression score), dominated in the earlier recovery study
# (docs/results/lr_recovery/lr_recovery_f2): the form the embedding_window set trained with.
HDET_PROBE_REGRESSION = ("hdet=controller", "hdet.space=log", "hdet.score=regression", "hdet.signal=probe", "hdet.alpha=0.25",
            "hdet.controller_start=0", "hdet.beta=0.9", "hdet.travel_decades=3.0")
COMMON = (f"+experiment={PRESET}", "trainer.checkpoint=false", "trainer.tensorboard=false")
# The point the recovery study's starts are factors of (docs/results/lr_recovery/lr_recovery.json), read once.
ANCHOR = recovery_anchor()


def at(start: str) -> List[str]:
    return lr_overrides(*start_lrs(start, ANCHOR))


@dataclass(frozen=True)
class PairedSet:
    title: str
    configs: Dict[str, Tuple[str, ...]]  # name -> overrides (besides COMMON and the seed)
    pairs: Tuple[Tuple[str, str], ...]  # (a, b): report a - b paired by seed
    seeds: Tuple[int, ...] = (0, 1, 2)


SETS = {
    "embedding_window": PairedSet(
        "The embedding window's cost: spread embedding replicas averaged every T vs every step (at old_tuned)",
        {"window": (*at("old_tuned"), *HDET_PROBE_REGRESSION, "hdet.autolr=false"),
         "every_step": (*at("old_tuned"), *HDET_PROBE_REGRESSION, "hdet.autolr=false",
                        "hdet.embedding_sync_every=1")},
        (("window", "every_step"),)),
    "local_sgd": PairedSet(
        "Independent dense replicas between syncs (local SGD) against the dense all-reduce, default HDET form "
        "(at old_tuned)",
        {"allreduce": (*at("old_tuned"), *HDET_ANNEAL_EFFECT),
         "local": (*at("old_tuned"), *HDET_ANNEAL_EFFECT, "trainer.dense_gradients=local")},
        (("local", "allreduce"),)),
}


def run_set(pset: PairedSet, results: Dict[str, Dict[str, Any]], path: str, work: str) -> int:
    status = 0
    for seed in pset.seeds:  # seed-major: an interrupted set has whole pairs
        for config, extra in pset.configs.items():
            name = f"{config}/seed{seed}"
            if is_finished(results, name):
                continue
            try:
                record = train_record(work, name, [*COMMON, f"seed={seed}", *CONTRACT.apply(extra)])
            except StudyError as e:
                print(f"error: {e}", file=sys.stderr)
                status = 2
                continue
            append(path, record)
            results[name] = record
            print(f"{name}: {record['status']}, mean NE {record['mean_ne']}, {rollbacks(record)} rollback(s), "
                  f"{record['process_seconds']:.0f} s", flush=True)
    return status


def rollbacks(record: Dict[str, Any]) -> int:
    return int((record.get("rollback") or {}).get("count", 0))


def summarize(pset: PairedSet, results: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    configs = {}
    for config in pset.configs:
        runs = {s: results.get(f"{config}/seed{s}") for s in pset.seeds}
        ok = {s: r["mean_ne"] for s, r in runs.items() if outcome(r) == "completed"}
        configs[config] = {"runs": sum(r is not None for r in runs.values()), "completed": len(ok),
                           "mean_ne": statistics.fmean(ok.values()) if ok else None, "ne_per_seed": ok,
                           "rollbacks_per_seed": {s: rollbacks(r) for s, r in runs.items() if r},
                           # training speed of the completed runs (side by side only within one session)
                           "examples_per_sec": statistics.median(runs[s]["examples_per_sec"] for s in ok) if ok else None,
                           "statuses": {s: ("collapsed" if outcome(r) == "failed" and r["status"] == "completed"
                                            else r["status"]) for s, r in runs.items() if r}}
    pairs = []
    for a, b in pset.pairs:
        seeds = sorted(set(configs[a]["ne_per_seed"]) & set(configs[b]["ne_per_seed"]))
        ci = paired_ci95([configs[a]["ne_per_seed"][s] - configs[b]["ne_per_seed"][s] for s in seeds])
        pairs.append({"a": a, "b": b, "seeds": seeds, "mean": ci[0] if ci else None, "ci95": list(ci[1:]) if ci else None})
    return {"configs": configs, "pairs": pairs, "runs": sum(c["runs"] for c in configs.values()),
            "completed": sum(c["completed"] for c in configs.values())}


def render(name: str, pset: PairedSet, summary: Dict[str, Any]) -> str:
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    lines = [f"# {pset.title}", "", f"Generated by `python -m studies.paired_runs --set {name}` (the method is in its "
             "docstring). NE: held-out NE, mean over the three tasks; a run at NE >= 0.999 on a task is 'collapsed' "
             "(failed) and never paired.", "",
             f"{summary['completed']} of {summary['runs']} runs completed ({len(pset.configs) * len(pset.seeds)} "
             "planned).", "", "| configuration | completed | mean NE (completed) | NE per seed | rollbacks per seed | "
             "examples/s (median) |", "|---|---|---|---|---|---|"]
    for config, c in summary["configs"].items():
        per_seed = ", ".join(f"{s}: {fmt(c['ne_per_seed'].get(s)) if c['statuses'].get(s) == 'completed' else c['statuses'].get(s, 'not run')}"
                             for s in pset.seeds)
        rollbacks = ", ".join(f"{s}: {n}" for s, n in c["rollbacks_per_seed"].items()) or "-"
        speed = "-" if c.get("examples_per_sec") is None else f"{c['examples_per_sec']:,.0f}"
        lines.append(f"| {config} | {c['completed']} / {c['runs']} | {fmt(c['mean_ne'])} | {per_seed} | {rollbacks} | {speed} |")
    lines += ["", "| paired difference | seeds | mean | 95% CI |", "|---|---|---|---|"]
    for p in summary["pairs"]:
        ci = "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]"
        mean = "-" if p["mean"] is None else f"{p['mean']:+.4f}"
        lines.append(f"| {p['a']} - {p['b']} | {len(p['seeds'])} | {mean} | {ci} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.paired_runs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "results", "paired_runs"))
    parser.add_argument("--work", help="run directories (default: outputs/studies/<set>)")
    parser.add_argument("--report-only", action="store_true")
    add_study_arguments(parser)
    args = parser.parse_args(argv)
    pset = SETS[args.set]
    train_now = not args.report_only and args.verify is None
    try:
        files = StudyFiles.open(os.path.join(args.out, args.set), args.work or os.path.join(REPO, "outputs", "studies",
                                                                                             args.set),
                                   allow_dirty=args.allow_dirty, train=train_now)
        if args.verify is not None:
            return print_verification(args.verify, verify(files, args.verify))
    except StudyMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path, results = files.results_path, files.results
    status = 0 if args.report_only else run_set(pset, results, path, files.work)
    summary = summarize(pset, results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.set}.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    with open(os.path.join(args.out, f"{args.set}.md"), "w") as f:
        f.write(render(args.set, pset, summary))
    print(render(args.set, pset, summary))
    return status


if __name__ == "__main__":
    sys.exit(main())
