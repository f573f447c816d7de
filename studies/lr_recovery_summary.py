"""A start of the recovery study summarized (:mod:`studies.lr_recovery`): each contender's runs as the report
reads them (:func:`run_entry`), its failures, paired differences against plain + rollback, gap closed, LR areas
and cost (:func:`summarize_start`), the controller's decay orderings, and the wall time over every start.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import outcome, paired_over_seeds
from studies.lr_recovery_contenders import HDET_VARIANTS, NO_LR_AREA, REPORTED, VARIANTS
from studies.lr_recovery_grid import Cell
from studies.provenance import REPO
from studies.record import mean_ne
from studies.results import study_overrides
from studies.stats import paired
from studies.trajectory import final_bases, geomean, record_trajectory

# The side-by-side cost benchmark's results (benchmarks/contender_cost.py): each contender's wall ratio.
BENCHMARK_FILE = os.path.join(REPO, "benchmarks", "results.json")
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


def effective_lrs(record: Dict[str, Any]) -> Optional[Dict[str, float]]:
    """A run's LR area (:func:`studies.lr_area.lr_area`) in max-LR units: the preset's max LR
    times the area, per reported group (dense: the three dense groups' geometric mean)."""
    area, preset = record.get("lr_area"), record.get("preset_lr")
    if not area or not preset or any(g not in area for g in ("embedding", *DENSE_GROUPS)):
        return None
    return {key: geomean([area[g] * preset[g] for g in groups]) for key, groups in REPORTED.items()}


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
    return {"ratio": ratio, "source": f"{os.path.relpath(path, REPO)} contender_cost ({where}{repeats})"}


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
    return [o for o in study_overrides(record) if o in ("hdet=enabled", "hdet=controller") or o.startswith("hdet.")]
