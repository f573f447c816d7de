"""``python -m studies.lr_recovery``: can one HDET run find each group's learning rate?

A study with a known answer, on the benchmark data set, cold start (no warm-start checkpoint),
every run under the fairness contract (:class:`studies.contract.Contract`, docs/studies.md): the
same rows trained (4,096 rows of each day reserved by every contender), rollback on for every
contender, a run that diverges or ends at the base-rate predictor (NE >= 0.999 on a task) failed.

1. **The anchor** is the best cell of the earlier recovery grid, read from ``docs/lr_recovery.json``
   (``anchor``, else ``best_cell``), not a constant; every start is a factor of it.
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
     each suggesting the multiplier at the smoothed loss's minimum / 10
     (:func:`studies.range_tests.sweep_suggestion`, read with each sweep's own recorded range); then a plain run at the suggested LRs. Its cost counts the sweeps' steps and
     seconds. Its runs are ``{start}/lr_finder_wide...``,
   - planned at every start: the five above. The earlier contenders, read and reported where recorded:
     ``hdet`` (the product's earlier default, conf/hdet/enabled.yaml) and the controller issue's
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

The targets and the report's rendering live in :mod:`studies.lr_recovery_report` (imported by this module alone).

Runs are ordinary ``python -m recsys_hdet.train +experiment=baseline_low ...`` jobs trained by
:func:`studies.runs.run_one`: resumable (a run with a line in ``<out>/results.jsonl`` is skipped),
each line stamped with the commit it trained from; the study refuses to record into a committed
results file from a dirty tree (``--allow-dirty`` records elsewhere); ``--verify RUN`` retrains one
recorded run and reports whether it reproduces bit for bit. The earlier study
(``docs/lr_recovery_f2``, before the contract) is kept with its report; its contenders
``hdet_previous`` and ``hdet_paper`` (dominated there) are not rerun under the contract.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from studies import lr_recovery_report as report
# The targets live in studies/lr_recovery_report.py with the report; the study reads them from here.
from studies.lr_recovery_report import (MISSET_STARTS, RANGE_TEST, TARGET_STARTS, range_test_targets,  # noqa: F401
                                        targets)
from recsys_hdet.constants import DENSE_GROUPS, LR_AXES
from studies.contract import COLLAPSED_NE, CONTRACT, StudyMismatch, outcome, paired_over_seeds
from studies.hdet_forms import HDET_ANNEAL_EFFECT
from studies.provenance import REPO
from studies.range_tests import HDET_RANGE_TEST, NARROW_SWEEP, SWEEP, finder_sweeps, sweep_suggestion
from studies.record import mean_ne
from studies.reporting import machine_line, write_reports
from studies.results import RESULTS, ResultsError, StudyFiles, load, run_name
from studies.runs import AblationConfig, add_study_arguments, print_verification, run_one, verify
from studies.starts import PRESET, STARTS, lr_overrides, recovery_anchor, start_lrs
from studies.stats import paired
from studies.trajectory import final_bases, geomean, record_trajectory

# The two LRs the study reports per start: the embedding group's, and the dense groups' geometric mean.
REPORTED = LR_AXES
# The lattice the grid's cells lie on: each axis's LRs are GRID_CENTRE x 10^(k/2) (5 points span 100x).
GRID_CENTRE = {"embedding": 0.06, "dense": 0.003}
# The side-by-side cost benchmark's results (benchmarks/contender_cost.py): each contender's wall ratio.
BENCHMARK_FILE = os.path.join(REPO, "benchmarks", "results.json")

# What each start of :data:`studies.starts.STARTS` is.
START_LABELS = {
    "best": "the best cell: the plateau start",
    "old_tuned": "embedding 10x low, dense 3x high: the earlier study's 'tuned' start",
    "all_low": "every group 10x low", "all_high": "every group 10x high",
    "emb_low_dense_high": "embedding 10x low, dense 10x high", "emb_high_dense_low": "embedding 10x high, dense 10x low",
    "emb_low": "embedding 10x low, dense at the best cell",
    "emb_low_30": "embedding 30x low, dense at the best cell", "all_high_3": "every group 3x high",
}
# The starts the study had before the range test on the replicas: the controller forms are planned at these only.
EARLIER_STARTS = ("best", "old_tuned", "all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low", "emb_low")

# The controller issue's variants (docs/hdet.md, "Choosing the default": pre-registered before their first
# recovery run), each the default's signal and spread with one change: explore-then-commit (two rounds of 125
# steps in the one-cycle's 293-step warm-up, a decade then half of one between the extreme replicas, then
# the plain run at the held LRs); the effect controller with the fixed estimator (each sync weighted alike,
# the fit started over at the warm-up's end); AIMD and Rprop on that estimator.
def _changed(base: Sequence[str], *changes: str) -> Tuple[str, ...]:
    """``base`` with ``changes`` (key=value overrides) in place of its overrides of the same keys."""
    keys = {c.split("=", 1)[0] for c in changes}
    return (*(o for o in base if o.split("=", 1)[0] not in keys), *changes)


FIXED_FIT = ("hdet.fit_weighting=per_sync", "hdet.fit_reset_at=0.3")
HDET_EXPLORE = _changed(HDET_ANNEAL_EFFECT, "hdet.explore_rounds=2", "hdet.explore_steps=125",
                        "hdet.explore_decades=1.0", "hdet.explore_narrow=0.5")
HDET_EFFECT_FIXED = _changed(HDET_ANNEAL_EFFECT, *FIXED_FIT)
HDET_AIMD = _changed(HDET_ANNEAL_EFFECT, "hdet.score=aimd", "hdet.aimd_up=1.1", "hdet.aimd_down=0.5", *FIXED_FIT)
HDET_RPROP = _changed(HDET_ANNEAL_EFFECT, "hdet.score=rprop", "hdet.rprop_up=1.2", "hdet.rprop_down=0.5",
                      "hdet.rprop_max_step=1.0", *FIXED_FIT)


def prodigy(embedding: float, dense: float) -> List[str]:
    """Prodigy as its authors run it: d0 = 1e-6 (its default), the dense groups' LR multiplier 1 under the
    plain run's schedule; the start's dense LR does not enter."""
    return [*lr_overrides(embedding, 1.0), "optim.dense.type=prodigy", "optim.dense.d0=1e-06"]


def schedulefree(embedding: float, dense: float) -> List[str]:
    """Schedule-Free AdamW at the start's dense LR, constant, with its own warm-up (as long as the
    one-cycle's rise); the embedding group on the plain run's schedule (components/lr_scheduler.py)."""
    return [*lr_overrides(embedding, dense), "optim.dense.type=schedulefree_adamw"]


# variant -> the overrides added to the start's LRs, or a function of the start's LRs giving every override;
# the finders' overrides come from their sweeps (:data:`FINDERS`, :meth:`Runner.lr_finder`).
VARIANTS = {"plain_rollback": (), "hdet_range_test": HDET_RANGE_TEST, "prodigy": prodigy, "schedulefree": schedulefree,
            "lr_finder": None, "hdet": HDET_ANNEAL_EFFECT, "hdet_explore": HDET_EXPLORE,
            "hdet_effect_fixed": HDET_EFFECT_FIXED, "hdet_aimd": HDET_AIMD, "hdet_rprop": HDET_RPROP,
            "lr_finder_narrow": None}
# finder contender -> (its runs' name under the start, its sweep (steps, low, high)); the wide finder's runs have
# names of their own, so that they never meet the narrow finder's recorded lines.
FINDERS = {"lr_finder": ("lr_finder_wide", SWEEP),
           "lr_finder_narrow": ("lr_finder", NARROW_SWEEP)}
# Read and reported where recorded, never trained again.
RETIRED_VARIANTS = ("lr_finder_narrow",)
HDET_VARIANTS = ("hdet", "hdet_explore", "hdet_effect_fixed", "hdet_aimd", "hdet_rprop")
# The HDET forms whose launch overrides the report prints (``forms``), read from a finished run.
FORM_VARIANTS = (*HDET_VARIANTS, "hdet_range_test")
# The controller issue's variants run only at the best start and the four starts its targets name; at old_tuned
# and emb_high_dense_low they are "not planned" (a run recorded there is read, and not counted as planned): the
# pre-registered rule's step 1 (which reads every start) already excludes every variant at the best start.
CONTROLLER_VARIANTS = ("hdet_explore", "hdet_effect_fixed", "hdet_aimd", "hdet_rprop")
CONTROLLER_STARTS = ("best", "all_low", "all_high", "emb_low_dense_high", "emb_low")
# Schedule-Free's dense LR is constant after its warm-up where the preset's schedule decays to ~0: its
# dense LR area against that schedule says nothing of the LR it settles on; not reported.
NO_LR_AREA = ("schedulefree",)
LABELS = {"plain_rollback": "plain + rollback", "hdet": "HDET default (anneal-then-probe, effect controller)",
          "prodigy": "Prodigy (dense, d0 1e-6)",
          "schedulefree": "Schedule-Free AdamW (dense)",
          "lr_finder": "LR finder (two 100-step sweeps, x0.001-x10000) + plain",
          "lr_finder_narrow": "LR finder, narrow (retired: x0.01-x100) + plain",
          "hdet_range_test": "HDET range test on the replicas (100-step sweep, x0.001-x10000)",
          "hdet_explore": "HDET explore-then-commit (2 rounds of 125 steps)",
          "hdet_effect_fixed": "HDET effect controller, per-sync fit reset at 30%",
          "hdet_aimd": "HDET AIMD (x1.1 up, x0.5 on harm), per-sync fit", "hdet_rprop": "HDET Rprop step, per-sync fit"}


def planned(variant: str, start: str) -> bool:
    """Whether ``variant`` is trained at ``start``. The controller forms (``hdet`` and the controller issue's
    variants) are dominated: planned only where they were before (``hdet`` at :data:`EARLIER_STARTS`, the
    variants at :data:`CONTROLLER_STARTS`), never at a newer start; the retired finder nowhere; every other
    contender at every start, a ``--start`` start included."""
    if variant in RETIRED_VARIANTS:
        return False
    if variant in CONTROLLER_VARIANTS:
        return start in CONTROLLER_STARTS
    if variant == "hdet":
        return start in EARLIER_STARTS
    return True


def variant_overrides(variant: str, embedding: float, dense: float) -> List[str]:
    v = VARIANTS[variant]
    return v(embedding, dense) if callable(v) else [*lr_overrides(embedding, dense), *v]


# ----------------------------------------------------------------------------------------------
# Starts from the command line (--start NAME=EMB_FACTOR,DENSE_FACTOR) and from the results file.

START_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SHARED_PREFIXES = ("grid", "prodigy")  # run names shared across starts (run_name_of): not a start's name
# The contenders whose runs train at the start's own LRs: a start's factors are read back from their lines.
AT_START_LRS = ("plain_rollback", "schedulefree", "hdet_range_test")


def parse_start(text: str) -> Tuple[str, Tuple[float, float]]:
    """A ``--start`` value, ``NAME=EMB_FACTOR,DENSE_FACTOR``: (name, (embedding factor, dense factor)), factors of
    the anchor. StudyMismatch, naming the problem, for a malformed value or a factor that is not a positive
    finite number."""
    name, eq, factors = text.partition("=")
    if not eq or not START_NAME.fullmatch(name) or name in SHARED_PREFIXES:
        raise StudyMismatch(f"--start {text}: expected NAME=EMB_FACTOR,DENSE_FACTOR, NAME of letters, digits, "
                            f"'_', '.', '-' (not {' or '.join(SHARED_PREFIXES)})")
    parts = factors.split(",")
    if len(parts) != 2:
        raise StudyMismatch(f"--start {text}: expected two factors, EMB_FACTOR,DENSE_FACTOR (got {len(parts)})")
    out = []
    for axis, part in zip(("embedding", "dense"), parts):
        try:
            x = float(part)
        except ValueError:
            raise StudyMismatch(f"--start {text}: the {axis} factor {part!r} is not a number") from None
        if not math.isfinite(x) or x <= 0:
            raise StudyMismatch(f"--start {text}: the {axis} factor {part} is not a positive finite number")
        out.append(x)
    return name, (out[0], out[1])


def same_factors(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    """Two starts' factors name one point (to the 6 significant digits a start's LRs carry)."""
    return all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(a, b))


def extra_starts(texts: Sequence[str], recorded: Dict[str, Tuple[float, float]]) -> Dict[str, Tuple[float, float]]:
    """The starts the ``--start`` values add to :data:`STARTS`: parsed (:func:`parse_start`), and refused
    (StudyMismatch) where a NAME is already a start, of :data:`STARTS`, of ``recorded`` (:func:`recorded_starts`)
    or an earlier value, with other factors. A value repeating a start of :data:`STARTS` adds nothing."""
    out: Dict[str, Tuple[float, float]] = {}
    for text in texts:
        name, factors = parse_start(text)
        have = out.get(name) or STARTS.get(name) or recorded.get(name)
        if have is not None and not same_factors(have, factors):
            raise StudyMismatch(f"--start {text}: the start {name!r} exists with factors {have[0]:.6g},{have[1]:.6g}; "
                                "choose another NAME")
        if name not in STARTS:
            out[name] = have or factors
    return out


def recorded_starts(records: Dict[str, Dict[str, Any]], anchor: Tuple[float, float]) -> Dict[str, Tuple[float, float]]:
    """The starts outside :data:`STARTS` that have results lines (a start once passed with ``--start``): from each
    line ``{name}/{contender}/seed{n}`` of a contender trained at the start's own LRs (:data:`AT_START_LRS`), the
    factors max LR / anchor (embedding; the first dense group), 6 significant digits. StudyMismatch when one
    name's lines disagree."""
    found: Dict[str, Tuple[float, float]] = {}
    for name in sorted(records):
        parts = name.split("/")
        if len(parts) != 3 or parts[0] in STARTS or parts[0] in SHARED_PREFIXES or parts[1] not in AT_START_LRS:
            continue
        lr = records[name].get("max_lr") or {}
        if "embedding" not in lr or DENSE_GROUPS[0] not in lr:
            continue
        factors = (float(f"{lr['embedding'] / anchor[0]:.6g}"), float(f"{lr[DENSE_GROUPS[0]] / anchor[1]:.6g}"))
        if parts[0] in found and not same_factors(found[parts[0]], factors):
            raise StudyMismatch(f"{name}: trained at factors {factors} of the anchor, where the start {parts[0]!r}'s "
                                f"other lines have {found[parts[0]]}")
        found.setdefault(parts[0], factors)
    return found


