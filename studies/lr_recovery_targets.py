"""The recovery study's targets (:mod:`studies.lr_recovery`): the controller issue's per HDET variant
(:func:`targets`, docs/results/hdet_history.md) and issue 46's for the range test on the replicas (:func:`range_test_targets`),
each met / missed / pending, read from the study's per-start results
(:func:`studies.lr_recovery_summary.summarize_start`).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Optional, Sequence

from studies.stats import paired

# The controller issue's targets (docs/results/hdet_history.md): the starts they read and the anchors a variant must beat there
# (the anchor's name in the targets -> the contender that ran it: their LR finder is the narrow one).
TARGET_STARTS = ("all_low", "all_high", "emb_low_dense_high", "emb_low")
ANCHORS = {"prodigy": "prodigy", "schedulefree": "schedulefree", "lr_finder": "lr_finder_narrow"}


def _ne_by_seed(s: Dict[str, Any], v: str) -> Dict[int, float]:
    return {r["seed"]: r["ne"] for r in s["runs"][v] if r["outcome"] == "completed"}


def _every_seed_in(s: Dict[str, Any], *vs: str) -> bool:
    """Every planned seed of each contender in ``vs`` has a result at start ``s``."""
    return all(s["variants"][v]["seeds"] == len(s["runs"][v]) for v in vs)


def targets(results: Dict[str, Any], variants: Sequence[str]) -> Dict[str, Any]:
    """Per HDET variant, the controller issue's targets, each met or not (None: its runs are not all in):
    - at each of :data:`TARGET_STARTS`: >= 75% of the gap to the best cell closed (``gap_fraction``, read at
      emb_low too, which the plateau rule does not call misset) with the paired 95% interval of contender -
      plain + rollback below 0, LR area in the plateau (both axes) in >= 2 of 3 seeds, 0 failed;
    - at ``best``: contender - plain <= +0.001 (mean) with an interval that includes 0, both axes' LR area
      within a factor 2 of the start in >= 2 of 3 seeds;
    - better than each of :data:`ANCHORS` at each target start: mean over the seeds both completed of
      contender - anchor < 0.
    The wall-time target is a benchmark's (side by side in one run), not this study's: its runs' seconds
    come from different sessions and loads. A variant with neither a planned nor a recorded run at any start (a
    setting plans its own contenders) has none."""
    ne_by_seed, every_seed_in = _ne_by_seed, _every_seed_in
    out: Dict[str, Any] = {}
    for v in variants:
        if not any(r.get("planned") or r.get("outcome") for s in results.values() for r in s["runs"][v]):
            continue
        t: Dict[str, Any] = {"starts": {}, "anchors": {}}
        for start in (s for s in TARGET_STARTS if s in results):
            e = results[start]["variants"][v]
            d, frac = e["paired_diff"], e["gap_fraction"]
            complete = every_seed_in(results[start], v)
            t["starts"][start] = {
                "gap_fraction": frac, "ci95": d["ci95"] if d else None, "in_plateau": e["lr_area_in_plateau_both"],
                "failed": e["failed"],
                "met": None if not complete else bool(
                    e["failed"] == 0 and frac is not None and frac >= 0.75 and d and d["ci95"] and d["ci95"][1] < 0
                    and (e["lr_area_in_plateau_both"] or 0) >= 2)}
            mine = ne_by_seed(results[start], v)
            anchors = {}
            for a, contender in ANCHORS.items():
                theirs = ne_by_seed(results[start], contender)
                seeds = sorted(set(mine) & set(theirs))
                anchors[a] = statistics.fmean(mine[s] - theirs[s] for s in seeds) if seeds else None
            t["anchors"][start] = {"diff": anchors, "met": None if not complete or None in anchors.values()
                                   else all(x < 0 for x in anchors.values())}
        b = results["best"]["variants"][v] if "best" in results else None
        d = b["paired_diff"] if b else None
        judged = bool(b) and every_seed_in(results["best"], v) and bool(d) and bool(d["ci95"])
        t["best"] = {"diff": d, "within_2x": b["lr_area_within_2x_of_start"] if b else None,
                     "met": None if not judged else bool(
                         d["mean"] <= 0.001 and d["ci95"][0] <= 0 <= d["ci95"][1] and b["lr_area_within_2x_of_start"] >= 2)}
        out[v] = t
    return out


# Issue 46's targets for the range test on the replicas (:func:`range_test_targets`).
RANGE_TEST = "hdet_range_test"
MISSET_STARTS = ("all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low", "emb_low_30", "all_high_3")
COST_LIMIT, COST_STRETCH = 1.15, 1.05


def _all_met(marks: Sequence[Optional[bool]]) -> Optional[bool]:
    """Every mark met: True; one missed: False; else (one pending, or none at all) None."""
    if marks and all(m is True for m in marks):
        return True
    return False if any(m is False for m in marks) else None


def range_test_targets(results: Dict[str, Any], wall: Optional[Dict[str, Any]] = None, v: str = RANGE_TEST,
                       finder: str = "lr_finder") -> Dict[str, Any]:
    """Issue 46's targets for the range test on the replicas, each met (True), missed (False) or pending (None:
    a run it reads is not in):
    (a) ``misset``: at each of :data:`MISSET_STARTS`, and each ``--start`` start its plain runs call misset
        (pending while they have none): >= 75% of the gap closed (``gap_fraction``), the paired 95% interval of
        contender - plain + rollback below 0, 0 failed runs;
    (b) ``best``: contender - plain + rollback <= +0.001 (mean), its interval including 0;
    (c) ``cost``: the steps ratio (``cost.steps_ratio``) <= 1.15 at every start (stretch: <= 1.05), and the
        side-by-side wall ratio (benchmarks/results.json) <= 1.15 where measured;
    (d) ``vs_lr_finder``: at every start, NE no worse than the widened LR finder's (no more failed seeds, and the
        paired 95% interval of contender - lr_finder over the seeds both completed includes 0 or lies below it)
        at a lower cost (steps ratio; the wall ratio too where both are measured)."""
    out: Dict[str, Any] = {}
    misset = {}
    for start, s in results.items():
        if start not in MISSET_STARTS and not (s.get("from_command_line") and s["misset"] is not False):
            continue
        e = s["variants"][v]
        d, frac = e["paired_diff"], e["gap_fraction"]
        judged = _every_seed_in(s, v, "plain_rollback") and s["misset"] is not None
        misset[start] = {"gap_fraction": frac, "ci95": d["ci95"] if d else None, "failed": e["failed"],
                         "met": None if not judged else bool(e["failed"] == 0 and frac is not None and frac >= 0.75
                                                             and d and d["ci95"] and d["ci95"][1] < 0)}
    out["misset"] = {"starts": misset, "met": _all_met([m["met"] for m in misset.values()])}
    b = results.get("best")
    e = b["variants"][v] if b else None
    d = e["paired_diff"] if e else None
    out["best"] = {"diff": d, "failed": e["failed"] if e else None,
                   "met": None if not b or not _every_seed_in(b, v, "plain_rollback") else bool(
                       d and d["ci95"] and d["mean"] <= 0.001 and d["ci95"][0] <= 0 <= d["ci95"][1])}
    ratios = {start: s["variants"][v]["cost"]["steps_ratio"] for start, s in results.items()}
    known = [x for x in ratios.values() if x is not None]
    steps_max = max(known) if known else None
    wall_ratio = ((wall or {}).get("ratio") or {}).get(v)
    judged = bool(results) and all(_every_seed_in(s, v, "plain_rollback") for s in results.values()) and bool(known)
    out["cost"] = {"steps_ratio": ratios, "steps_ratio_max": steps_max, "wall_ratio": wall_ratio,
                   "wall_source": wall["source"] if wall_ratio is not None else None,
                   "limit": COST_LIMIT, "stretch": COST_STRETCH,
                   "met": None if not judged else (steps_max <= COST_LIMIT
                                                   and (wall_ratio is None or wall_ratio <= COST_LIMIT)),
                   "stretch_met": None if not judged else steps_max <= COST_STRETCH}
    vs = {}
    for start, s in results.items():
        mine, theirs = _ne_by_seed(s, v), _ne_by_seed(s, finder)
        d = paired([mine[k] - theirs[k] for k in sorted(set(mine) & set(theirs))])
        failed = {c: s["variants"][c]["failed"] for c in (v, finder)}
        cost = {c: s["variants"][c]["cost"] for c in (v, finder)}
        steps, walls = [cost[c]["steps_ratio"] for c in (v, finder)], [cost[c]["wall_ratio"] for c in (v, finder)]
        no_worse = cheaper = None  # pending until every seed of both is in
        if _every_seed_in(s, v, finder):
            no_worse = failed[v] <= failed[finder] and bool(d and d["ci95"] and d["ci95"][0] <= 0)
            cheaper = None not in steps and steps[0] < steps[1] and (None in walls or walls[0] < walls[1])
        vs[start] = {"diff": d, "failed": failed, "steps_ratio": dict(zip((v, finder), steps)),
                     "wall_ratio": dict(zip((v, finder), walls)), "no_worse": no_worse, "cheaper": cheaper,
                     "met": None if no_worse is None else no_worse and cheaper}
    out["vs_lr_finder"] = {"starts": vs, "met": _all_met([x["met"] for x in vs.values()])}
    return out

