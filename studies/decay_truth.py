"""``python -m studies.decay_truth``: does any per-group decay ordering beat the shared one-cycle? (issue 60, part 1)

A study with a known answer before any method (docs/results/hdet_history.md, "The truth for decay", pre-registered
before its first run; the text is copied into the report's JSON as ``rule``). At a setting's committed peak rates,
every run under the fairness contract (:class:`studies.contract.Contract`: the same rows, 4,096 of each day reserved
by every run; rollback on; a run that diverges or ends at the base-rate predictor failed), seeds 0 1 2 paired:

- **the rates** (:data:`studies.decay_truth_plan.RATES`): ``best_cell``, plain at the setting's best cell (the
  recovery study's anchor: ``docs/results/lr_recovery/lr_recovery.json`` on the benchmark, the setting's own
  ``docs/results/rule_travels/NAME/lr_recovery.json`` once its neighbourhood is complete); ``range_test``,
  ``hdet=enabled`` as shipped from that cell, each run sweeping and committing before its pass (the sweep does not
  read the decay, so every variant of a seed commits the same rates: the report checks it);
- **the variants** (:data:`studies.decay_truth_plan.VARIANTS`, fixed there): the shared one-cycle (the reference),
  the embedding earlier / later than the dense groups, each dense group fastest in turn, the paper's ordering, the
  shape alone (linear; a WSD tail) and the 3 x 3 grid of (embedding, dense) decay starts; a schedule two variants
  share is trained once.

Per rate source and variant: the paired difference of mean held-out NE against the reference with its 95% interval
(:func:`studies.contract.paired_over_seeds`), failures beside it, each group's LR area against the reference's;
the 2-D landscape; **the gain to find** (the best variant whose interval lies below zero, or none: that is the
result) and the pre-registered rule for part 2 applied to this setting. Results: ``<out>/results.jsonl`` and
``decay_truth.{md,json}`` (default ``docs/results/decay_truth/<benchmark or setting>/``).

Runs are ``python -m recsys_hdet.train +experiment=baseline_low ...`` jobs trained by
:func:`studies.runs.run_one`: resumable (a run with a line is skipped), each line stamped with its commit; a
committed results file is recorded into only from a clean tree (``--allow-dirty`` records elsewhere); ``--verify
RUN`` retrains one recorded run; ``--report-only`` rebuilds the report from the results file; ``--plan`` lists the
runs and trains nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from data_tools.fileio import read_json
from recsys_hdet.constants import PARAM_GROUPS
from studies.contract import COLLAPSED_NE, StudyMismatch, outcome, paired_over_seeds
from studies.decay_truth_plan import (GRID, PCT_START, RATES, REFERENCE, SHARED_SHAPE, VARIANTS, owner, run_base,
                                      runs)
from studies.provenance import REPO
from studies.record import mean_ne
from studies.reporting import fmt, machine_line, preregistered, write_reports
from studies.results import ResultsError, StudyFiles, is_finished, run_name
from studies.runs import AblationConfig, add_study_arguments, print_verification, run_one, verify
from studies.settings import SETTINGS
from studies.starts import ANCHOR_FILE, PRESET, recovery_anchor

RESULTS_ROOT = os.path.join("docs", "results", "decay_truth")
SEEDS = (0, 1, 2)
# Part 2 (an in-run method) is worth building only for a gain its target (half of it) can resolve: 0.001 NE is about
# a 3-seed paired interval's half-width between two schedules at the best cell (docs/results/hdet_history.md).
MIN_GAIN = 0.002
RULE_MARKER = "decay-truth-rule"


def anchor_of(setting: Optional[str]) -> Tuple[float, float]:
    """The best cell the rates come from: the benchmark's recovery anchor, or a setting's own best cell (refused
    while its neighbourhood is not complete: its lr_recovery.json's anchor is then the benchmark's cell)."""
    if setting is None:
        return recovery_anchor(ANCHOR_FILE)
    path = SETTINGS[setting].path("lr_recovery.json")
    anchor = (read_json(path) or {}).get("anchor") or {}
    if anchor.get("setting_best_cell") is not True:
        raise StudyMismatch(f"{path}: the setting's own best cell is not known yet (run its truth first: python -m "
                            f"studies.lr_recovery --setting {setting} --grid-seeds 0 1 --starts best --variants "
                            "plain_rollback)")
    return float(anchor["embedding"]), float(anchor["dense"])


def check_shared(extra: Sequence[str]) -> None:
    """Refuses overrides that move the shared one-cycle the variants are changes of (its rise's end, its shape)."""
    from recsys_hdet.config import compose

    schedule = compose("config", [f"+experiment={PRESET}", *extra]).optim.schedule
    found = (float(schedule.pct_start), str(schedule.anneal_strategy), bool(schedule.three_phase))
    if found != (PCT_START, SHARED_SHAPE, False):
        raise StudyMismatch(f"the runs' shared schedule is (pct_start, anneal_strategy, three_phase) = {found}; the "
                            f"variants are defined on ({PCT_START}, {SHARED_SHAPE!r}, False): drop the override")


def train(files: StudyFiles, rates: Sequence[str], variants: Sequence[str], seeds: Sequence[int],
          anchor: Tuple[float, float], extra: Sequence[str]) -> List[str]:
    """Trains every planned run without a line (:func:`studies.decay_truth_plan.runs`); the crashed runs' names."""
    crashed = []
    for base, seed, overrides in runs(rates, variants, seeds, anchor):
        res = run_one(files, AblationConfig(base, PRESET, base, None, None), seed, [*overrides, *extra])
        r = res["record"]
        if res.get("crashed"):
            crashed.append(run_name(base, seed))
            print(f"{base} seed {seed}: CRASHED (exit status {res['exit_status']}), see {res['log']}", flush=True)
        elif not res["skipped"]:
            print(f"{base} seed {seed}: {r['status']}, mean NE {mean_ne(r)}, {res['process_seconds']:.0f} s", flush=True)
    return crashed


def committed(line: Mapping[str, Any]) -> Optional[Dict[str, float]]:
    """The max LRs a range-test run committed (its line's ``hdet.range_test.committed``)."""
    return (((line.get("hdet") or {}).get("range_test")) or {}).get("committed")


def _geomean(values: Sequence[float]) -> Optional[float]:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def summarize_rates(results: Mapping[str, Mapping[str, Any]], rates: str, seeds: Sequence[int]) -> Dict[str, Any]:
    """One rate source's table: per variant its runs, the paired difference against the reference, the LR area
    against the reference's; the landscape; the gain to find; the range test's commits per seed."""
    def lines(variant: str) -> Dict[int, Dict[str, Any]]:
        found = {s: results.get(run_name(run_base(rates, variant), s)) for s in seeds}
        return {s: dict(r) for s, r in found.items() if r is not None and is_finished(results, r["name"])}

    reference = lines(REFERENCE)
    table: Dict[str, Any] = {}
    for name, v in VARIANTS.items():
        mine = lines(name)
        completed = [mean_ne(r) for r in mine.values() if outcome(r) == "completed"]
        entry: Dict[str, Any] = {
            "family": v.family, "what": v.what, "uniform": v.uniform, "run": run_base(rates, name),
            "decay": {g: {"decay_start": start, "shape": shape} for g, start, shape in v.decay},
            "seeds": sorted(mine), "failed": sorted(s for s, r in mine.items() if outcome(r) == "failed"),
            "mean_ne": statistics.fmean(completed) if completed else None, "paired": None, "below_zero": False}
        if owner(name) != name:
            entry["same_run_as"] = owner(name)
        if owner(name) != REFERENCE and mine and reference:
            p = paired_over_seeds(mine, reference)
            ci = (p["diff"] or {}).get("ci95")
            entry["paired"] = p
            entry["below_zero"] = bool(ci and ci[1] < 0)
            area = {g: _geomean([mine[s]["lr_area"][g] / reference[s]["lr_area"][g] for s in p["seeds"]
                                 if (mine[s].get("lr_area") or {}).get(g) and (reference[s].get("lr_area") or {}).get(g)])
                    for g in PARAM_GROUPS}
            entry["lr_area_vs_shared"] = {g: a for g, a in area.items() if a is not None}
        table[name] = entry
    winners = [(n, e) for n, e in table.items() if e["below_zero"] and not e["failed"] and "same_run_as" not in e]
    best = min(winners, key=lambda ne: ne[1]["paired"]["diff"]["mean"], default=None)
    gain = None if best is None else {"variant": best[0], "mean": best[1]["paired"]["diff"]["mean"],
                                      "ci95": best[1]["paired"]["diff"]["ci95"], "uniform": best[1]["uniform"]}
    landscape = {f"{e:g}": {f"{d:g}": _cell(table[f"grid_e{e:g}_d{d:g}"]) for d in GRID} for e in GRID}
    out = {"what": RATES[rates], "variants": table, "gain": gain, "landscape": landscape}
    if rates == "range_test":
        out["commits"] = {str(s): _commits(results, rates, s) for s in seeds}
    return out


def _cell(entry: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """A landscape cell: the variant's paired difference (the reference's own cell: 0 by definition)."""
    if entry["family"] == "reference" or entry.get("same_run_as") == REFERENCE:
        return {"mean": 0.0, "ci95": None, "reference": True}
    d = (entry["paired"] or {}).get("diff")
    return None if d is None else {"mean": d["mean"], "ci95": d["ci95"]}


def _commits(results: Mapping[str, Mapping[str, Any]], rates: str, seed: int) -> Dict[str, Any]:
    """A seed's committed rates (the reference's run's) and whether every variant's run of the seed committed them."""
    seen = {o: committed(results[run_name(run_base(rates, o), seed)]) for o in dict.fromkeys(map(owner, VARIANTS))
            if run_name(run_base(rates, o), seed) in results}
    ref = seen.get(REFERENCE)
    return {"committed": ref, "runs": len(seen), "consistent": all(c == ref for c in seen.values())}


def part2_verdict(per_rates: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The pre-registered rule on this setting: a separate ordering (groups on different schedules) whose interval
    lies below zero at both rate sources, with a paired gain of at least :data:`MIN_GAIN` at each and no failed run."""
    if set(per_rates) != set(RATES):
        return {"met": None, "why": "not judged: both rate sources are needed"}
    passing = []
    distinct = {n: v for n, v in VARIANTS.items() if owner(n) == n}  # a schedule two variants share counts once
    for name, v in distinct.items():
        entries = [per_rates[r]["variants"][name] for r in RATES]
        if name != REFERENCE and not v.uniform and all(
                e["below_zero"] and not e["failed"] and e["paired"]["diff"]["mean"] <= -MIN_GAIN for e in entries):
            passing.append({"variant": name, "gain": max(e["paired"]["diff"]["mean"] for e in entries)})
    uniform = [n for n, v in distinct.items() if v.uniform and n != REFERENCE
               and all(per_rates[r]["variants"][n]["below_zero"] for r in RATES)]
    return {"met": bool(passing), "orderings": passing, "uniform_below_zero_at_both": uniform,
            "why": (f"an ordering pays here: {', '.join(p['variant'] for p in passing)}" if passing else
                    f"no separate ordering has its interval below zero with a gain of at least {MIN_GAIN} at both rate "
                    "sources")}


def study(files: StudyFiles, rates: Sequence[str], seeds: Sequence[int], anchor: Tuple[float, float]) -> Dict[str, Any]:
    """The report's figures from the results file alone."""
    per_rates = {r: summarize_rates(files.results, r, seeds) for r in rates}
    planned = runs(rates, list(VARIANTS), seeds, anchor)
    missing = [run_name(b, s) for b, s, _ in planned if not is_finished(files.results, run_name(b, s))]
    out = {"anchor": {"embedding": anchor[0], "dense": anchor[1]}, "seeds": list(seeds), "reference": REFERENCE,
           "contract": {"overrides": files.contract.overrides() if files.contract else None,
                        "failed": f"diverged, or held-out NE >= {COLLAPSED_NE} on some task",
                        "paired": f"variant - {REFERENCE} on the seeds where both completed; failures beside"},
           "rates": per_rates, "part2": part2_verdict(per_rates), "runs_planned": len(planned),
           "rule": rule()}
    if missing:
        out["partial"] = f"{len(planned) - len(missing)} of {len(planned)} runs finished"
    return out


def rule() -> str:
    """The pre-registered rule's text (docs/results/hdet_history.md, between its ``decay-truth-rule`` markers)."""
    try:
        return preregistered(os.path.join(REPO, "docs", "results", "hdet_history.md"), RULE_MARKER)
    except ValueError as e:
        raise StudyMismatch(str(e)) from None


def _ci(d: Optional[Mapping[str, Any]]) -> str:
    if not d:
        return "-"
    ci = d.get("ci95")
    return f"{d['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")


def render(result: Mapping[str, Any]) -> str:
    setting = result.get("setting")
    lines = [f"# The truth for decay: {setting['name'] if setting else 'the benchmark'}", "",
             f"Produced by `{result.get('command', 'python -m studies.decay_truth')}` on {result.get('machine', '')}."
             + (f" **Partial: {result['partial']}.**" if result.get("partial") else ""), "",
             f"Best cell: embedding {result['anchor']['embedding']:.6g}, dense {result['anchor']['dense']:.6g}; seeds "
             f"{', '.join(map(str, result['seeds']))}; contract {result['contract']['overrides']}; failed: "
             f"{result['contract']['failed']}. Each row: variant - `{REFERENCE}` (mean held-out NE over the tasks), "
             "paired over the seeds both completed, with its 95% interval; LR area: the pass's mean LR against the "
             "shared schedule's (embedding / transformer / non_embedding / no_decay).", ""]
    for rates, t in result["rates"].items():
        lines += [f"## Rates: {rates}", "", t["what"] + ".", "",
                  "| variant | decay start (shape): emb / tr / ne / nd | seeds | failed | mean NE | - shared [95% CI] "
                  "| LR area vs shared |", "|---|---|---|---|---|---|---|"]
        for name, e in t["variants"].items():
            decay = " / ".join(f"{d['decay_start']:g}{'' if d['shape'] == 'cos' else ' ' + d['shape']}"
                               for d in e["decay"].values())
            area = " / ".join(f"{e.get('lr_area_vs_shared', {}).get(g, float('nan')):.2f}" for g in PARAM_GROUPS) \
                if e.get("lr_area_vs_shared") else "-"
            same = f" (= {e['same_run_as']})" if "same_run_as" in e else ""
            mark = " **below 0**" if e["below_zero"] else ""
            lines.append(f"| {name}{same} | {decay} | {len(e['seeds'])} | {', '.join(map(str, e['failed'])) or '-'} | "
                         f"{fmt(e['mean_ne'])} | {_ci((e['paired'] or {}).get('diff'))}{mark} | {area} |")
        lines += ["", "The landscape (rows: the embedding's decay start; columns: the dense groups'):", "",
                  "| embedding \\ dense | " + " | ".join(f"{d:g}" for d in GRID) + " |", "|---" * (len(GRID) + 1) + "|"]
        for e, row in t["landscape"].items():
            lines.append(f"| {e} | " + " | ".join("reference" if (c or {}).get("reference") else _ci(c)
                                                  for c in row.values()) + " |")
        g = t["gain"]
        lines += ["", f"**The gain to find:** {'none: no variant has its interval below zero' if g is None else ''}"
                  + ("" if g is None else f"`{g['variant']}` {_ci(g)}"
                     + (" (every group on one schedule: a better shared schedule, not an ordering)" if g["uniform"]
                        else "")), ""]
        if "commits" in t:
            lines += ["Committed rates per seed (the reference's run; every variant's run of the seed must commit "
                      "the same):", ""]
            for seed, c in t["commits"].items():
                rates_text = ", ".join(f"{k} {v:.4g}" for k, v in (c["committed"] or {}).items()) or "not run yet"
                lines.append(f"- seed {seed}: {rates_text}; {c['runs']} runs, "
                             f"{'consistent' if c['consistent'] else '**NOT consistent**'}")
            lines.append("")
    p = result["part2"]
    lines += ["## Part 2 (an in-run method): the pre-registered rule on this setting", "",
              f"{'Met' if p['met'] else 'Not met' if p['met'] is False else 'Not judged'}: {p['why']}."
              + (f" Uniform changes below zero at both rate sources: {', '.join(p['uniform_below_zero_at_both'])}."
                 if p.get("uniform_below_zero_at_both") else ""), "", "The rule, as written before the first run:",
              "", result["rule"], ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.decay_truth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", choices=sorted(SETTINGS), default=None,
                    help="a setting of studies/settings.py: its overrides before the positional ones, its own best "
                         f"cell, --out {RESULTS_ROOT}/NAME (default: the benchmark, {RESULTS_ROOT}/benchmark)")
    ap.add_argument("--rates", nargs="+", choices=list(RATES), default=list(RATES))
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="train only these (the reference always; the others' finished runs are still reported)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--anchor", type=float, nargs=2, metavar=("EMBEDDING", "DENSE"), default=None,
                    help="the peak rates' cell (default: the benchmark's or the setting's best cell)")
    ap.add_argument("--out", default=None, help="the study directory: results.jsonl and decay_truth.{md,json}")
    ap.add_argument("--work", default=None, help="where the run directories go (default outputs/studies/decay_truth_<name>)")
    ap.add_argument("--report-only", action="store_true", help="train nothing: the report from the results file")
    ap.add_argument("--plan", action="store_true", help="list the runs still to train, and how many; train nothing")
    add_study_arguments(ap)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. data=tiny trainer.nproc=2)")
    args = ap.parse_args(argv)
    setting = SETTINGS[args.setting] if args.setting else None
    name = setting.name if setting else "benchmark"
    args.out = args.out or os.path.join(RESULTS_ROOT, name)
    extra = [*(setting.overrides if setting else ()), *args.overrides]
    train_now = not (args.report_only or args.plan) and args.verify is None
    try:
        anchor = tuple(args.anchor) if args.anchor else anchor_of(args.setting)
        files = StudyFiles.open(args.out, args.work or os.path.join(REPO, "outputs", "studies", f"decay_truth_{name}"),
                                allow_dirty=args.allow_dirty, train=train_now)
        if args.verify is not None:
            return print_verification(args.verify, verify(files, args.verify))
        if args.plan:
            todo = [(b, s) for b, s, _ in runs(args.rates, args.variants, args.seeds, anchor)
                    if not is_finished(files.results, run_name(b, s))]
            for b, s in todo:
                print(run_name(b, s))
            print(f"{len(todo)} runs to train of {len(runs(args.rates, args.variants, args.seeds, anchor))} planned")
            return 0
        if train_now:
            check_shared(extra)
        crashed = train(files, args.rates, args.variants, args.seeds, anchor, extra) if train_now else []
        result = study(files, args.rates, args.seeds, anchor)
    except (StudyMismatch, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["command"] = "python -m studies.decay_truth " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
    if setting:
        result["setting"] = setting.record()
    write_reports(files.out, "decay_truth", result, render(result))
    print(f"wrote decay_truth.md/.json into {files.out}" + (f" (partial: {result['partial']})" if result.get("partial")
                                                              else ""), flush=True)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