# ----------------------------------------------------------------------------------------------
# Training.


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


def grid_name(i: int, j: int) -> str:
    return f"grid/e{i}_d{j}"


ORDERING_AT = (0.25, 0.5, 0.75, 1.0)


def orderings(records: List[Dict[str, Any]], start_lr: Dict[str, float]) -> Optional[Dict[str, Any]]:
    """The decay ordering the controller chose per reported group over the pass :
    at each fraction of the syncs in :data:`ORDERING_AT`, the controlled max LR over the start's LR
    (dense: the geometric mean of the three dense groups), per completed run and as the geometric
    mean over them; ``same_direction_as_dense``: whether the embedding group ended on the same side
    of its start (above or below) as the dense groups, per run; ``stable``: per group, whether every
    run ended on the same side."""
    if not records:
        return None
    per_run = []
    for record in records:
        trajectory = record_trajectory(record)
        at = [trajectory[max(0, math.ceil(f * len(trajectory)) - 1)][1] for f in ORDERING_AT]
        per_run.append({axis: [geomean([v[g] for g in REPORTED[axis]]) / start_lr[axis] for v in at]
                        for axis in REPORTED})
    side = lambda x: (x > 1) - (x < 1)
    return {"at": list(ORDERING_AT), "seeds": len(per_run),
            "ratio_geomean": {axis: [geomean([r[axis][k] for r in per_run]) for k in range(len(ORDERING_AT))]
                              for axis in REPORTED},
            "per_run": per_run,
            "same_direction_as_dense": [side(r["embedding"][-1]) == side(r["dense"][-1]) for r in per_run],
            "stable": {axis: len({side(r[axis][-1]) for r in per_run}) == 1 for axis in REPORTED}}


