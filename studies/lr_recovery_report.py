"""The recovery study's targets and report (:mod:`studies.lr_recovery`'s; imported by it alone).

- :func:`targets`: the controller issue's targets per HDET variant (docs/hdet.md), and :func:`range_test_targets`:
  issue 46's for the range test on the replicas; each met / missed / pending, read from the study's per-start
  results (:func:`studies.lr_recovery.summarize_start`).
- :func:`render_markdown` and :func:`plot`: ``docs/lr_recovery.md`` and ``lr_recovery.png`` from the study's
  result. They take the study module itself (``S``: its labels, forms and lattice) from their caller: this
  module imports nothing of :mod:`studies.lr_recovery`, which ``python -m studies.lr_recovery`` runs as
  ``__main__`` (an import here would load a second copy of it).
"""

from __future__ import annotations

import statistics
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

from studies.contract import COLLAPSED_NE
from studies.reporting import fmt as _f
from studies.stats import paired
from studies.trajectory import geomean, record_trajectory

# ----------------------------------------------------------------------------------------------
# Targets.

# The controller issue's targets (docs/hdet.md): the starts they read and the anchors a variant must beat there
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
    come from different sessions and loads."""
    ne_by_seed, every_seed_in = _ne_by_seed, _every_seed_in
    out: Dict[str, Any] = {}
    for v in variants:
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


# ----------------------------------------------------------------------------------------------
# The report.


def _ci(p: Optional[Dict[str, Any]], digits: int = 4) -> str:
    if p is None:
        return "-"
    text = f"{p['mean']:+.{digits}f}"
    return text + (f" [{p['ci95'][0]:+.{digits}f}, {p['ci95'][1]:+.{digits}f}]" if p.get("ci95") else " (1 seed)")


def _lr(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_markdown(result: Dict[str, Any], S: ModuleType) -> str:
    """The markdown report of a study's result (``S``: the :mod:`studies.lr_recovery` module)."""
    lines = ["# Learning-rate recovery on the benchmark data set, under the fairness contract", ""]
    if result.get("partial"):
        pending: Dict[str, int] = {}
        for st in result["starts"].values():
            for v, runs in st["runs"].items():
                pending[v] = pending.get(v, 0) + sum(r["planned"] and r["outcome"] is None for r in runs)
        lines += [f"**PARTIAL RESULT: {result['partial']}.** Every figure below comes from a finished run; "
                  "rerun `python -m studies.lr_recovery` to continue the study (finished runs are skipped). "
                  "Planned runs not in yet: " + (", ".join(f"{S.LABELS[v]} {n}" for v, n in pending.items() if n) or
                                                  "none") + ".", ""]
    a = result["anchor"]
    lines += [f"Produced by `{result['command']}` on {result['machine']}. NE is the held-out day's normalized "
              "entropy, mean over the three tasks. Every run trains the same rows (4,096 rows of each training "
              "day reserved by every contender: 960 steps), with rollback on (3 rollbacks, each halving every "
              f"LR); a run that diverged or ended at NE >= {COLLAPSED_NE} on a task (the base-rate predictor) "
              "**failed** and is never paired ([studies.md](studies.md#the-fairness-contract)). Every run names "
              "the commit it trained from (clean trees only).", "",
              f"**Anchor**: embedding {a['embedding']:.4g}, dense {a['dense']:.4g} (the earlier study's best cell, "
              "read from this file); the starts are factors of it: "
              + "; ".join(f"{name} (x{st['factors'][0]:.3g} / x{st['factors'][1]:.3g}: {st['label']})"
                          for name, st in result["starts"].items())
              + ". A start passed with `--start NAME=EMB_FACTOR,DENSE_FACTOR` is listed while the results file has a "
                "run of it at its own LRs (schedulefree, the range test, or plain off the lattice)."]
    b = result.get("best_cell")
    rule = result.get("plateau_rule")
    if b:
        lines += ["", f"**Best cell under the contract**: embedding {b['embedding']:.4g}, dense {b['dense']:.4g}, "
                      f"mean NE {b['ne']:.4f} over seeds {', '.join(map(str, b['seeds']))}."]
    if rule and rule["paired_std_pooled"] is not None:
        rng = rule["lr_range"]
        lines += ["", f"**Plateau**: the cells whose mean paired difference from the best cell is within one pooled "
                      f"paired std, {rule['paired_std_pooled']:.4f} (pooled over {len(rule['pooled_from'])} cells that "
                      "share 2+ seeds with the best), and not within half a decade of a failed cell: "
                  + "; ".join(f"{c['embedding']:.3g} / {c['dense']:.3g} ({c['ne']:.4f}, {c['paired_diff']:+.4f})"
                              for c in result["plateau"])
                  + (f". LR range: embedding {rng['embedding'][0]:.3g} to {rng['embedding'][1]:.3g}, dense "
                     f"{rng['dense'][0]:.3g} to {rng['dense'][1]:.3g}." if rng["embedding"] else ".")]
    lines += ["", "Columns: NE, mean ± std over the completed seeds; failed: diverged or collapsed (NE >= "
              f"{COLLAPSED_NE}) seeds, never paired; paired diff: plain - best cell for plain + rollback, contender "
              "- plain + rollback on the seeds where both completed (n), mean and 95% t-interval; gap closed (misset "
              "starts): mean(plain - contender) / mean(plain - best) on those seeds; LR area: the pass's LR relative "
              "to the preset's schedule (geometric mean over logged steps) in max-LR units, geometric mean over the "
              "completed seeds (dense: the dense groups' geometric mean); in plateau: completed seeds whose LR area "
              "lies in the plateau's range; rollbacks per seed; cost x plain: the contender's mean optimizer steps "
              "(sweeps included) over plain + rollback's on the seeds where both completed / its wall seconds over "
              "plain + rollback's measured side by side (benchmarks/results.json `contender_cost`; - where not "
              "measured); cost s: mean wall seconds of a completed run (sweeps included; runs from different "
              "sessions and loads).",
              *(f"{S.LABELS[v]}: `{' '.join(result['forms'][v])}`." for v in S.FORM_VARIANTS if result["forms"].get(v)),
              "Prodigy: d0 1e-6, the dense LR multiplier 1 under the plain schedule (the start's dense LR does not "
              "enter); Schedule-Free AdamW: the start's dense LR, constant, its own warm-up (as long as the one-cycle's "
              "rise), the embedding on the plain schedule; LR finder: two 100-step range tests (x0.001 to x10000 of "
              "the start, one per axis, one after the other), the multiplier at the smoothed minimum / 10, then a "
              "plain run; the retired narrow LR finder swept x0.01 to x100; HDET range test on the replicas: the "
              "same sweep, both axes at once on different replicas, in the run's own job before the pass, which then "
              "trains plain from step 0 at the committed LRs.", "",
              "| start | LRs | misset | contender | NE | failed | paired diff [95% CI] (n) | "
              "cost x plain steps / wall | gap closed | LR area emb / dense | in plateau | rollbacks | cost s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["starts"].items():
        first = True
        for v, c in s["variants"].items():
            if not any(run["planned"] or run["outcome"] for run in s["runs"][v]):
                continue  # not planned at this start, nothing recorded
            lr_a, ip = c["lr_area_geomean"], c["lr_area_in_plateau"]
            head = (f"| {name} | {s['lr']['embedding']:.3g} / {s['lr']['dense']:.3g} | "
                    f"{'-' if s['misset'] is None else 'yes' if s['misset'] else 'no'} "
                    f"({_f(s['plain_minus_best_in_std'], 1)} std) |") if first else "| | | |"
            first = False
            ne = "-" if c["ne"] is None else f"{c['ne']:.4f}" + (f" ± {c['ne_std']:.4f}" if c["ne_std"] is not None else "")
            failed = f"{c['failed']}/{c['seeds']}" + (f" ({c['collapsed']} collapsed)" if c["collapsed"] else "")
            n = f" ({len(c['paired_seeds'])})" if c["paired_diff"] else ""
            cost = "-" if c["cost_seconds"] is None else f"{c['cost_seconds']:.0f}"
            ratio = f"{_ratio(c['cost']['steps_ratio'])} / {_ratio(c['cost']['wall_ratio'])}"
            lines.append(f"{head} {S.LABELS[v]} | {ne} | {failed} | {_ci(c['paired_diff'])}{n} | {ratio} | "
                         f"{_f(c['gap_closed'], 2)} | "
                         f"{_lr(lr_a['embedding'])} / {_lr(lr_a['dense'])} | "
                         f"{'-' if ip['embedding'] is None else ip['embedding']} / {'-' if ip['dense'] is None else ip['dense']}"
                         f" of {c['completed']} | {', '.join(map(str, c['rollbacks'])) or '-'} | {cost} |")
    lines += _targets_table(result, S)
    lines += _range_test_targets_table(result, S)
    lines += _orderings_table(result, S)
    w = result["wall_time"]
    if w.get("hdet_over_plain"):
        lines += ["", f"Wall time: one completed HDET run took {w['hdet_over_plain']:.2f}x one completed plain + "
                      f"rollback run (means over {w['per_variant']['hdet']['runs']} and "
                      f"{w['per_variant']['plain_rollback']['runs']} runs, 2 cores)."]
    lines += ["", "Retired (never trained again, or not at the newer starts; the rows recorded under the contract are "
                  "read and shown above, the earlier study's in [lr_recovery_f2/lr_recovery.md]"
                  "(lr_recovery_f2/lr_recovery.md)): "
              + "; ".join(f"`{k}`: {v}" for k, v in result["retired"].items()) + "."]
    lines += [""] + _grid_table(result, S) + ["", "![each group's base over the pass](lr_recovery.png)", ""]
    return "\n".join(lines) + "\n"


def _mark(m: Optional[bool]) -> str:
    return "pending" if m is None else "met" if m else "missed"


def _targets_table(result: Dict[str, Any], S: ModuleType) -> List[str]:
    """The controller issue's targets per HDET variant (:func:`targets`): met / missed / pending."""
    mark = _mark
    rows = {v: t for v, t in (result.get("targets") or {}).items() if v != RANGE_TEST}
    if not rows:
        return []
    lines = ["", "### The controller issue's targets", "",
             "Per start of the targets: gap closed (>= 75%, the interval of contender - plain + rollback below 0, LR "
             "area in the plateau in 2 of 3 seeds, 0 failed); best: contender - plain <= +0.001 with the interval "
             "including 0 and both LR areas within x2 of the start in 2 of 3 seeds; anchors: better than Prodigy, "
             "Schedule-Free and the (narrow) LR finder (paired mean) at every target start. Pending: not every run "
             "is in. "
             "(The wall-time target is measured side by side by benchmarks/, not here.)", "",
             "| variant | " + " | ".join(TARGET_STARTS) + " | best | beats the anchors |",
             "|---|" + "---|" * (len(TARGET_STARTS) + 2)]
    for v, t in rows.items():
        cells = []
        for start in TARGET_STARTS:
            c = t["starts"].get(start)
            closed = "-" if c is None or c["gap_fraction"] is None else f"{c['gap_fraction'] * 100:.0f}%"
            cells.append("-" if c is None else f"{mark(c['met'])} ({closed})")
        b = t["best"]
        best_diff = "-" if not b["diff"] else f"{b['diff']['mean']:+.4f}"
        best = f"{mark(b['met'])} ({best_diff})"
        anchors = [a["met"] for a in t["anchors"].values()]
        beats = "pending" if None in anchors or not anchors else f"{sum(anchors)} of {len(anchors)} starts"
        lines.append(f"| {S.LABELS[v]} | " + " | ".join(cells) + f" | {best} | {beats} |")
    return lines


def _range_test_targets_table(result: Dict[str, Any], S: ModuleType) -> List[str]:
    """Issue 46's targets for the range test on the replicas (:func:`range_test_targets`), per start."""
    t = (result.get("targets") or {}).get(RANGE_TEST)
    if not t:
        return []
    c = t["cost"]
    wall = ("not measured side by side" if c["wall_ratio"] is None
            else f"wall ratio {c['wall_ratio']:.2f} ({c['wall_source']})")
    lines = ["", f"### Issue 46's targets: {S.LABELS[RANGE_TEST]}", "",
             "(a) from every misset start: >= 75% of the gap closed with the paired 95% interval against plain + "
             "rollback below 0 and 0 failed runs: " + f"**{_mark(t['misset']['met'])}**; "
             "(b) at best: mean difference <= +0.001 with the interval including 0: "
             f"**{_mark(t['best']['met'])}** ({'-' if not t['best']['diff'] else _ci(t['best']['diff'])}); "
             f"(c) cost: steps ratio <= {c['limit']} at every start (stretch {c['stretch']}), wall ratio <= {c['limit']} "
             f"where measured: **{_mark(c['met'])}** (stretch: {_mark(c['stretch_met'])}; largest steps ratio "
             f"{_ratio(c['steps_ratio_max'])}; {wall}); "
             "(d) against the widened LR finder at every start: NE no worse (no more failed seeds, the paired "
             "interval of range test - finder including 0 or below it) at a lower cost: "
             f"**{_mark(t['vs_lr_finder']['met'])}**. Pending: not every run it reads is in.", "",
             "| start | (a) misset: gap closed, 95% CI, failed | (c) steps ratio | (d) range test - LR finder [95% CI], "
             "steps ratio range test / finder |", "|---|---|---|---|"]
    for name in result["starts"]:
        m = t["misset"]["starts"].get(name)
        misset = "-"
        if m is not None:
            closed = "-" if m["gap_fraction"] is None else f"{m['gap_fraction'] * 100:.0f}%"
            ci = "-" if not m["ci95"] else f"[{m['ci95'][0]:+.4f}, {m['ci95'][1]:+.4f}]"
            misset = f"{_mark(m['met'])} ({closed}, {ci}, {m['failed']} failed)"
        d = t["vs_lr_finder"]["starts"][name]
        steps = " / ".join(_ratio(x) for x in d["steps_ratio"].values())
        lines.append(f"| {name} | {misset} | {_ratio(c['steps_ratio'].get(name))} | {_mark(d['met'])} "
                     f"({_ci(d['diff'])}; {steps}) |")
    return lines


def _orderings_table(result: Dict[str, Any], S: ModuleType) -> List[str]:
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
        lines.append(f"| {name} | {S.LABELS[v]} | {fmt(o['ratio_geomean']['embedding'])} | {fmt(o['ratio_geomean']['dense'])} | "
                     f"{sum(o['same_direction_as_dense'])} of {o['seeds']} | "
                     f"{'yes' if o['stable']['embedding'] else 'no'} / {'yes' if o['stable']['dense'] else 'no'} |")
    return lines


def _grid_table(result: Dict[str, Any], S: ModuleType) -> List[str]:
    points, centre, grid_lr, grid_index = S.POINTS, S.GRID_CENTRE, S.grid_lr, S.grid_index
    axis = lambda key: [grid_lr(centre[key], points, k) for k in range(
        min(grid_index(g[key], centre[key], points) for g in result["grid"]),
        max(grid_index(g[key], centre[key], points) for g in result["grid"]) + 1)] if result["grid"] else []
    emb, dense = axis("embedding"), axis("dense")
    by = {(round(g["embedding"], 12), round(g["dense"], 12)): g for g in result["grid"]}
    plateau = {(round(c["embedding"], 12), round(c["dense"], 12)) for c in result.get("plateau") or []}
    best = result.get("best_cell")
    best = best and (round(best["embedding"], 12), round(best["dense"], 12))

    def cell(e: float, d: float) -> str:
        k = (round(e, 12), round(d, 12))
        g = by.get(k)
        if g is None:
            return "-"  # not run: only the best cell's neighbourhood and the starts' cells are trained
        text = "failed" if g["status"] == "failed" else _f(g["ne"])
        if len(g["seeds"]) > 1:
            text += f" ({len(g['seeds'])} seeds)"
        return f"**{text}** (best)" if k == best else f"**{text}**" if k in plateau else text

    lines = ["## The cells (mean held-out NE over the tasks and seeds, plain + rollback runs; bold: the plateau)", "",
             "| embedding \\ dense | " + " | ".join(f"{d:.3g}" for d in dense) + " |", "|---|" + "---|" * len(dense)]
    for e in emb:
        lines.append(f"| {e:.3g} | " + " | ".join(cell(e, d) for d in dense) + " |")
    return lines


def plot(result: Dict[str, Any], records: Dict[str, Dict[str, Any]], path: str, S: ModuleType) -> None:
    """lr_recovery.png: each group's controlled base over the pass of the default HDET form's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = result["best_cell"]
    rng = (result.get("plateau_rule") or {}).get("lr_range") or {}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes, ("embedding", "dense")):
        for colour, (name, s) in zip(colours, result["starts"].items()):
            # Every completed run of the default HDET form, one line per seed; a failed run has no base to end on.
            done = [r for r in s["runs"]["hdet"] if r["bases"]]
            for k, run in enumerate(done):
                trajectory = record_trajectory(records[run["run"]])
                # dense: the geometric mean of the dense groups' bases, as in the table and the JSON
                values = [geomean([v[g] for g in S.REPORTED[key]]) for _, v in trajectory]
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
