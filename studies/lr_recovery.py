"""``python -m studies.lr_recovery``: can one HDET run find each group's learning rate?

A study with a known answer, on the benchmark data set, cold start (no warm-start checkpoint),
every run under the fairness contract (:class:`studies.contract.Contract`, docs/studies.md): the
same rows trained (4,096 rows of each day reserved by every contender), rollback on for every
contender, a run that diverges or ends at the base-rate predictor (NE >= 0.999 on a task) failed.

1. **The anchor** is the best cell of the earlier recovery grid, read from the report's JSON
   (``docs/results/lr_recovery/lr_recovery.json``, ``anchor``), not a constant; every start is a factor of it.
2. **The neighbourhood**: the anchor's cell and its 8 grid neighbours (half a decade apart on each
   axis), every seed; while the best cell (lowest mean NE, every seed run) lacks a neighbour, that
   neighbourhood is trained too (:func:`neighbourhood_runs`). The plateau (:func:`plateau_analysis`):
   the cells within one *pooled* paired std of the best (per-seed differences from the best, pooled
   over every cell that shares 2+ seeds with it), not within half a decade of a failed cell.
3. **The starts** (:data:`STARTS`, and any passed with ``--start NAME=EMB_FACTOR,DENSE_FACTOR``), seeds 0 1 2
   each, and the contenders (:data:`VARIANTS`), each planned at a start by :func:`planned`:
   - ``plain_rollback``: the plain run at the start (the reference every contender is paired with),
   - ``hdet_range_test``: the range test on the replicas (:data:`HDET_RANGE_TEST`: the replicas sweep each
     axis for 100 steps from x0.001 to x10000 of the start before the pass, commit fastai's suggestion, and
     the pass trains plain from step 0 at the committed max LRs); its cost counts the sweep's steps,
   - ``prodigy``: Prodigy as its authors run it (d0 1e-6, the dense LR multiplier 1: the start's
     dense LR does not enter, so runs with the same embedding LR are one run),
   - ``schedulefree``: Schedule-Free AdamW at the start's dense LR, constant, with its own warm-up
     (optim.dense.type=schedulefree_adamw), the embedding on exactly the plain run's schedule,
   - ``lr_finder``: the LR range test (Smith 2017; fastai's ``lr_find``, the product's
     ``python -m recsys_hdet.lr_find`` default sweep) before a plain run: two short sweeps from the start's
     initial model, one per axis, 100 steps from x0.001 to x10000 (:func:`studies.range_tests.finder_sweeps`),
     each suggesting the multiplier at the smoothed loss's minimum / 10 (fastai's rule and smoothing;
     :func:`studies.range_tests.sweep_suggestion`, read with each sweep's own recorded range); then a
     plain run at the suggested LRs. Its cost counts the sweeps' steps and
     seconds. Its runs are ``{start}/lr_finder_wide...``,
   - planned at every start: the five above. The earlier contenders, read and reported where recorded:
     ``hdet`` (the product's earlier default, conf/hdet/controller.yaml) and the controller issue's
     pre-registered variants (``hdet_explore``, ``hdet_effect_fixed``, ``hdet_aimd``, ``hdet_rprop``):
     dominated (every one missed every target), so planned only at the starts they were planned at before
     (``hdet`` at the seven earlier starts, the variants at :data:`CONTROLLER_STARTS`), never at emb_low_30,
     all_high_3 or a ``--start`` start; ``lr_finder_narrow``: the finder with the earlier default sweep
     (x0.01 to x100), its runs ``{start}/lr_finder...``, retired: never trained again.
4. ``lr_recovery.json`` and ``lr_recovery.md``: per start and contender the paired difference against
   ``plain_rollback`` (same seed, only where both completed) with a 95% t-interval, the failures beside
   it, the gap closed (misset starts), each group's LR area and whether it lies in the plateau's range,
   and the cost against plain + rollback (``cost``: the steps ratio from the runs, the wall ratio from the
   side-by-side benchmark ``benchmarks/results.json`` ``contender_cost`` where it has one); the controller
   issue's targets (``targets[<hdet variant>]``) and the range test's (issue 46, ``targets["hdet_range_test"]``,
   :func:`range_test_targets`).

**A start from the command line** (``--start odd=0.02,40``: factors of the anchor, any positive finite numbers)
is trained and reported like the others, with the same contract, seeds and contenders. It persists through
the results file: the report lists every start of :data:`STARTS` and every start that has a results line of
a run at the start's own LRs (``{name}/schedulefree``, ``{name}/hdet_range_test``, or ``{name}/plain_rollback``
off the lattice: :func:`recorded_starts` reads its factors back from the line's max LRs over the anchor);
a start passed with ``--start`` is included in that invocation whether or not it has lines yet (and trained
unless ``--report-only``). Until one of those lines exists, a later invocation without ``--start`` does not
know it. A malformed, non-positive or non-finite factor, or a NAME that an existing start (of
:data:`STARTS`, recorded, or passed twice) has with other factors, is refused before anything is trained or
written: one line on stderr, exit status 2.

This module is the study's command and procedure (:func:`study`, :func:`main`); the study's other modules,
imported by it alone: :mod:`studies.lr_recovery_contenders` (each contender's overrides and label),
:mod:`studies.lr_recovery_plan` (the starts, and which contender is trained at which), :mod:`studies.lr_recovery_grid`
(the lattice, the plateau, the neighbourhood rule), :mod:`studies.lr_recovery_summary` (a start's runs summarized),
:mod:`studies.lr_recovery_targets` (the controller issue's and issue 46's targets) and
:mod:`studies.lr_recovery_report` (the report's rendering).

Runs are ordinary ``python -m recsys_hdet.train +experiment=baseline_low ...`` jobs trained by
:func:`studies.runs.run_one`: resumable (a run with a line in ``<out>/results.jsonl`` is skipped),
each line stamped with the commit it trained from; the study refuses to record into a committed
results file from a dirty tree (``--allow-dirty`` records elsewhere); ``--verify RUN`` retrains one
recorded run and reports whether it reproduces bit for bit. The earlier study
(``docs/results/lr_recovery/lr_recovery_f2``, before the contract) is kept with its report; its contenders
``hdet_previous`` and ``hdet_paper`` (dominated there) are not rerun under the contract.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from studies.contract import COLLAPSED_NE, StudyMismatch
from studies.lr_recovery_contenders import (CONTROLLER_VARIANTS, FINDERS, FORM_VARIANTS, HDET_VARIANTS,
                                           RETIRED_VARIANTS, VARIANTS, variant_overrides)
from studies.lr_recovery_grid import (cell_json, cell_lrs, cell_of, grid_name, neighbourhood_runs, plain_cells,
                                      plateau_analysis, plateau_json)
from studies.lr_recovery_plan import START_LABELS, extra_starts, planned, range_test_verdict, recorded_starts
from studies.lr_recovery_report import RETIRED, plot, render_markdown
from studies.lr_recovery_summary import (BENCHMARK_FILE, contender_cost, hdet_overrides, orderings, run_entry,
                                         summarize_start, variant_summary, wall_time)
from studies.lr_recovery_targets import RANGE_TEST, range_test_targets, targets
from studies.lr_recovery_travel import travel_targets
from studies.provenance import REPO
from studies.range_tests import finder_sweeps, sweep_suggestion
from studies.record import mean_ne
from studies.reporting import machine_line, preregistered, write_reports
from studies.results import RESULTS, ResultsError, StudyFiles, load, run_name
from studies.runs import AblationConfig, add_study_arguments, print_verification, run_one, verify
from studies.settings import COST_FILE, RESULTS_ROOT, SETTINGS
from studies.starts import ANCHOR_FILE, PRESET, STARTS, lr_overrides, recovery_anchor, start_lrs


def _run(study: StudyFiles, name: str, seed: int, overrides: Sequence[str], extra: Sequence[str],
         report_only: bool = False, contract: Any = "study") -> Optional[Dict[str, Any]]:
    """Trains one run (unless its line is in the results file) and returns its line, or None if it
    crashed (or, with ``report_only``, has not run yet: nothing is trained then)."""
    res = run_one(study, AblationConfig(name, PRESET, name, None, None), seed, [*overrides, *extra], report_only,
                  contract)
    if res.get("crashed"):
        print(f"{name} seed {seed}: CRASHED (exit status {res['exit_status']}), see {res['log']}", flush=True)
        return None
    r = res["record"]
    if r is not None and not report_only:
        state = "skipped (finished earlier)" if res["skipped"] else f"{res['process_seconds']:.0f} s"
        print(f"{name} seed {seed}: {r['status']}, mean NE {mean_ne(r)}, {state}", flush=True)
    return r


def run_name_of(start: str, variant: str, embedding: float, dense: float) -> str:
    """A contender's run name (without the seed): plain runs by their lattice cell (shared with the grid and
    other starts), Prodigy by its embedding LR (its dense step does not depend on the start)."""
    key = cell_of(embedding, dense)
    if variant == "plain_rollback" and key is not None:
        return grid_name(*key)
    if variant == "prodigy":
        return f"prodigy/emb{embedding:.6g}"
    return f"{start}/{variant}"


class Runner:
    """Trains (or, with ``report_only``, only reads) the study's runs; remembers whether any crashed."""

    def __init__(self, files: StudyFiles, extra: Sequence[str], report_only: bool, variants: Sequence[str]) -> None:
        self.files, self.extra, self.report_only, self.variants = files, list(extra), report_only, set(variants)
        self.crashed: List[str] = []

    def run(self, name: str, seed: int, overrides: Sequence[str], train: bool = True,
            contract: Any = "study") -> Optional[Dict[str, Any]]:
        read_only = self.report_only or not train
        r = _run(self.files, name, seed, overrides, self.extra, read_only, contract)
        if r is None and not read_only:
            self.crashed.append(run_name(name, seed))
        return r

    def lr_finder(self, start: str, seed: int, embedding: float, dense: float, train: bool,
                  variant: str = "lr_finder") -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
        """The two sweeps of a finder contender (:data:`FINDERS`), then the plain run at their suggestion (each
        sweep's suggestion read with the range its line records); (the run's line, the procedure's record)."""
        prefix, sweep_range, window = FINDERS[variant]
        name = f"{start}/{prefix}"
        info: Dict[str, Any] = {"sweeps": {}, "multiplier": {}}
        for axis, overrides in finder_sweeps(embedding, dense, sweep_range).items():
            sweep = self.run(f"{name}/sweep_{axis}", seed, overrides, train, contract=None)
            if sweep is None:
                return None, info
            info["sweeps"][axis] = {"run": run_name(f"{name}/sweep_{axis}", seed),
                                    "status": sweep["status"], "steps": sweep["steps"],
                                    "wall_seconds": sweep["wall_seconds"]}
            info["multiplier"][axis] = sweep_suggestion(sweep, window)
            if info["multiplier"][axis] is None:
                return None, info
        lrs = (embedding * info["multiplier"]["embedding"], dense * info["multiplier"]["dense"])
        info["lr"] = {"embedding": float(f"{lrs[0]:.6g}"), "dense": float(f"{lrs[1]:.6g}")}
        return self.run(name, seed, lr_overrides(*lrs), train), info