def _mean(xs: List[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _std(xs: List[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else None


def grid_lr(centre: float, points: int, k: int) -> float:
    """The k-th LR of a grid axis; k outside 0..points-1 continues the axis beyond its ends."""
    return centre * 10 ** (-1 + 2 * k / (points - 1))


def grid_index(lr: float, centre: float, points: int) -> Optional[int]:
    """The grid index of ``lr`` on an axis (inverse of :func:`grid_lr`); None when it is off the lattice."""
    x = (math.log10(lr / centre) + 1) * (points - 1) / 2
    k = round(x)
    return k if abs(x - k) < 1e-3 else None


# ----------------------------------------------------------------------------------------------
# The grid as cells, its plateau, and the rule that grows the neighbourhood.
#
# A cell is one point of the lattice (half a decade apart on each axis) with every plain run trained
# there: the neighbourhood's runs and the plain runs of the starts, which are named by their cell, so
# the same seed at the same point is one run.

POINTS = 5  # the lattice's spacing: GRID_CENTRE x 10^(-1 + 2k / (POINTS - 1))


class Cell:
    def __init__(self, i: int, j: int, embedding: float, dense: float) -> None:
        self.i, self.j, self.embedding, self.dense = i, j, embedding, dense
        self.ne: Dict[int, Optional[float]] = {}  # seed -> mean NE over the tasks; None: failed
        self.runs: List[str] = []

    @property
    def key(self) -> Tuple[int, int]:
        return self.i, self.j

    @property
    def failed(self) -> bool:
        """A cell where any seed failed (diverged or collapsed): not a safe place to train."""
        return any(v is None for v in self.ne.values())

    @property
    def mean(self) -> Optional[float]:
        return None if self.failed or not self.ne else statistics.fmean(self.ne.values())


def cell_lrs(i: int, j: int) -> Tuple[float, float]:
    return grid_lr(GRID_CENTRE["embedding"], POINTS, i), grid_lr(GRID_CENTRE["dense"], POINTS, j)


def cell_of(embedding: float, dense: float) -> Optional[Tuple[int, int]]:
    i, j = grid_index(embedding, GRID_CENTRE["embedding"], POINTS), grid_index(dense, GRID_CENTRE["dense"], POINTS)
    return None if i is None or j is None else (i, j)


def plain_cells(records: Dict[str, Dict[str, Any]]) -> Dict[Tuple[int, int], Cell]:
    """The lattice's cells from a results file: every finished plain run named ``grid/...``."""
    cells: Dict[Tuple[int, int], Cell] = {}
    for name in sorted(records):
        r = records[name]
        result = outcome(r)
        if r.get("hdet") or result is None or not name.startswith("grid/"):
            continue
        dense = [r["max_lr"][g] for g in DENSE_GROUPS]
        key = cell_of(r["max_lr"]["embedding"], dense[0])
        if key is None or max(dense) > min(dense) * (1 + 1e-6):
            continue
        cell = cells.setdefault(key, Cell(*key, *cell_lrs(*key)))
        cell.runs.append(name)
        cell.ne[r["seed"]] = r["mean_ne"] if result == "completed" else None
    return cells


def near(a: Cell, b: Cell, decades: float = 0.5) -> bool:
    """Whether ``b`` lies within ``decades`` of ``a`` on both axes (half a decade: the 8 grid neighbours)."""
    return all(abs(math.log10(x / y)) <= decades + 1e-9 for x, y in ((a.embedding, b.embedding), (a.dense, b.dense)))


def plateau_analysis(cells: Dict[Tuple[int, int], Cell]) -> Optional[Dict[str, Any]]:
    """The best cell, each cell's paired difference from it, and the plateau.

    - best: the completed cell with the lowest mean NE (a cell with a failed seed is not a candidate);
    - paired difference: the mean over the seeds a cell shares with the best of (cell - best) on the
      same seed;
    - pooled paired std: the root of the dof-weighted mean variance of those differences over every cell
      that shares 2+ seeds with the best. One std for every cell: a cell's own std from 3 seeds would let
      a noisy cell in and keep a steady one out;
    - plateau: every completed cell whose paired difference is within one pooled paired std of the best,
      and not within half a decade of a failed cell (:func:`near`).
    None when no cell has completed; ``plateau`` None while no cell shares 2+ seeds with the best."""
    done = {k: c for k, c in cells.items() if c.mean is not None}
    if not done:
        return None
    best = min(done, key=lambda k: (done[k].mean, k))
    b = done[best]
    stats: Dict[Tuple[int, int], Dict[str, Any]] = {}
    num = den = 0.0
    pool: List[Tuple[int, int]] = []
    for k, c in sorted(done.items()):
        shared = sorted(set(c.ne) & set(b.ne))
        diffs = [c.ne[s] - b.ne[s] for s in shared]
        if len(diffs) >= 2 and k != best:
            num += (len(diffs) - 1) * statistics.variance(diffs)
            den += len(diffs) - 1
            pool.append(k)
        stats[k] = {"diff": statistics.fmean(diffs) if diffs else c.mean - b.mean, "shared_seeds": shared}
    pooled = math.sqrt(num / den) if den else None
    failed = [c for c in cells.values() if c.failed]
    plateau = None
    if pooled is not None:
        plateau = []
        for k, st in stats.items():
            st["within"] = st["diff"] <= pooled
            st["near_failed"] = any(near(done[k], d) for d in failed)
            if st["within"] and not st["near_failed"]:
                plateau.append(k)
    excluded = [k for k, st in stats.items() if st.get("within") and st.get("near_failed")]
    return {"best": best, "stats": stats, "pooled_std": pooled, "pool": pool, "plateau": plateau,
            "near_failed": excluded if pooled is not None else [],
            "missing_neighbours": missing_neighbours(cells, best)}


AROUND = tuple((di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1))


def missing_neighbours(cells: Dict[Tuple[int, int], Cell], key: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The 8 grid neighbours of ``key`` that have no finished run."""
    return [(key[0] + di, key[1] + dj) for di, dj in AROUND if (di, dj) != (0, 0)
            and (key[0] + di, key[1] + dj) not in cells]


def neighbourhood_runs(cells: Dict[Tuple[int, int], Cell], seeds: Sequence[int],
                       anchor: Tuple[int, int]) -> List[Tuple[int, int, int]]:
    """The (i, j, seed) runs still to train: every seed on the anchor's cell and its 8 neighbours, then on
    the best cell's (:func:`plateau_analysis`) and its 8 neighbours' while it lacks one. A caller repeats
    it until it returns nothing (each answer depends on the runs before)."""
    def around(key: Tuple[int, int]) -> List[Tuple[int, int, int]]:
        return [(key[0] + di, key[1] + dj, s) for di, dj in AROUND for s in seeds
                if s not in (cells.get((key[0] + di, key[1] + dj)).ne if (key[0] + di, key[1] + dj) in cells else {})]

    todo = around(anchor)
    if todo:
        return todo
    an = plateau_analysis(cells)
    return around(an["best"]) if an else []


# ----------------------------------------------------------------------------------------------
# The study.


def effective_lrs(record: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """A run's LR area (:func:`studies.lr_area.lr_area`) in max-LR units: the preset's max LR
    times the area, per reported group (dense: the three dense groups' geometric mean)."""
    area, preset = record.get("lr_area"), record.get("preset_lr")
    if not area or not preset or any(g not in area for g in ("embedding", *DENSE_GROUPS)):
        return None
    return {key: geomean([area[g] * preset[g] for g in groups]) for key, groups in REPORTED.items()}


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
        prefix, sweep_range = FINDERS[variant]
        name = f"{start}/{prefix}"
        info: Dict[str, Any] = {"sweeps": {}, "multiplier": {}}
        for axis, overrides in finder_sweeps(embedding, dense, sweep_range).items():
            sweep = self.run(f"{name}/sweep_{axis}", seed, overrides, train, contract=None)
            if sweep is None:
                return None, info
            info["sweeps"][axis] = {"run": run_name(f"{name}/sweep_{axis}", seed),
                                    "status": sweep["status"], "steps": sweep["steps"],
                                    "wall_seconds": sweep["wall_seconds"]}
            info["multiplier"][axis] = sweep_suggestion(sweep)
            if info["multiplier"][axis] is None:
                return None, info
        lrs = (embedding * info["multiplier"]["embedding"], dense * info["multiplier"]["dense"])
        info["lr"] = {"embedding": float(f"{lrs[0]:.6g}"), "dense": float(f"{lrs[1]:.6g}")}
        return self.run(name, seed, lr_overrides(*lrs), train), info


def study(out: StudyFiles, seeds: Sequence[int], extra: Sequence[str], starts: Optional[Sequence[str]] = None,
          report_only: bool = False, variants: Sequence[str] = tuple(VARIANTS), anchor: Optional[Tuple[float, float]] = None,
          max_rounds: int = 6, grid: bool = True, added_starts: Optional[Dict[str, Tuple[float, float]]] = None,
          benchmark: str = BENCHMARK_FILE) -> Dict[str, Any]:
    """The study: ``starts`` (default: :data:`STARTS` and the starts recorded in the results file,
    :func:`recorded_starts`), and ``added_starts`` (name -> factors: the ``--start`` starts, always included)."""
    anchor = anchor or recovery_anchor()
    anchor_key = cell_of(*anchor)
    if anchor_key is None:
        raise StudyMismatch(f"anchor {anchor}: not a point of the study's lattice")
    factors = {**STARTS, **recorded_starts(out.results, anchor), **(added_starts or {})}
    starts = list(factors) if starts is None else [*starts, *(s for s in added_starts or {} if s not in starts)]
    unknown = [s for s in starts if s not in factors]
    if unknown:
        raise StudyMismatch(f"--starts {' '.join(unknown)}: not a start (the starts: {', '.join(factors)})")
    wall = contender_cost(benchmark)
    runner = Runner(out, extra, report_only, variants)
    # Phase 1: the anchor's neighbourhood, then the best cell's, every seed.
    rounds = 0
    pending = neighbourhood_runs(plain_cells(out.results), seeds, anchor_key)
    while grid and pending and not report_only and rounds < max_rounds:
        rounds += 1
        print(f"neighbourhood, round {rounds}: {len(pending)} runs", flush=True)
        for i, j, s in pending:
            runner.run(grid_name(i, j), s, lr_overrides(*cell_lrs(i, j)))
        if runner.crashed:
            break
        pending = neighbourhood_runs(plain_cells(out.results), seeds, anchor_key)
    cells = plain_cells(out.results)
    an = plateau_analysis(cells)
    plateau = plateau_json(cells, an) if an else None
    # Phase 2: the starts.
    results: Dict[str, Any] = {}
    forms: Dict[str, List[str]] = {}
    for start in starts:
        e, d = start_lrs(start, anchor, factors[start])
        per_variant: Dict[str, List[Dict[str, Any]]] = {}
        for variant in VARIANTS:
            plan = planned(variant, start)
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
        "anchor": {"embedding": anchor[0], "dense": anchor[1], "from": "docs/lr_recovery.json (the earlier study's "
                   "best cell; the starts are factors of it)"},
        "contract": {"overrides": out.contract.overrides() if out.contract else None,
                     "failed": f"diverged, or held-out NE >= {COLLAPSED_NE} on some task",
                     "paired": "contender - plain_rollback on the seeds where both completed; failures beside"},
        "grid": [cell_json(c, an) for _, c in sorted(cells.items())], "neighbourhood_pending": [
            {"embedding": cell_lrs(i, j)[0], "dense": cell_lrs(i, j)[1], "seed": s}
            for i, j, s in neighbourhood_runs(cells, seeds, anchor_key)],
        "seeds": list(seeds), "best_cell": cell_json(cells[an["best"]], an) if an else None,
        "plateau": plateau["cells"] if plateau else None, "plateau_rule": plateau["rule"] if plateau else None,
        "starts": results, "forms": forms, "variants": variant_summary(results),
        "retired": {"lr_finder_narrow": "the LR finder with lr_find's earlier default sweep (100 steps, x0.01 to x100 "
                                        "of the start: a suggestion could not pass x10); replaced by the widened "
                                        "sweep (lr_finder, x0.001 to x10000, runs {start}/lr_finder_wide); its "
                                        "recorded runs ({start}/lr_finder) are read and reported, never trained again",
                    "hdet_controller_forms": "hdet (the earlier default) and the controller issue's variants: "
                                             "dominated (every one missed every target); not planned at emb_low_30, "
                                             "all_high_3 or a --start start; their recorded runs are read and reported",
                    "hdet_previous": "the earlier defaults (probe signal, regression score): dominated in "
                                     "docs/lr_recovery_f2; not rerun under the contract",
                    "hdet_paper": "the paper's form: dominated in docs/lr_recovery_f2; not rerun under the contract",
                    "plain": "plain without rollback: the contract turns rollback on for every contender",
                    "hdet_credit": "the discounted-credit signal under the effect controller: not among the variants "
                                   "pre-registered in docs/hdet.md, and its signal missed the truth target (4 of 6 "
                                   "cases at the low start, docs/hdet.md); never run under the contract"},
        "wall_time": wall_time(results), "contender_cost": wall,
        "targets": {**targets(results, ("hdet", *CONTROLLER_VARIANTS)), RANGE_TEST: range_test_targets(results, wall)},
        "chosen_rule": chosen_rule(),
        "range_test_rule": chosen_rule(marker="range-test-rule"),
    }
    if missing:
        out_json["partial"] = f"{n_planned - missing} of {n_planned} runs of the starts finished"
    elif an is None or neighbourhood_runs(cells, seeds, anchor_key):
        out_json["partial"] = "the neighbourhood of the best cell is not complete"
    return out_json


def chosen_rule(path: str = os.path.join(REPO, "docs", "hdet.md"), marker: str = "chosen-rule") -> str:
    """A pre-registered rule: docs/hdet.md's text between its ``marker`` markers (``chosen-rule``: the controller
    variants', written before their first recovery run; ``range-test-rule``: the range test on the replicas')."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(f"<!-- {marker} -->"), text.find(f"<!-- /{marker} -->")
    if start < 0 or end < start:
        raise StudyMismatch(f"{path}: no pre-registered rule between <!-- {marker} --> markers")
    return text[start + len(f"<!-- {marker} -->"):end].strip()


def run_entry(r: Optional[Dict[str, Any]], seed: int, name: str, variant: str, finder: Optional[Dict[str, Any]],
              missing: str) -> Dict[str, Any]:
    """One run of a contender as the report reads it (``r`` None: not run yet or crashed)."""
    if r is None:
        return {"seed": seed, "status": missing, "outcome": None, "ne": None, "wall_seconds": None, "lr_area": None,
                "bases": None, "run": name, "commit": None, "clean": None, **({"lr_finder": finder} if finder else {})}
    result = outcome(r)
    cost = (r["wall_seconds"] or 0) + sum((sw.get("wall_seconds") or 0) for sw in (finder or {}).get("sweeps", {}).values())
    range_test = (r.get("hdet") or {}).get("range_test")  # the range test on the replicas: its sweep is a cost
    range_test = range_test if isinstance(range_test, dict) else None
    steps = (r["steps"] + sum(sw["steps"] for sw in (finder or {}).get("sweeps", {}).values())
             + int((range_test or {}).get("steps") or 0))
    return {"seed": seed, "status": r["status"], "outcome": result,
            "collapsed": result == "failed" and r["status"] == "completed",
            "ne": mean_ne(r), "wall_seconds": r["wall_seconds"], "cost_seconds": cost, "cost_steps": steps,
            "lr_area": effective_lrs(r) if variant not in NO_LR_AREA else None,
            "bases": final_bases(r) if variant in HDET_VARIANTS and result == "completed" else None,
            "rollbacks": int((r.get("rollback") or {}).get("count", 0)),
            "run": name, "commit": r.get("commit"), "clean": r.get("clean"),
            **({"lr_finder": finder} if finder else {}),
            **({"range_test": {"steps": range_test.get("steps"), "committed": range_test.get("committed")}}
               if range_test else {})}


def wall_time(results: Dict[str, Any]) -> Dict[str, Any]:
    """Mean wall seconds of the completed runs per contender (side by side: the same session's machine),
    and one HDET run's over one plain run's."""
    per = {}
    for v in VARIANTS:
        walls = [r["cost_seconds"] for s in results.values() for r in s["runs"][v] if r["outcome"] == "completed"]
        per[v] = {"mean_seconds": _mean(walls), "runs": len(walls)}
    ratio = (per["hdet"]["mean_seconds"] / per["plain_rollback"]["mean_seconds"]
             if per["hdet"]["runs"] and per["plain_rollback"]["runs"] else None)
    return {"per_variant": per, "hdet_over_plain": ratio}


def contender_cost(path: str = BENCHMARK_FILE) -> Optional[Dict[str, Any]]:
    """The side-by-side wall ratios of the benchmark (``python -m benchmarks.contender_cost --write``:
    ``contender_cost`` -> ``ratio`` -> {contender: its wall seconds over plain + rollback's}) and where they come
    from; None where the file, the key or a ratio is absent (never an error: the report says not measured)."""
    try:
        with open(path) as f:
            cc = json.load(f).get("contender_cost")
        ratio = {v: float(x) for v, x in cc["ratio"].items()
                 if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None
    if not ratio:
        return None
    where = ", ".join(f"{k} {cc[k]}" for k in ("start", "seed", "date") if cc.get(k) is not None)
    repeats = f", median over {len(cc['repeats'])} repeats" if isinstance(cc.get("repeats"), list) else ""
    return {"ratio": ratio, "source": f"benchmarks/results.json contender_cost ({where}{repeats})"}


def cost_entry(runs: List[Dict[str, Any]], plain_runs: List[Dict[str, Any]], variant: str,
               wall: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A contender's cost against plain + rollback at one start: ``steps_ratio``, its mean cost_steps (sweeps
    included) over plain + rollback's on the seeds where both completed; ``wall_ratio``, the side-by-side
    benchmark's (:func:`contender_cost`), None where not measured, with ``wall_source``."""
    mine = {r["seed"]: r.get("cost_steps") for r in runs if r["outcome"] == "completed"}
    ref = {r["seed"]: r.get("cost_steps") for r in plain_runs if r["outcome"] == "completed"}
    seeds = [k for k in sorted(set(mine) & set(ref)) if mine[k] and ref[k]]
    measured = ((wall or {}).get("ratio") or {}).get(variant)
    return {"steps_ratio": statistics.fmean(mine[k] for k in seeds) / statistics.fmean(ref[k] for k in seeds)
            if seeds else None, "steps_seeds": seeds,
            "wall_ratio": measured, "wall_source": wall["source"] if measured is not None else None}


def variant_summary(results: Dict[str, Any]) -> Dict[str, Any]:
    """Per contender, per start: the keys the acceptance reads (failed, paired_diff with ci95, gap_closed, cost)."""
    return {v: {start: {k: s["variants"][v][k] for k in ("failed", "paired_diff", "gap_closed", "completed", "cost")}
                for start, s in results.items()} for v in VARIANTS}


def cell_json(c: Cell, an: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {"embedding": c.embedding, "dense": c.dense, "ne": c.mean,
           "status": "failed" if c.failed else "completed", "seeds": sorted(c.ne), "runs": c.runs}
    if an is not None and c.key in an["stats"]:
        out["paired_diff"] = an["stats"][c.key]["diff"]
    return out


def plateau_json(cells: Dict[Tuple[int, int], Cell], an: Dict[str, Any]) -> Dict[str, Any]:
    pooled = an["pooled_std"]
    keys = an["plateau"] or []
    # Each cell stands for the LRs within half a grid step of it (a quarter decade).
    half = 10 ** (1 / (POINTS - 1))
    lr_range = {axis: [min(getattr(cells[k], axis) for k in keys) / half,
                       max(getattr(cells[k], axis) for k in keys) * half] if keys else None
                for axis in ("embedding", "dense")}
    rule = {"paired_std_pooled": pooled, "std": "pooled",
            "pooled_from": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "seeds": sorted(cells[k].ne)}
                            for k in an["pool"]],
            "lr_range": lr_range,
            "left_out_near_failed": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "ne": cells[k].mean,
                                      "paired_diff": an["stats"][k]["diff"]} for k in an["near_failed"]],
            "text": "cells whose mean paired difference from the best cell is within one pooled paired std (pooled "
                    "over every cell sharing 2+ seeds with the best), not within half a decade (factor sqrt(10) on "
                    "each axis) of a failed cell; the LR range extends half a grid step beyond the plateau's outer cells"}
    return {"cells": [{**cell_json(cells[k], an), "runs": None} for k in keys] if an["plateau"] is not None else None,
            "rule": rule, "lr_range": lr_range}


def summarize_start(per_variant: Dict[str, List[Dict[str, Any]]], records: Dict[str, Dict[str, Any]],
                    cells: Dict[Tuple[int, int], Cell], an: Optional[Dict[str, Any]],
                    lr_range: Optional[Dict[str, Optional[List[float]]]], start_lr: Dict[str, float],
                    wall: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A start against the plateau: misset or not, and per contender its failures, paired differences
    against plain + rollback, gap closed and LR areas.

    - misset: a plain run failed, or the plain runs are worse than the best cell by 3 pooled paired std or
      more (paired on the seeds both completed);
    - paired_diff: plain_rollback: plain - best cell; the others: contender - plain_rollback on the same
      seed, over the seeds where both completed (:func:`studies.contract.paired_over_seeds`);
    - gap_closed (misset starts only): mean(plain - contender) / mean(plain - best) over those seeds;
    - lr_area_in_plateau: per group, how many completed seeds' LR area lies in the plateau's range;
    - cost: against plain + rollback (:func:`cost_entry`; ``wall``: :func:`contender_cost`)."""
    sigma = an["pooled_std"] if an else None
    best = cells[an["best"]] if an else None
    rec = lambda r: records[r["run"]]  # noqa: E731
    by_seed = {v: {r["seed"]: rec(r) for r in runs if r["outcome"] is not None} for v, runs in per_variant.items()}
    plain = by_seed["plain_rollback"]
    plain_ok = {s: r for s, r in plain.items() if outcome(r) == "completed"}
    best_ne = lambda s: best.ne.get(s, best.mean)  # noqa: E731
    gap = paired([r["mean_ne"] - best_ne(s) for s, r in sorted(plain_ok.items())]) if best else None
    misset = None if not plain else any(outcome(r) == "failed" for r in plain.values()) or (
        sigma is not None and gap is not None and gap["mean"] >= 3 * sigma)  # None: no plain run yet
    out: Dict[str, Any] = {"lr": start_lr, "misset": misset, "label": None,
                           "plain_minus_best_in_std": gap["mean"] / sigma if gap and sigma else None,
                           "variants": {}, "runs": per_variant}
    for v, runs in per_variant.items():
        done = by_seed[v]
        if v == "plain_rollback":
            diff, seeds, closed, fraction = gap, sorted(plain_ok), None, None
        else:
            p = paired_over_seeds(done, plain)
            diff, seeds = p["diff"], p["seeds"]
            den = statistics.fmean(plain[s]["mean_ne"] - best_ne(s) for s in seeds) if seeds and best else None
            fraction = statistics.fmean(plain[s]["mean_ne"] - done[s]["mean_ne"] for s in seeds) / den if den else None
            closed = fraction if misset else None
        completed = [r for r in runs if r["outcome"] == "completed"]
        areas = [{"seed": r["seed"], **r["lr_area"]} for r in completed if r["lr_area"]]
        inside = lambda a, axis: lr_range[axis][0] <= a[axis] <= lr_range[axis][1]  # noqa: E731
        in_plateau = {axis: (sum(inside(a, axis) for a in areas)
                             if lr_range and lr_range[axis] else None) for axis in ("embedding", "dense")}
        both_in = (sum(inside(a, "embedding") and inside(a, "dense") for a in areas)
                   if lr_range and lr_range["embedding"] and lr_range["dense"] else None)
        near_start = sum(all(0.5 <= a[axis] / start_lr[axis] <= 2.0 for axis in ("embedding", "dense")) for a in areas)
        out["variants"][v] = {
            "failed": sum(r["outcome"] == "failed" for r in runs),
            "diverged": sum(r["status"] == "diverged" for r in runs),
            "collapsed": sum(bool(r.get("collapsed")) for r in runs),
            "paired_diff": diff, "paired_seeds": seeds, "gap_closed": closed, "gap_fraction": fraction,
            "lr_area_in_plateau": in_plateau, "lr_area_in_plateau_both": both_in, "lr_area_within_2x_of_start": near_start,
            "seeds": len(done), "completed": len(completed),
            "ne": _mean([r["ne"] for r in completed]), "ne_std": _std([r["ne"] for r in completed]),
            "lr_area": areas,
            "lr_area_geomean": {axis: geomean([a[axis] for a in areas]) if areas else None
                                for axis in ("embedding", "dense")},
            "rollbacks": [r.get("rollbacks") for r in runs if r["outcome"] is not None],
            "cost_seconds": _mean([r.get("cost_seconds") for r in completed]),
            "cost": cost_entry(runs, per_variant.get("plain_rollback", []), v, wall),
            "commits": sorted({r["commit"] for r in runs if r["outcome"] is not None and r.get("commit")}),
            "clean": all(r["clean"] for r in runs if r["outcome"] is not None)}
    return out


def hdet_overrides(record: Dict[str, Any]) -> List[str]:
    """The ``hdet`` overrides a finished run was launched with (its results line's record of it)."""
    return [o for o in record["overrides"] if o == "hdet=enabled" or o.startswith("hdet.")]


def render_markdown(result: Dict[str, Any]) -> str:
    """docs/lr_recovery.md from a study's result (:func:`studies.lr_recovery_report.render_markdown`)."""
    return report.render_markdown(result, sys.modules[__name__])


def plot(result: Dict[str, Any], records: Dict[str, Dict[str, Any]], path: str) -> None:
    report.plot(result, records, path, sys.modules[__name__])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.lr_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="docs/lr_recovery_f3",
                    help="study directory: its results.jsonl (one line per finished run, committed, so a later "
                         "session resumes where an earlier one stopped; docs/lr_recovery_f2 holds the study before "
                         "the fairness contract, with its report)")
    ap.add_argument("--work", default=None,
                    help="where the run directories go (default: outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--anchor", type=float, nargs=2, metavar=("EMBEDDING", "DENSE"), default=None,
                    help="the point the starts are factors of (default: docs/lr_recovery.json's anchor)")
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
    ap.add_argument("--docs", default="docs", help="where lr_recovery.{md,json,png} go (default docs)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the reports from the results file alone (marked partial until "
                         "every run has its line)")
    add_study_arguments(ap)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. data=tiny trainer.nproc=2)")
    args = ap.parse_args(argv)
    try:
        extra_starts(args.start, {})  # the values' form and STARTS' names, before anything is read or written
        train = not args.report_only and args.verify is None
        if args.verify is None:  # the recorded starts' names too, before StudyFiles.open (which may copy a file)
            anchor = tuple(args.anchor) if args.anchor else recovery_anchor(os.path.join(os.path.abspath(args.docs),
                                                                                         "lr_recovery.json"))
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
                       args.max_rounds, not args.no_grid, added)
    except (StudyMismatch, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["command"] = "python -m studies.lr_recovery " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
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
