"""``python -m studies.lr_recovery``: can one HDET run find each group's learning rate?

A study with a known answer, on the benchmark data set, cold start (no warm-start checkpoint):

1. A grid of plain runs (HDET off) over the embedding LR x one shared dense LR (the transformer,
   non_embedding and no_decay groups), 5 x 5 points on a log grid spanning 100x, one seed; then the
   growth rule (:func:`next_runs`, at most ``--max-extensions`` rounds): while the best cell lacks a
   grid neighbour on some side of either axis, the point beyond it is trained (until the best is
   interior on both axes, or the run beyond diverges); then all seeds on the best cell (and the
   runner-up while no paired std exists) and on every cell of the plateau.
2. From the point the starts are factors of (the best cell, or where the tuned runs already
   trained) and four misset starts (every group 10x too low; 10x too high; embedding 10x low with
   dense 10x high; the reverse), seeds 0 1 2 each:
   - the plain run at that point (the gap HDET should close),
   - ``hdet``: the product's default (conf/hdet/enabled.yaml), anneal-then-probe with the effect
     controller (``HDET_ANNEAL_EFFECT``),
   - ``hdet_previous``: the previous defaults, probe signal and regression score (``HDET_NEW``),
   - ``hdet_paper``: HDET in the paper's form (softmax, sigma 0.1, training-loss signal: ``HDET_PAPER``),
   - ``prodigy`` and ``schedulefree``: plain runs with a parameter-free dense optimizer.
3. ``lr_recovery.json`` and ``lr_recovery.md``, on a well-posed target (:func:`plateau_analysis`):
   the plateau (the cells within one paired std of the best cell, half a decade away from any
   diverged cell), whether the optimum is interior, which starts are misset (plain runs worse than
   the best cell by 3 paired std), and per start and contender the paired difference (HDET - plain,
   same seed) with a 95% t-interval, the gap closed, each group's LR area over the pass and whether
   it lies in the plateau's LR range, divergences, wall time; ``lr_recovery.png``: each group's
   base over the pass with the best cell and the plateau's range drawn.

Every run is an ordinary ``python -m recsys_hdet.train +experiment=baseline_low ...`` job trained
by :func:`studies.ablation.run_one`, so the study is resumable exactly as the ablation is: each
finished run appends its line to ``<out>/results.jsonl`` (:mod:`studies.harness`), a run
with a line is skipped, a crashed one is redone, and the reports are rebuilt from that file alone
(``--report-only``). Run directories go to ``--work`` (for a study under docs/, the git-ignored
``outputs/studies/<study>``). Phase 2 needs phase 1's best cell, so a rerun after an interrupted grid
continues the grid first.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from studies import harness as SR
from studies.harness import (AblationConfig, StudyFiles, StudyMismatch, fmt as _f, machine_line, run_one,
                             paired, run_schedules, write_reports)
from recsys_hdet.components.metrics import read_json, read_jsonl
from recsys_hdet.constants import TASKS

DENSE = ("transformer", "non_embedding", "no_decay")
# The two LRs the study reports per start: the embedding group's, and the dense groups' geometric mean.
REPORTED = {"embedding": ("embedding",), "dense": DENSE}
PRESET = "baseline_low"  # plain, 2 x 2 layout, benchmark data, cold start
# Centres of the grid, between Baseline-Low's and Baseline-High's LRs; each axis spans 100x.
GRID_CENTRE = {"embedding": 0.06, "dense": 0.003}


STARTS: Dict[str, Tuple[float, float]] = {  # (embedding, dense) factor relative to the grid optimum
    "tuned": (1.0, 1.0),
    "all_low": (0.1, 0.1),
    "all_high": (10.0, 10.0),
    "emb_low_dense_high": (0.1, 10.0),
    "emb_high_dense_low": (10.0, 0.1),
}
# The scale-free controller (the scale-free form), conf/hdet/enabled.yaml's defaults spelled out so
# that the study does not move when the defaults do: probe signal, one joint least-squares fit of the
# replicas' probe losses on every group's log offset (regression, pooled over syncs with beta 0.9),
# log space with a x1.25 spread, on from step 0, a consistent signal travelling 3 decades over the pass.
# Chosen by docs/probe_bias.md (seed 0, two starts) before any of this study's HDET runs: the x2
# spread alone cost 0.005-0.008 NE, the x1.25 spread 0.0002-0.0012, and the joint fit moved the
# embedding group up from all-low where the per-group rank correlation moved it down.
HDET_NEW = ("hdet=enabled", "hdet.space=log", "hdet.score=regression", "hdet.signal=probe", "hdet.alpha=0.25",
            "hdet.controller_start=0", "hdet.beta=0.9", "hdet.travel_decades=3.0")
# The form the product shipped before (the paper's): softmax with sigma 0.1 on the training loss,
# linear spread 1 +- 1/9, controller from step 300 (conf/hdet/enabled.yaml's values then).
HDET_PAPER = ("hdet=enabled", "hdet.space=linear", "hdet.score=softmax", "hdet.sigma=0.1", "hdet.signal=train",
              "hdet.alpha=0.1111111111111111", "hdet.beta=0.9", "hdet.controller_start=300")
# Two parameter-free anchors a user would try first for the dense groups, each a plain run from the
# same start (the embedding group keeps its fused rowwise Adagrad at the start's LR: no
# parameter-free fused embedding optimizer exists):
# - Prodigy: the start's dense LR is its initial step-size estimate d0, the groups' LR multiplier 1.0
#   under the same one-cycle schedule (its authors' use: lr 1 with a warm-up and cosine decay);
# - Schedule-Free AdamW at the start's dense LR: the schedule's warm-up, then constant (it replaces
#   the decay by iterate averaging), no momentum cycling.
def prodigy(embedding: float, dense: float) -> List[str]:
    return [*lr_overrides(embedding, 1.0), "optim.dense.type=prodigy", f"optim.dense.d0={dense:.6g}"]


def schedulefree(embedding: float, dense: float) -> List[str]:
    return [*lr_overrides(embedding, dense), "optim.dense.type=schedulefree_adamw",
            "optim.schedule.final_div_factor=0.04", "optim.schedule.cycle_momentum=false"]


# The product's default since this study (conf/hdet/enabled.yaml): the anneal-then-probe signal (4 cooldown steps to LR 0 on reserved rows,
# probed, restored) under the effect-size controller (moves by the fitted NE slope per ln LR relative
# to the loss, clipped to a trust region of ln 1.25 per sync, resting where the slope is within 2
# standard errors of zero). Chosen by docs/lr_truth.md before any of its recovery runs: anneal_probe
# has the scorecard's best sign agreement (regression 4 of 7; no signal reaches 5 of 6 per start),
# and the effect controller rests where the truth tells no multiplier apart (2 of 5 at rest, the
# significance scores never rest).
HDET_ANNEAL_EFFECT = ("hdet=enabled", "hdet.space=log", "hdet.score=effect", "hdet.signal=anneal_probe",
                      "hdet.anneal_probe.steps=4", "hdet.effect_scale=0.005", "hdet.min_t=2.0", "hdet.alpha=0.25",
                      "hdet.controller_start=0", "hdet.beta=0.9")

# The discounted-credit signal (MARTHE's hypergradient read from the spread: each replica scores the
# probe rows at the replicas' averaged iterate moved along each group's discounted sum of past
# displacements, mu 0.9) under the same effect controller. Run after docs/lr_truth.md scored it best
# (5 of 7 cases with the effect score, against anneal_probe's 2 of 7), before any of its recovery runs.
HDET_CREDIT_EFFECT = ("hdet=enabled", "hdet.space=log", "hdet.score=effect", "hdet.signal=discounted_credit",
                      "hdet.discounted_credit.mu=0.9", "hdet.discounted_credit.fraction=0.5", "hdet.effect_scale=0.005",
                      "hdet.min_t=2.0", "hdet.alpha=0.25", "hdet.controller_start=0", "hdet.beta=0.9")

# variant -> the hdet overrides added to the start's LRs, or a function of the start's LRs giving
# every override
VARIANTS = {"plain": (), "hdet": HDET_ANNEAL_EFFECT, "hdet_previous": HDET_NEW, "hdet_paper": HDET_PAPER,
            "prodigy": prodigy, "schedulefree": schedulefree, "hdet_credit": HDET_CREDIT_EFFECT}
# The contender "hdet" is the product's default; its runs and the previous
# defaults' keep the names they were trained under in results.jsonl (start/<run name>).
RUN_NAMES = {"hdet": "hdet_anneal_effect", "hdet_previous": "hdet"}
# Schedule-Free's LR is constant after its warm-up where the preset's schedule decays to ~0: its LR
# area against that schedule says nothing of the LR it settles on; not reported.
NO_LR_AREA = ("schedulefree",)


HDET_VARIANTS = ("hdet", "hdet_previous", "hdet_paper", "hdet_credit")


def variant_overrides(variant: str, embedding: float, dense: float) -> List[str]:
    v = VARIANTS[variant]
    return v(embedding, dense) if callable(v) else [*lr_overrides(embedding, dense), *v]


def lr_overrides(embedding: float, dense: float) -> List[str]:
    return [f"optim.lr.embedding={embedding:.6g}", *(f"optim.lr.{g}={dense:.6g}" for g in DENSE)]


def _run(study: StudyFiles, name: str, seed: int, overrides: Sequence[str], extra: Sequence[str],
         report_only: bool = False) -> Optional[Dict[str, Any]]:
    """Trains one run (unless its line is in the results file) and returns its line, or None if it
    crashed (or, with ``report_only``, has not run yet: nothing is trained then)."""
    res = run_one(study, AblationConfig(name, PRESET, name, None, None), seed, [*overrides, *extra], report_only)
    if res.get("crashed"):
        print(f"{name} seed {seed}: CRASHED (exit status {res['exit_status']}), see {res['log']}", flush=True)
        return None
    r = res["record"]
    if r is not None and not report_only:
        state = "skipped (finished earlier)" if res["skipped"] else f"{res['process_seconds']:.0f} s"
        print(f"{name} seed {seed}: {r['status']}, mean NE {mean_ne(r)}, {state}", flush=True)
    return r


def mean_ne(run: Dict[str, Any]) -> Optional[float]:
    """Mean held-out NE over the tasks of a results line (or of a summary.json); None unless completed."""
    if run.get("status") != "completed":
        return None
    if "mean_ne" in run:
        return run["mean_ne"]
    return statistics.fmean(run["eval"][t]["ne"] for t in TASKS)


def grid_name(i: int, j: int) -> str:
    return f"grid/e{i}_d{j}"


def max_lr_trajectory(path: str) -> List[Tuple[int, Dict[str, float]]]:
    """Per sync, each LR group's controlled base in max-LR units: the run's max LR times the base
    over the OneCycle schedule it replaces (at that step), so that it compares with the grid's
    max LRs whatever the schedule's phase (the annealed end is ~1e-5 of the peak). ``path``: a run
    directory (see :func:`record_trajectory` for a results line)."""
    steps = read_json(os.path.join(path, "summary.json"))["steps"]
    return _trajectory(read_jsonl(os.path.join(path, "hdet.jsonl")), run_schedules(path, steps), steps)


def record_trajectory(record: Dict[str, Any]) -> List[Tuple[int, Dict[str, float]]]:
    """:func:`max_lr_trajectory` of a results line (its syncs' bases, 6 significant digits)."""
    return _trajectory(SR.sync_records(record), SR.schedules(record, record["steps"]), record["steps"])


def _trajectory(records, schedules, steps: int) -> List[Tuple[int, Dict[str, float]]]:
    out = []
    for r in records:
        if r.get("hparams") and "event" not in r:
            at = min(r["step"], steps - 1)
            out.append((r["step"], {g: schedules[g].max_lr * r["hparams"][f"lr/{g}"]["next_base"] / schedules[g](at)[0]
                                    for g in ("embedding", *DENSE)}))
    return out


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
        per_run.append({axis: [_geomean([v[g] for g in REPORTED[axis]]) / start_lr[axis] for v in at]
                        for axis in REPORTED})
    side = lambda x: (x > 1) - (x < 1)
    return {"at": list(ORDERING_AT), "seeds": len(per_run),
            "ratio_geomean": {axis: [_geomean([r[axis][k] for r in per_run]) for k in range(len(ORDERING_AT))]
                              for axis in REPORTED},
            "per_run": per_run,
            "same_direction_as_dense": [side(r["embedding"][-1]) == side(r["dense"][-1]) for r in per_run],
            "stable": {axis: len({side(r[axis][-1]) for r in per_run}) == 1 for axis in REPORTED}}


def final_bases(record: Dict[str, Any]) -> Dict[str, float]:
    """Each LR group's controlled base in max-LR units (:func:`record_trajectory`) of a results line,
    geometric mean over the last quarter of the syncs."""
    trajectory = record_trajectory(record)
    tail = trajectory[len(trajectory) - max(1, len(trajectory) // 4):]
    return {g: _geomean([v[g] for _, v in tail]) for g in ("embedding", *DENSE)}


def _geomean(xs) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


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
# The grid as cells, its plateau, and the rule that grows it.
#
# A cell is one point of the grid's lattice (half a decade apart for 5 points) with every plain run
# trained there: the grid's own runs and the plain runs of the starts that fall on it (the tuned
# start is the best cell, all_low and emb_high_dense_low are cells too), one NE per seed (training
# is deterministic: the same seed at the same point gives the same NE, so duplicates are one run).


class Cell:
    def __init__(self, i: int, j: int, embedding: float, dense: float) -> None:
        self.i, self.j, self.embedding, self.dense = i, j, embedding, dense
        self.ne: Dict[int, Optional[float]] = {}  # seed -> mean NE over the tasks; None: diverged
        self.runs: List[str] = []

    @property
    def key(self) -> Tuple[int, int]:
        return self.i, self.j

    @property
    def diverged(self) -> bool:
        """A cell where any seed diverged: not a safe place to train, whatever its other seeds did."""
        return any(v is None for v in self.ne.values())

    @property
    def mean(self) -> Optional[float]:
        return None if self.diverged or not self.ne else statistics.fmean(self.ne.values())


def plain_cells(records: Dict[str, Dict[str, Any]], points: int = 5) -> Dict[Tuple[int, int], Cell]:
    """The grid's cells from a results file: every finished plain run on the lattice."""
    cells: Dict[Tuple[int, int], Cell] = {}
    seen: Dict[Tuple[int, int, int], List[Optional[float]]] = {}
    for name in sorted(records):
        r = records[name]
        if r.get("hdet") or r.get("status") not in ("completed", "diverged"):
            continue
        if not (name.startswith("grid/") or "/plain/" in name):
            continue
        dense = [r["max_lr"][g] for g in DENSE]
        if max(dense) > min(dense) * (1 + 1e-6):
            continue  # not a point of the study's plane (the dense groups share one LR there)
        i = grid_index(r["max_lr"]["embedding"], GRID_CENTRE["embedding"], points)
        j = grid_index(dense[0], GRID_CENTRE["dense"], points)
        if i is None or j is None:
            continue
        cell = cells.setdefault((i, j), Cell(i, j, grid_lr(GRID_CENTRE["embedding"], points, i),
                                             grid_lr(GRID_CENTRE["dense"], points, j)))
        cell.runs.append(name)
        seen.setdefault((i, j, r["seed"]), []).append(r["mean_ne"] if r["status"] == "completed" else None)
    for (i, j, seed), values in seen.items():
        cells[(i, j)].ne[seed] = None if None in values else statistics.fmean(values)
    return cells


def near(a: Cell, b: Cell, decades: float = 0.5) -> bool:
    """Whether ``b`` lies within ``decades`` of ``a`` on both axes (for half a decade: a factor
    sqrt(10) or less on each axis, the 8 grid neighbours of a 5-point grid)."""
    return all(abs(math.log10(x / y)) <= decades + 1e-9 for x, y in ((a.embedding, b.embedding), (a.dense, b.dense)))


def plateau_analysis(cells: Dict[Tuple[int, int], Cell]) -> Optional[Dict[str, Any]]:
    """The best cell, each cell's paired difference from it, and the plateau.

    - best: the completed cell with the lowest mean NE (a cell with a diverged seed is not a candidate);
    - paired difference: the mean over the seeds a cell shares with the best of (cell - best) on the
      same seed; its paired std: the std of those differences where they are 2 or more, else the
      pooled paired std (the root of the dof-weighted mean variance) of the cells that have them;
    - plateau: every completed cell whose paired difference is within one paired std of the best,
      and not within half a decade of a diverged cell (:func:`near`).
    None when no cell has completed. ``plateau`` is None while no cell but the best has several seeds
    in common with it (no paired std to measure "within" against)."""
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
        own = statistics.stdev(diffs) if len(diffs) >= 2 and k != best else None
        if own is not None:
            num += (len(diffs) - 1) * own ** 2
            den += len(diffs) - 1
            pool.append(k)
        stats[k] = {"diff": statistics.fmean(diffs) if diffs else c.mean - b.mean, "shared_seeds": shared,
                    "own_std": own}
    pooled = math.sqrt(num / den) if den else None
    diverged = [c for c in cells.values() if c.diverged]
    plateau = None
    if pooled is not None:
        plateau = []
        for k, st in stats.items():
            st["std"] = st["own_std"] if st["own_std"] is not None else pooled
            st["within"] = st["diff"] <= st["std"]
            st["near_diverged"] = any(near(done[k], d) for d in diverged)
            if st["within"] and not st["near_diverged"]:
                plateau.append(k)
    excluded = [k for k, st in stats.items() if st.get("within") and st.get("near_diverged")]
    return {"best": best, "stats": stats, "pooled_std": pooled, "pool": pool, "plateau": plateau,
            "near_diverged": excluded if pooled is not None else [],
            "interior": interior(cells, best), "missing_neighbours": missing_neighbours(cells, best)}


NEIGHBOURS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def missing_neighbours(cells: Dict[Tuple[int, int], Cell], key: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The grid neighbours of ``key`` along each axis that have no finished run (completed or diverged)."""
    return [(key[0] + di, key[1] + dj) for di, dj in NEIGHBOURS if (key[0] + di, key[1] + dj) not in cells]


def interior(cells: Dict[Tuple[int, int], Cell], key: Tuple[int, int]) -> bool:
    """True only if the cell has grid neighbours on both sides on both axes (a diverged one counts:
    the optimum is bracketed by it)."""
    return not missing_neighbours(cells, key)


def next_runs(cells: Dict[Tuple[int, int], Cell], seeds: Sequence[int]) -> List[Tuple[int, int, int]]:
    """The growth rule: the (i, j, seed) grid runs to train next, none once it is satisfied.

    1. While the best cell lacks a grid neighbour on some side of either axis (it is on the grid's
       edge there), train that neighbour (first seed): the grid grows beyond the edge that holds the
       best cell until the best is interior on both axes, or the run beyond it diverged (a diverged
       neighbour brackets it too).
    2. Then every seed on the best cell and, while no other cell has several seeds (so no paired std
       exists yet), on the runner-up (second-lowest mean NE), to measure the paired std;
    3. then every seed on every cell of the plateau (:func:`plateau_analysis`).
    A caller repeats it until it returns nothing (each answer depends on the runs before)."""
    an = plateau_analysis(cells)
    if an is None:
        return []
    missing = an["missing_neighbours"]
    if missing:
        return [(i, j, seeds[0]) for i, j in missing]
    if an["plateau"] is None:
        done = sorted((c.mean, k) for k, c in cells.items() if c.mean is not None)
        targets = [k for _, k in done[:2]]
    else:
        targets = [an["best"], *(k for k in an["plateau"] if k != an["best"])]
    return [(i, j, s) for i, j in targets for s in seeds if s not in cells[(i, j)].ne]


# ----------------------------------------------------------------------------------------------
# The study.


def effective_lrs(record: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """A run's LR area (:func:`studies.harness.lr_area`) in max-LR units: the preset's max LR
    times the area, per reported group (dense: the three dense groups' geometric mean)."""
    area, preset = record.get("lr_area"), record.get("preset_lr")
    if not area or not preset or any(g not in area for g in ("embedding", *DENSE)):
        return None
    return {key: _geomean([area[g] * preset[g] for g in groups]) for key, groups in REPORTED.items()}


def study(out: StudyFiles, seeds: Sequence[int], extra: Sequence[str], points: int = 5,
          starts: Sequence[str] = tuple(STARTS), report_only: bool = False, max_extensions: int = 8,
          variants: Sequence[str] = tuple(VARIANTS)) -> Dict[str, Any]:
    # Phase 1: the grid, one seed, then the growth rule (:func:`next_runs`) until it is satisfied.
    finished = True

    def train_point(i: int, j: int, seed: int) -> None:
        nonlocal finished
        e, d = grid_lr(GRID_CENTRE["embedding"], points, i), grid_lr(GRID_CENTRE["dense"], points, j)
        if _run(out, grid_name(i, j), seed, lr_overrides(e, d), extra, report_only) is None:
            finished = False

    for i in range(points):
        for j in range(points):
            train_point(i, j, seeds[0])
    rounds = 0
    pending: List[Tuple[int, int, int]] = []
    while finished:
        pending = next_runs(plain_cells(out.results, points), seeds)
        if not pending or report_only or rounds >= max_extensions:
            break
        rounds += 1
        print(f"growth rule, round {rounds}: {len(pending)} runs: "
              + ", ".join(f"{grid_name(i, j)} seed {s}" for i, j, s in pending), flush=True)
        for i, j, s in pending:
            train_point(i, j, s)
    cells = plain_cells(out.results, points)
    grid_records = [r for n, r in out.results.items() if n.startswith("grid/")]
    partial: Dict[str, Any] = {
        "grid": [cell_json(c) for _, c in sorted(cells.items())], "grid_points": points,
        "growth_rounds": rounds, "seeds": list(seeds), "starts": {}, "best_cell": None,
        "growth_next": [{"embedding": grid_lr(GRID_CENTRE["embedding"], points, i),
                         "dense": grid_lr(GRID_CENTRE["dense"], points, j), "seed": s} for i, j, s in pending],
        "wall_seconds_grid": sum(r["wall_seconds"] or 0 for r in grid_records)}
    if not finished:
        # the best cell is not known until every grid point has run: no starts yet.
        ran = sum(SR.is_finished(out.results, SR.run_name(grid_name(i, j), seeds[0]))
                  for i in range(points) for j in range(points))
        partial["partial"] = f"{ran} of {points * points} runs of the initial grid finished"
        return partial
    an = plateau_analysis(cells)
    if an is None:
        partial["partial"] = "every grid run diverged"
        return partial
    best = cells[an["best"]]
    anchor = start_anchor(out.results, best)
    print(f"best cell: embedding {best.embedding:.4g}, dense {best.dense:.4g}, mean NE {best.mean:.4f} "
          f"({len(best.ne)} seeds); starts from embedding {anchor[0]:.4g}, dense {anchor[1]:.4g}", flush=True)
    plateau = plateau_json(cells, an, points)
    # Phase 2: the starts.
    results: Dict[str, Any] = {}
    forms: Dict[str, List[str]] = {}
    for start in starts:
        fe, fd = STARTS[start]
        per_variant = {}
        for variant in VARIANTS:
            overrides = variant_overrides(variant, anchor[0] * fe, anchor[1] * fd)
            runs = []
            for seed in seeds:
                name = f"{start}/{RUN_NAMES.get(variant, variant)}"
                # A variant not asked for is only read (e.g. while its controller is being changed).
                s = _run(out, name, seed, overrides, extra, report_only or variant not in variants)
                missing = "not run yet" if report_only or variant not in variants else "crashed"
                runs.append({"seed": seed, "status": s["status"] if s else missing, "ne": mean_ne(s) if s else None,
                             "wall_seconds": s["wall_seconds"] if s else None,
                             "lr_area": effective_lrs(s) if s and variant not in NO_LR_AREA else None,
                             "bases": final_bases(s) if s and variant in HDET_VARIANTS and s["status"] == "completed" else None,
                             "run": SR.run_name(name, seed)})
                if s and variant in HDET_VARIANTS and variant not in forms:
                    # the form a variant's runs were trained with, read from a run, not assumed
                    forms[variant] = hdet_overrides(s)
            per_variant[variant] = runs
        start_lr = {"embedding": anchor[0] * fe, "dense": anchor[1] * fd}
        results[start] = summarize_start(per_variant, cells, an, plateau["lr_range"], start_lr)
        results[start]["orderings"] = {v: orderings([out.results[r["run"]] for r in per_variant[v] if r["bases"]], start_lr)
                                       for v in ("hdet", "hdet_previous", "hdet_credit")}
    unfinished = sum(r["status"] == "not run yet" for s in results.values() for v in s["runs"].values() for r in v)
    if unfinished:
        partial["partial"] = f"{unfinished} runs of the starts not run yet"
    # What one HDET run replaces: a 25-point grid of plain runs (mean wall time of the grid's runs x 25,
    # diverged ones included: a grid pays for them too) against the mean wall time of one completed HDET
    # run (every start and seed finished so far; a diverged one stops early and would flatter the ratio).
    grid_walls = [r["wall_seconds"] for r in grid_records if r["wall_seconds"]]
    completed_walls = lambda variant: [r["wall_seconds"] for s in results.values() for r in s["runs"][variant]
                                       if r["wall_seconds"] and r["status"] == "completed"]
    hdet_walls = completed_walls("hdet") or completed_walls("hdet_previous")
    # The grid ran earlier, some of its runs beside other work; the completed plain runs of
    # the starts ran beside the HDET runs, so their ratio is the like-for-like per-run cost.
    plain_walls = completed_walls("plain")
    wall = {"grid_run_mean_seconds": _mean(grid_walls), "hdet_run_mean_seconds": _mean(hdet_walls),
            "hdet_runs": len(hdet_walls), "start_plain_run_mean_seconds": _mean(plain_walls),
            "start_plain_runs": len(plain_walls)}
    wall["grid25_over_one_hdet_run"] = (25 * wall["grid_run_mean_seconds"] / wall["hdet_run_mean_seconds"]
                                        if hdet_walls and grid_walls else None)
    wall["hdet_run_over_plain_run"] = (wall["hdet_run_mean_seconds"] / wall["start_plain_run_mean_seconds"]
                                       if hdet_walls and plain_walls else None)
    return {**partial, "best_cell": cell_json(best, an), "optimum_interior": an["interior"],
            "missing_neighbours": [{"embedding": grid_lr(GRID_CENTRE["embedding"], points, i),
                                    "dense": grid_lr(GRID_CENTRE["dense"], points, j)}
                                   for i, j in an["missing_neighbours"]],
            "plateau": plateau["cells"], "plateau_rule": plateau["rule"], "start_anchor": list(anchor),
            "starts": results, "forms": forms, "wall_time": wall}


def start_anchor(results: Dict[str, Dict[str, Any]], best: Cell) -> Tuple[float, float]:
    """The point the starts are factors of: where the study's tuned plain runs trained, once they have
    (so that a grid grown later does not orphan the starts already run), else the best cell."""
    for seed_line in sorted(n for n in results if n.startswith("tuned/plain/")):
        lr = results[seed_line]["max_lr"]
        return lr["embedding"], lr["transformer"]
    return best.embedding, best.dense


def cell_json(c: Cell, an: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {"embedding": c.embedding, "dense": c.dense, "ne": c.mean,
           "status": "diverged" if c.diverged else "completed", "seeds": sorted(c.ne), "runs": c.runs}
    if an is not None and c.key in an["stats"]:
        st = an["stats"][c.key]
        out.update({"paired_diff": st["diff"], "paired_std": st.get("std"),
                    "std_from": "own" if st["own_std"] is not None else "pooled"})
    return out


def plateau_json(cells: Dict[Tuple[int, int], Cell], an: Dict[str, Any], points: int) -> Dict[str, Any]:
    pooled = an["pooled_std"]
    keys = an["plateau"] or []
    # Each cell stands for the LRs within half a grid step of it (a quarter decade for 5 points).
    half = {axis: 10 ** (1 / (points - 1)) for axis in ("embedding", "dense")}
    lr_range = {axis: [min(getattr(cells[k], axis) for k in keys) / half[axis],
                       max(getattr(cells[k], axis) for k in keys) * half[axis]] if keys else None
                for axis in ("embedding", "dense")}
    rule = {"paired_std_pooled": pooled,
            "pooled_from": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "seeds": sorted(cells[k].ne)}
                            for k in an["pool"]],
            "lr_range": lr_range,
            "left_out_near_diverged": [{"embedding": cells[k].embedding, "dense": cells[k].dense, "ne": cells[k].mean,
                                        "paired_diff": an["stats"][k]["diff"]} for k in an["near_diverged"]],
            "text": "cells within one paired std of the best cell (own paired std where a cell shares 2+ seeds with "
                    "the best, else the pooled one), not within half a decade (factor sqrt(10) on each axis) of a "
                    "diverged cell; the LR range extends half a grid step beyond the plateau's outer cells"}
    return {"cells": [{**cell_json(cells[k], an), "runs": None} for k in keys] if an["plateau"] is not None else None,
            "rule": rule, "lr_range": lr_range}


# What a diverged run scores in the paired differences and the gap closed: the NE of the base-rate
# predictor, which is 1 by NE's definition (a model that learnt nothing; a NaN model is worth no more).
# Without it a start whose plain runs all diverge (dense 10x high does, at every embedding LR of the
# grid) has no gap, and HDET's diverged seeds would silently drop out of its own mean. The NE columns
# themselves stay means over the completed runs, with the diverged counted beside them.
DIVERGED_NE = 1.0

def gap_ne(run: Dict[str, Any]) -> Optional[float]:
    """A run's NE in the paired differences and the gap closed: a diverged run counts as ``DIVERGED_NE``."""
    return DIVERGED_NE if run["status"] == "diverged" else run["ne"] if run["status"] == "completed" else None


def summarize_start(per_variant: Dict[str, List[Dict[str, Any]]], cells: Dict[Tuple[int, int], Cell],
                    an: Dict[str, Any], lr_range: Dict[str, Optional[List[float]]],
                    start_lr: Dict[str, float]) -> Dict[str, Any]:
    """A start against the plateau: misset or not, and per contender its paired differences, gap
    closed, LR areas, divergences.

    - misset: the plain runs are worse than the best cell by at least three paired std (the pooled
      paired std), their paired difference taken on the seeds they share with the best cell;
    - paired_diff: plain: plain - best cell; hdet, hdet_paper: contender - plain, same seed;
    - gap_closed (misset starts only): mean(plain - contender) / mean(plain - best) over the seeds
      all three have (the best cell's mean NE where it lacks the seed);
    - lr_area_in_plateau: per group, how many completed seeds' LR area lies in the plateau's range."""
    best = cells[an["best"]]
    sigma = an["pooled_std"]
    by_seed = {v: {r["seed"]: r for r in runs if gap_ne(r) is not None} for v, runs in per_variant.items()}
    plain = by_seed["plain"]
    best_ne = lambda s: best.ne.get(s, best.mean)
    gap = paired([gap_ne(r) - best_ne(s) for s, r in sorted(plain.items())])
    misset = sigma is not None and gap is not None and gap["mean"] >= 3 * sigma
    out: Dict[str, Any] = {"lr": start_lr, "misset": misset,
                           "plain_minus_best_in_std": gap["mean"] / sigma if gap and sigma else None,
                           "variants": {}, "runs": per_variant}
    for v, runs in per_variant.items():
        done = by_seed[v]
        completed = [r for r in runs if r["status"] == "completed"]
        if v == "plain":
            diff, closed = gap, None
        else:
            shared = sorted(set(done) & set(plain))
            diff = paired([gap_ne(done[s]) - gap_ne(plain[s]) for s in shared])
            den = statistics.fmean(gap_ne(plain[s]) - best_ne(s) for s in shared) if shared else None
            closed = (statistics.fmean(gap_ne(plain[s]) - gap_ne(done[s]) for s in shared) / den
                      if misset and den else None)
        areas = [{"seed": r["seed"], "status": r["status"], **(r["lr_area"] or {})} for r in runs if r["lr_area"]]
        in_plateau = {axis: (sum(lr_range[axis][0] <= a[axis] <= lr_range[axis][1] for a in areas
                                 if a["status"] == "completed") if lr_range[axis] else None)
                      for axis in ("embedding", "dense")}
        out["variants"][v] = {
            "paired_diff": diff, "gap_closed": closed, "lr_area_in_plateau": in_plateau,
            "diverged": sum(r["status"] == "diverged" for r in runs), "seeds": len(done), "completed": len(completed),
            "ne": _mean([r["ne"] for r in completed]), "ne_std": _std([r["ne"] for r in completed]),
            "lr_area": areas,
            "lr_area_geomean": {axis: _geomean([a[axis] for a in areas if a["status"] == "completed"])
                                if any(a["status"] == "completed" for a in areas) else None
                                for axis in ("embedding", "dense")},
            "wall_seconds": _mean([r["wall_seconds"] for r in runs])}
    return out


def hdet_overrides(record: Dict[str, Any]) -> List[str]:
    """The ``hdet`` overrides a finished run was launched with (its results line's record of it)."""
    return [o for o in record["overrides"] if o == "hdet=enabled" or o.startswith("hdet.")]


# ----------------------------------------------------------------------------------------------
# The report.

LABELS = {"plain": "plain", "hdet": "HDET anneal-then-probe, effect controller", "hdet_previous": "HDET previous defaults",
          "hdet_paper": "paper form", "prodigy": "Prodigy (dense)",
          "schedulefree": "Schedule-Free AdamW (dense)", "hdet_credit": "HDET discounted credit, effect controller"}


def _ci(p: Optional[Dict[str, Any]], digits: int = 4) -> str:
    if p is None:
        return "-"
    text = f"{p['mean']:+.{digits}f}"
    return text + (f" [{p['ci95'][0]:+.{digits}f}, {p['ci95'][1]:+.{digits}f}]" if p.get("ci95") else " (1 seed)")


def _lr(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def rollback_reruns(path: str) -> Optional[Dict[str, Any]]:
    """The dense-10x-high starts rerun with rollback on (``studies.paired_runs --set recovery_rollback``),
    summarized from that set's results file; None before it has a line."""
    from studies import paired_runs  # it imports this module's starts and HDET form

    results = SR.load(path)
    if not results:
        return None
    pset = paired_runs.SETS["recovery_rollback"]
    s = paired_runs.summarize(pset, results)
    return {"runs": s["runs"], "completed": s["completed"], "planned": len(pset.configs) * len(pset.seeds),
            "configs": s["configs"], "pairs": s["pairs"]}


def render_markdown(result: Dict[str, Any]) -> str:
    b = result.get("best_cell")
    lines = ["# Learning-rate recovery on the benchmark data set", ""]
    if result.get("partial"):
        lines += [f"**PARTIAL RESULT: {result['partial']}.** Every figure below comes from a finished run; "
                  "rerun `python -m studies.lr_recovery` to continue the study (finished runs are skipped).", ""]
    if b is None:
        lines += [f"Produced by `{result['command']}` on {result['machine']}. The best cell and the starts "
                  "follow once every grid point has run.", ""]
        return "\n".join(lines + _grid_table(result)) + "\n"
    rule = result["plateau_rule"]
    sigma = rule["paired_std_pooled"]
    lines += [f"Produced by `{result['command']}` on {result['machine']}. NE is the held-out day's normalized "
              "entropy, mean over the three tasks. A cell is a point of the grid with every plain run trained "
              "there (the grid's and the starts' plain runs: the same seed at the same point is the same run).", ""]
    missing = ", ".join(f"embedding {m['embedding']:.3g} / dense {m['dense']:.3g}" for m in result["missing_neighbours"])
    lines += [f"**Best cell**: embedding {b['embedding']:.4g}, dense {b['dense']:.4g}, mean NE {b['ne']:.4f} over "
              f"seeds {', '.join(map(str, b['seeds']))}. "
              + ("**The optimum is interior with today's grid**: the best cell has grid neighbours on both sides "
                 "on both axes." if result["optimum_interior"] else
                 f"**The optimum is NOT interior with today's grid**: the best cell has no grid neighbour at "
                 f"{missing}, so a better point may lie beyond it; the starts measure recovery to this grid's best, "
                 "not to a bracketed optimum.")]
    if result.get("growth_next"):
        lines[-1] += (" The growth rule (`next_runs`: grow beyond the edge holding the best cell until it is interior "
                      "or the run beyond diverges, then 3 seeds on the plateau) would train next: "
                      + ", ".join(f"{g['embedding']:.3g} / {g['dense']:.3g} seed {g['seed']}" for g in result["growth_next"])
                      + " (not run yet).")
    lines += [""]
    if sigma is None:
        lines += ["**Plateau: not measured**: no cell but the best has several seeds in common with it, so there is "
                  "no paired standard deviation yet.", ""]
    else:
        pooled_from = "; ".join(f"{p['embedding']:.3g} / {p['dense']:.3g} (seeds {', '.join(map(str, p['seeds']))})"
                                for p in rule["pooled_from"])
        rng = rule["lr_range"]
        lines += [f"**Plateau**: the cells whose mean paired difference from the best cell (per-seed differences on "
                  f"the seeds they share with it) is within one paired standard deviation, and that are not within "
                  f"half a decade (a factor sqrt(10) or less on each axis: the 8 grid neighbours) of a diverged cell. "
                  f"A cell with several seeds in common with the best uses its own paired std; a cell with one seed "
                  f"uses the pooled paired std of the cells that have several, {sigma:.4f} (from {pooled_from}). "
                  f"Most cells have one seed (0), so their membership rests on one seed's difference.", "",
                  "| embedding | dense | mean NE | seeds | paired diff from best | paired std (from) |", "|---|---|---|---|---|---|"]
        for c in result["plateau"]:
            lines.append(f"| {c['embedding']:.3g} | {c['dense']:.3g} | {c['ne']:.4f} | {', '.join(map(str, c['seeds']))} | "
                         f"{c['paired_diff']:+.4f} | {c['paired_std']:.4f} ({c['std_from']}) |")
        if rule["left_out_near_diverged"]:
            lines += ["", "Within one paired std of the best but left out, within half a decade of a diverged cell: "
                      + "; ".join(f"{c['embedding']:.3g} / {c['dense']:.3g} (NE {c['ne']:.4f}, {c['paired_diff']:+.4f})"
                                  for c in rule["left_out_near_diverged"]) + "."]
        if rng["embedding"]:
            lines += ["", f"Plateau LR range (half a grid step beyond its outer cells): embedding {rng['embedding'][0]:.3g} to "
                          f"{rng['embedding'][1]:.3g}, dense {rng['dense'][0]:.3g} to {rng['dense'][1]:.3g}."]
        lines += [""]
    misset = [n for n, s in result["starts"].items() if s["misset"]]
    lines += [f"**Misset starts** (plain runs worse than the best cell by at least 3 pooled paired std, "
              f"{'-' if sigma is None else f'{3 * sigma:.4f}'} NE): "
              + (", ".join(misset) if misset else "none") + ". "
              + "Not misset: " + (", ".join(n for n in result["starts"] if n not in misset) or "none")
              + " (their plain runs are within 3 paired std of the best cell: no gap to close).", "",
              f"Columns: the start's LRs (embedding / dense, dense the three dense groups' shared LR; the starts are "
              f"factors of embedding {result['start_anchor'][0]:.4g}, dense {result['start_anchor'][1]:.4g}); NE: mean ± std "
              "over the completed seeds; paired diff: plain - best cell for plain, contender - plain on the same seed for "
              "HDET, mean and 95% t-interval, a diverged run counting as NE 1 (the base-rate predictor's); gap closed "
              "(misset starts only): mean(plain - contender) / mean(plain - best) over the same seeds, diverged = NE 1; "
              "LR area: each run's LR over the pass relative to the preset's plain schedule (geometric mean over every "
              "logged step), in max-LR units, geometric mean over the completed seeds (dense: the three dense groups' "
              "geometric mean); in plateau: completed seeds whose LR area lies in the plateau's LR range, embedding / dense.",
              *(f"{label}: `{' '.join(result['forms'][v])}`." for v, label in
                (("hdet", "HDET anneal-then-probe with the effect controller"),
                 ("hdet_previous", "HDET, previous defaults (probe signal, regression score)"), ("hdet_paper", "Paper form"),
                 ("hdet_credit", "HDET discounted credit with the effect controller"))
                if result.get("forms", {}).get(v)),
              "Prodigy (dense): the start's dense LR is Prodigy's initial estimate d0, the dense groups' LR multiplier "
              "1 under the same schedule, its LR area that of lr x d; Schedule-Free AdamW (dense): the start's dense LR, "
              "the schedule's warm-up then constant, its LR area not reported (a constant LR against a decaying "
              "schedule); both plain runs, the embedding group at the start's LR with its fused rowwise Adagrad.",
              "", "| start | LRs | misset | contender | NE | diverged | paired diff [95% CI] | gap closed | "
                  "LR area emb / dense | in plateau emb / dense |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["starts"].items():
        first = True
        for v, c in s["variants"].items():
            a, ip = c["lr_area_geomean"], c["lr_area_in_plateau"]
            head = (f"| {name} | {s['lr']['embedding']:.3g} / {s['lr']['dense']:.3g} | "
                    f"{'yes' if s['misset'] else 'no'} ({_f(s['plain_minus_best_in_std'], 1)} std) |") if first else "| | | |"
            first = False
            ne = "-" if c["ne"] is None else f"{c['ne']:.4f}" + (f" ± {c['ne_std']:.4f}" if c["ne_std"] is not None else "")
            lines.append(f"{head} {LABELS[v]} | {ne} | {c['diverged']}/{c['seeds']} | {_ci(c['paired_diff'])} | "
                         f"{_f(c['gap_closed'], 2)} | {_lr(a['embedding'])} / {_lr(a['dense'])} | "
                         f"{'-' if ip['embedding'] is None else ip['embedding']} / {'-' if ip['dense'] is None else ip['dense']}"
                         f" of {c['completed']} |")
    lines += _orderings_table(result)
    w = result.get("wall_time") or {}
    if w.get("grid25_over_one_hdet_run"):
        lines += ["", f"Wall time: a plain grid run took {w['grid_run_mean_seconds']:.0f} s on average, one HDET run "
                      f"{w['hdet_run_mean_seconds']:.0f} s (mean of {w['hdet_runs']} completed), so a 25-run grid costs "
                      f"{w['grid25_over_one_hdet_run']:.1f}x one HDET run (2 cores, other work beside some runs)."]
        if w.get("hdet_run_over_plain_run"):
            lines[-1] += (f" Like for like, the completed plain runs of the starts took {w['start_plain_run_mean_seconds']:.0f} s "
                          f"(mean of {w['start_plain_runs']}): one HDET run costs {w['hdet_run_over_plain_run']:.2f} plain "
                          f"runs, so it replaces a 25-run grid at {25 / w['hdet_run_over_plain_run']:.1f}x less wall time.")
    rr = result.get("rollback_reruns")
    if rr:
        fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        lines += ["", f"**Rollback reruns** (`python -m studies.paired_runs --set recovery_rollback`, "
                      f"[recovery_rollback.md](recovery_rollback.md)): the two dense-10x-high starts, plain and HDET, "
                      f"with the trainer's rollback on. {rr['completed']} of {rr['runs']} runs completed so far "
                      f"({rr['planned']} planned; before rollback 2 of 12 did). A run that completes can still end "
                      "at the base rate (NE near 1): the NE per seed says.", "",
                  "| start / variant | completed | NE per seed | rollbacks per seed |", "|---|---|---|---|"]
        for config, c in rr["configs"].items():
            lines.append(f"| {config} | {c['completed']} / {c['runs']} | "
                         + ", ".join(f"{fmt(c['ne_per_seed'].get(sd))}" if st == "completed" else st
                                     for sd, st in c["statuses"].items())
                         + " | " + ", ".join(str(n) for n in c["rollbacks_per_seed"].values()) + " |")
    lines += [""] + _grid_table(result) + ["", "![each group's base over the pass](lr_recovery.png)", ""]
    return "\n".join(lines) + "\n"


def _orderings_table(result: Dict[str, Any]) -> List[str]:
    rows = [(name, v, o) for name, s in result["starts"].items() for v, o in (s.get("orderings") or {}).items() if o]
    if not rows:
        return []
    lines = ["", "### Decay orderings per group", "",
             "The controlled max LR over the start's LR at 25 / 50 / 75 / 100% of the pass (geometric mean over the "
             "completed seeds; dense: the three dense groups' geometric mean); above 1: the controller raised the "
             "group. Same side: runs whose embedding group ended on the same side of its start as the dense groups; "
             "stable: every seed ended on the same side, embedding / dense. Whether following the ordering beats the "
             "static schedule is the contender's paired difference above.", "",
             "| start | contender | embedding | dense | same side | stable emb / dense |", "|---|---|---|---|---|---|"]
    for name, v, o in rows:
        fmt = lambda xs: " / ".join(f"{x:.2f}" for x in xs)
        lines.append(f"| {name} | {LABELS[v]} | {fmt(o['ratio_geomean']['embedding'])} | {fmt(o['ratio_geomean']['dense'])} | "
                     f"{sum(o['same_direction_as_dense'])} of {o['seeds']} | "
                     f"{'yes' if o['stable']['embedding'] else 'no'} / {'yes' if o['stable']['dense'] else 'no'} |")
    return lines


def _grid_table(result: Dict[str, Any]) -> List[str]:
    points = result["grid_points"]
    axis = lambda key: [grid_lr(GRID_CENTRE[key], points, k) for k in range(
        min(grid_index(g[key], GRID_CENTRE[key], points) for g in result["grid"]),
        max(grid_index(g[key], GRID_CENTRE[key], points) for g in result["grid"]) + 1)] if result["grid"] else []
    emb, dense = axis("embedding"), axis("dense")
    by = {(round(g["embedding"], 12), round(g["dense"], 12)): g for g in result["grid"]}
    plateau = {(round(c["embedding"], 12), round(c["dense"], 12)) for c in result.get("plateau") or []}
    best = result.get("best_cell")
    best = best and (round(best["embedding"], 12), round(best["dense"], 12))

    def cell(e: float, d: float) -> str:
        k = (round(e, 12), round(d, 12))
        g = by.get(k)
        if g is None:
            return "-"  # not run: only the best cell's neighbourhood grows
        text = "diverged" if g["status"] == "diverged" else _f(g["ne"])
        if len(g["seeds"]) > 1:
            text += f" ({len(g['seeds'])} seeds)"
        return f"**{text}** (best)" if k == best else f"**{text}**" if k in plateau else text

    lines = ["## The grid (mean held-out NE over the tasks and seeds, plain runs; bold: the plateau)", "",
             "| embedding \\ dense | " + " | ".join(f"{d:.3g}" for d in dense) + " |", "|---|" + "---|" * len(dense)]
    for e in emb:
        lines.append(f"| {e:.3g} | " + " | ".join(cell(e, d) for d in dense) + " |")
    return lines


def plot(result: Dict[str, Any], records: Dict[str, Dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = result["best_cell"]
    rng = result["plateau_rule"]["lr_range"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes, ("embedding", "dense")):
        for colour, (name, s) in zip(colours, result["starts"].items()):
            # Every completed HDET run of the start, one line per seed; a diverged run has no base to end on.
            # the candidate's runs where it has any, else the previous defaults'
            plotted = "hdet" if any(r["bases"] for r in s["runs"]["hdet"]) else "hdet_previous"
            done = [r for r in s["runs"][plotted] if r["bases"]]
            for k, run in enumerate(done):
                trajectory = record_trajectory(records[run["run"]])
                # dense: the geometric mean of the dense groups' bases, as in the table and the JSON
                values = [_geomean([v[g] for g in REPORTED[key]]) for _, v in trajectory]
                label = f"{name} ({len(done)} of {len(s['runs']['hdet'])} seeds completed)" if k == 0 else None
                ax.plot([step for step, _ in trajectory], values, color=colour, linewidth=1.2, alpha=0.8, label=label)
        ax.axhline(b[key], color="k", linestyle="--", label="best cell")
        if rng.get(key):
            ax.axhspan(rng[key][0], rng[key][1], color="0.85", alpha=0.5, label="plateau's LR range")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{key}: controlled base in max-LR units" +
                     (" (geometric mean of the dense groups)" if key == "dense" else ""), fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.lr_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="docs/lr_recovery_f2",
                    help="study directory: its results.jsonl (one line per finished run, committed, so a later "
                         "session resumes where an earlier one stopped; docs/lr_recovery holds the first study, on "
                         "the bench data's first format, with its own report)")
    ap.add_argument("--work", default=None,
                    help="where the run directories go (runs/<start>/<variant>/seed<k>; default: --out, or "
                         "outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--grid-points", type=int, default=5, help="LRs per grid axis (default 5; at least 2)")
    ap.add_argument("--max-extensions", type=int, default=8,
                    help="how many rounds of the growth rule may run (grow beyond the edge that holds the best "
                         "cell, seeds on the plateau; default 8)")
    ap.add_argument("--starts", nargs="+", default=list(STARTS), choices=list(STARTS), help="a subset of the starts")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="train only these variants of the starts (the others' finished runs are still reported)")
    ap.add_argument("--docs", default="docs", help="where lr_recovery.{md,json,png} go (default docs)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the reports from the results file alone (marked partial until "
                         "every run has its line; the growth rule's next runs are listed, not trained)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. data=tiny trainer.nproc=2)")
    args = ap.parse_args(argv)
    try:
        if args.grid_points < 2:
            raise StudyMismatch(f"--grid-points {args.grid_points}: at least 2")
        files = StudyFiles.open(args.out, args.work)
        if not args.report_only:
            os.makedirs(files.out, exist_ok=True)
        result = study(files, args.seeds, args.overrides, args.grid_points, args.starts, args.report_only,
                       args.max_extensions, args.variants)
    except (StudyMismatch, SR.ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["command"] = "python -m studies.lr_recovery " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
    docs = os.path.abspath(args.docs)
    reruns = rollback_reruns(os.path.join(docs, "recovery_rollback", SR.RESULTS))
    if reruns:
        result["rollback_reruns"] = reruns
    write_reports(docs, "lr_recovery", result, render_markdown(result))
    if result["best_cell"] is not None:
        plot(result, files.results, os.path.join(docs, "lr_recovery.png"))
    print(f"wrote lr_recovery.md/.json{'/.png' if result['best_cell'] is not None else ''} into {docs}"
          + (f" (partial: {result['partial']})" if result.get("partial") else ""), flush=True)
    crashed = [f"{n} {r['seed']}" for n, s in result["starts"].items() for v in s["runs"].values() for r in v
               if r["status"] == "crashed"]
    return 1 if crashed or (result.get("partial") and not args.report_only and result["best_cell"] is None) else 0


if __name__ == "__main__":
    sys.exit(main())