def study(out: StudyFiles, seeds: Sequence[int], extra: Sequence[str], starts: Optional[Sequence[str]] = None,
          report_only: bool = False, variants: Sequence[str] = tuple(VARIANTS), anchor: Optional[Tuple[float, float]] = None,
          max_rounds: int = 6, grid: bool = True, added_starts: Optional[Dict[str, Tuple[float, float]]] = None,
          benchmark: str = BENCHMARK_FILE, starts_at_best: bool = False,
          grid_seeds: Optional[Sequence[int]] = None,
          contenders: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The study: ``starts`` (default: :data:`STARTS` and the starts recorded in the results file,
    :func:`recorded_starts`), and ``added_starts`` (name -> factors: the ``--start`` starts, always included).
    ``anchor`` is where the neighbourhood rule starts on the lattice and what the starts are factors of; with
    ``starts_at_best`` (a setting of :mod:`studies.settings`) the starts are factors of the best cell the rule
    ends at instead, and none is trained or reported until the neighbourhood is complete. ``grid_seeds``: the seeds
    of the neighbourhood's cells (default ``seeds``); ``contenders``: a setting's (:func:`planned`)."""
    grid_seeds = list(seeds if grid_seeds is None else grid_seeds)
    anchor = anchor or recovery_anchor()
    anchor_key = cell_of(*anchor)
    if anchor_key is None:
        raise StudyMismatch(f"anchor {anchor}: not a point of the study's lattice")
    lattice_start = anchor
    if starts_at_best:
        anchor = _best_cell_when_complete(out.results, grid_seeds, anchor_key) or anchor
    factors = {**STARTS, **recorded_starts(out.results, anchor), **(added_starts or {})}
    starts = list(factors) if starts is None else [*starts, *(s for s in added_starts or {} if s not in starts)]
    unknown = [s for s in starts if s not in factors]
    if unknown:
        raise StudyMismatch(f"--starts {' '.join(unknown)}: not a start (the starts: {', '.join(factors)})")
    wall = contender_cost(benchmark)
    runner = Runner(out, extra, report_only, variants)
    # Phase 1: the anchor's neighbourhood, then the best cell's, every seed.
    rounds = 0
    pending = neighbourhood_runs(plain_cells(out.results), grid_seeds, anchor_key)
    while grid and pending and not report_only and rounds < max_rounds:
        rounds += 1
        print(f"neighbourhood, round {rounds}: {len(pending)} runs", flush=True)
        for i, j, s in pending:
            runner.run(grid_name(i, j), s, lr_overrides(*cell_lrs(i, j)))
        if runner.crashed:
            break
        pending = neighbourhood_runs(plain_cells(out.results), grid_seeds, anchor_key)
    cells = plain_cells(out.results)
    an = plateau_analysis(cells)
    plateau = plateau_json(cells, an) if an else None
    best_known = False  # whether a setting's own best cell is known (its neighbourhood complete)
    if starts_at_best:
        best = _best_cell_when_complete(out.results, grid_seeds, anchor_key)
        best_known = best is not None
        if best is None:
            starts = []  # the setting's own best cell is not known yet: no start can be placed
        elif best != anchor:  # the grid moved on in this invocation: the starts follow it
            anchor = best
            factors = {**STARTS, **recorded_starts(out.results, anchor), **(added_starts or {})}
    # Phase 2: the starts.
    results: Dict[str, Any] = {}
    forms: Dict[str, List[str]] = {}
    for start in starts:
        e, d = start_lrs(start, anchor, factors[start])
        per_variant: Dict[str, List[Dict[str, Any]]] = {}
        for variant in VARIANTS:
            plan = planned(variant, start, contenders)
            train = variant in variants and plan
            runs = []
            for seed in seeds:
                finder = None
                if variant in FINDERS:
                    r, finder = runner.lr_finder(start, seed, e, d, train, variant)
                    name = f"{start}/{FINDERS[variant][0]}"
                else:
                    name = run_name_of(start, variant, e, d)
                    r = runner.run(name, seed, variant_overrides(variant, e, d), train)
                runs.append({**run_entry(r, seed, run_name(name, seed), variant, finder,
                                         missing="not planned" if not plan else
                                         "not run yet" if report_only or not train else "crashed"),
                             "planned": plan})
                if r and variant in FORM_VARIANTS and variant not in forms:
                    forms[variant] = hdet_overrides(r)  # the form a variant's runs trained with, read from a run
            per_variant[variant] = runs
        start_lr = {"embedding": e, "dense": d}
        results[start] = summarize_start(per_variant, out.results, cells, an, plateau["lr_range"] if plateau else None,
                                         start_lr, wall)
        results[start]["label"] = START_LABELS.get(start) or (
            f"embedding x{factors[start][0]:.6g}, dense x{factors[start][1]:.6g} of the best cell (--start)")
        results[start]["factors"] = list(factors[start])
        results[start]["from_command_line"] = start not in STARTS
        results[start]["orderings"] = {v: orderings([out.results[r["run"]] for r in per_variant[v] if r["bases"]], start_lr)
                                       for v in HDET_VARIANTS}
    n_planned = sum(r["planned"] for s in results.values() for v in s["runs"].values() for r in v)
    missing = sum(r["status"] in ("not run yet", "crashed") for s in results.values() for v in s["runs"].values() for r in v)
    out_json: Dict[str, Any] = {
        "anchor": {"embedding": anchor[0], "dense": anchor[1], "setting_best_cell": best_known, "from": (
            "this setting's best cell, where the neighbourhood rule ended (the starts are factors of it)"
            if best_known else
            "the benchmark's best cell, where the neighbourhood rule started; the setting's own best cell is not "
            "known yet (no start placed)" if starts_at_best else
            "docs/results/lr_recovery/lr_recovery.json (the earlier study's best cell; the starts are factors of it)")},
        "lattice_start": {"embedding": lattice_start[0], "dense": lattice_start[1]},
        "contract": {"overrides": out.contract.overrides() if out.contract else None,
                     "failed": f"diverged, or held-out NE >= {COLLAPSED_NE} on some task",
                     "paired": "contender - plain_rollback on the seeds where both completed; failures beside"},
        "grid": [cell_json(c, an) for _, c in sorted(cells.items())], "neighbourhood_pending": [
            {"embedding": cell_lrs(i, j)[0], "dense": cell_lrs(i, j)[1], "seed": s}
            for i, j, s in neighbourhood_runs(cells, grid_seeds, anchor_key)],
        "seeds": list(seeds), "best_cell": cell_json(cells[an["best"]], an) if an else None,
        "plateau": plateau["cells"] if plateau else None, "plateau_rule": plateau["rule"] if plateau else None,
        "starts": results, "forms": forms, "variants": variant_summary(results),
        "retired": {**RETIRED, **({} if range_test_verdict() == "passed" else {
            "hdet_range_test": f"the range test on the replicas: its kill test's verdict is {range_test_verdict()} "
                               "(docs/results/lr_truth/lr_truth.json, range_commit; both forms killed), so it is not "
                               "run in full (docs/results/hdet_history.md, range-test-rule 1)"})},
        "wall_time": wall_time(results), "contender_cost": wall,
        "targets": {**targets(results, ("hdet", *CONTROLLER_VARIANTS)), RANGE_TEST: range_test_targets(results, wall)},
        "chosen_rule": chosen_rule(),
        "range_test_rule": chosen_rule(marker="range-test-rule"),
    }
    if missing:
        out_json["partial"] = f"{n_planned - missing} of {n_planned} runs of the starts finished"
    elif an is None or neighbourhood_runs(cells, grid_seeds, anchor_key):
        out_json["partial"] = "the neighbourhood of the best cell is not complete"
    return out_json


def _best_cell_when_complete(results: Dict[str, Dict[str, Any]], seeds: Sequence[int],
                             anchor_key: Tuple[int, int]) -> Optional[Tuple[float, float]]:
    """The lattice's best cell (embedding, dense) once the neighbourhood rule has nothing left to train, else None."""
    cells = plain_cells(results)
    an = plateau_analysis(cells)
    if an is None or neighbourhood_runs(cells, seeds, anchor_key):
        return None
    best = cells[an["best"]]
    return best.embedding, best.dense


def chosen_rule(path: str = os.path.join(REPO, "docs", "results", "hdet_history.md"),
                marker: str = "chosen-rule") -> str:
    """A pre-registered rule: docs/results/hdet_history.md's text between its ``marker`` markers (``chosen-rule``:
    the controller variants', written before their first recovery run; ``range-test-rule``: the range test on the
    replicas'; ``travel-rule``: the rule judged off the benchmark; ``retrain-rule``: the daily job's), read by
    :func:`studies.reporting.preregistered`; StudyMismatch when the markers are missing."""
    try:
        return preregistered(path, marker)
    except ValueError as e:
        raise StudyMismatch(str(e)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.lr_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--setting", choices=sorted(SETTINGS), default=None,
                    help="a setting of studies/settings.py (the range test's rule judged off the benchmark): its "
                         "overrides before the positional ones, --out and --docs default to its folder under "
                         f"{RESULTS_ROOT}, the neighbourhood rule starts at the benchmark's best cell (unless "
                         "--anchor) and the starts are factors of the setting's own best cell, placed once the "
                         "neighbourhood is complete")
    ap.add_argument("--grid-seeds", type=int, nargs="+", default=None,
                    help="the seeds of the neighbourhood's cells (default: --seeds)")
    ap.add_argument("--out", default=None,
                    help="study directory: its results.jsonl (one line per finished run, committed, so a later "
                         "session resumes where an earlier one stopped; default docs/results/lr_recovery/lr_recovery_f3; "
                         "docs/results/lr_recovery/lr_recovery_f2 holds the study before the fairness contract, with "
                         "its report)")
    ap.add_argument("--work", default=None,
                    help="where the run directories go (default: outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--anchor", type=float, nargs=2, metavar=("EMBEDDING", "DENSE"), default=None,
                    help="the point the starts are factors of (default: the anchor of lr_recovery.json in --docs)")
    ap.add_argument("--max-rounds", type=int, default=6,
                    help="how many rounds of the neighbourhood rule may run (default 6)")
    ap.add_argument("--no-grid", action="store_true", help="train only the starts (the neighbourhood is read)")
    ap.add_argument("--starts", nargs="+", default=None, metavar="START",
                    help="a subset of the starts (default: every start: " + ", ".join(STARTS) + ", and those "
                         "recorded from an earlier --start); the --start starts are added to it")
    ap.add_argument("--start", action="append", default=[], metavar="NAME=EMB_FACTOR,DENSE_FACTOR",
                    help="a start outside the study's (repeatable): factors of the anchor, any positive finite "
                         "numbers (e.g. odd=0.02,40); trained and reported with the same contract, seeds and "
                         "contenders. It stays in the report while the results file has a run of it at its own LRs. "
                         "A bad factor or a NAME an existing start has with other factors: exit status 2, nothing "
                         "written")
    trainable = [v for v in VARIANTS if v not in RETIRED_VARIANTS]
    ap.add_argument("--variants", nargs="+", default=trainable, choices=trainable,
                    help="train only these contenders of the starts (the others' finished runs are still reported)")
    ap.add_argument("--docs", default=None,
                    help="where lr_recovery.{md,json,png} go (default docs/results/lr_recovery)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the reports from the results file alone (marked partial until "
                         "every run has its line)")
    add_study_arguments(ap)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. data=tiny trainer.nproc=2)")
    args = ap.parse_args(argv)
    setting = SETTINGS[args.setting] if args.setting else None
    args.out = args.out or (setting.out if setting else "docs/results/lr_recovery/lr_recovery_f3")
    args.docs = args.docs or (setting.out if setting else "docs/results/lr_recovery")
    if setting:
        args.overrides = [*setting.overrides, *args.overrides]
    try:
        extra_starts(args.start, {})  # the values' form and STARTS' names, before anything is read or written
        train = not args.report_only and args.verify is None
        if args.verify is None:  # the recorded starts' names too, before StudyFiles.open (which may copy a file)
            anchor = tuple(args.anchor) if args.anchor else recovery_anchor(
                ANCHOR_FILE if setting else os.path.join(os.path.abspath(args.docs), "lr_recovery.json"))
            extra_starts(args.start, recorded_starts(load(os.path.join(os.path.abspath(args.out), RESULTS)),
                                                     anchor))
        files = StudyFiles.open(args.out, args.work, allow_dirty=args.allow_dirty, train=train)
        if args.verify is not None:
            return print_verification(args.verify, verify(files, args.verify))
        recorded = recorded_starts(files.results, anchor)
        added = extra_starts(args.start, recorded)
        known = {**STARTS, **recorded, **added}
        unknown = [s for s in args.starts or () if s not in known]
        if unknown:
            raise StudyMismatch(f"--starts {' '.join(unknown)}: not a start (the starts: {', '.join(known)})")
        if train:
            os.makedirs(files.out, exist_ok=True)
        result = study(files, args.seeds, args.overrides, args.starts, args.report_only, args.variants, anchor,
                       args.max_rounds, not args.no_grid, added, starts_at_best=setting is not None,
                       benchmark=setting.path(COST_FILE) if setting else BENCHMARK_FILE,
                       grid_seeds=args.grid_seeds, contenders=setting.contenders if setting else None)
    except (StudyMismatch, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["command"] = "python -m studies.lr_recovery " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
    if setting:
        result["setting"] = setting.record()
        if result["best_cell"] is not None:
            result["travel_targets"] = travel_targets(result)
    docs = os.path.abspath(args.docs)
    write_reports(docs, "lr_recovery", result, render_markdown(result))
    if result["best_cell"] is not None:
        plot(result, files.results, os.path.join(docs, "lr_recovery.png"))
    print(f"wrote lr_recovery.md/.json{'/.png' if result['best_cell'] is not None else ''} into {docs}"
          + (f" (partial: {result['partial']})" if result.get("partial") else ""), flush=True)
    crashed = [r["run"] for s in result["starts"].values() for v in s["runs"].values() for r in v
               if r["status"] == "crashed"]
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
