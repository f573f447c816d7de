"""The travel-rule's targets on a setting (docs/results/hdet_history.md, ``travel-rule`` step 3, and
``range-rule-revised``), per range-test rule the setting runs, from the recovery study's result: what the setting's
report prints under "The travel-rule's targets" and what the README's row group quotes.

- (a) from every misset start >= 75% of the gap closed, the paired 95% interval below 0, 0 failed runs (issue 46's
  misset target, :func:`studies.lr_recovery_targets.range_test_targets`, the same figures);
- (b) at the setting's best cell, the rule - plain + rollback <= +0.001 NE (paired mean over the seeds);
- (c) the committed rates within x3.2 of the setting's best cell (both axes: the embedding, the dense groups'
  geometric mean) in at least 2 of 3 seeds at every start; each commit is also placed against the plateau (on it:
  a plateau cell within half a lattice step, x10^0.25, on both axes: :func:`studies.range_check.plateau_distance`);
- (d) cost: at most 1.15x plain + rollback's wall time, measured side by side on the setting (its
  ``contender_cost.json``).

Each is met (True), missed (False) or pending (None: a run or measurement it reads is not in).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from studies.lr_recovery_contenders import LABELS, RANGE_TEST_VARIANTS
from studies.lr_recovery_targets import COST_LIMIT, range_test_targets
from studies.range_tests import HALF_STEP_DECADES, committed_rates, plateau_distance

BAND_DECADES = 0.5  # x3.2 either way
BEST_LIMIT = 0.001


def _within(rates: Mapping[str, float], best: Mapping[str, float]) -> Dict[str, float]:
    return {a: rates[a] / best[a] for a in ("embedding", "dense")}


def commits(result: Mapping[str, Any], variant: str) -> Dict[str, List[Dict[str, Any]]]:
    """Per start, each completed seed's committed rates as factors of the best cell, within x3.2 or not, and the
    distance in decades to the nearest plateau cell (on the plateau or not)."""
    best, plateau = result["best_cell"], result.get("plateau") or []
    out: Dict[str, List[Dict[str, Any]]] = {}
    for start, s in result["starts"].items():
        rows = []
        for r in s["runs"].get(variant, []):
            if r.get("outcome") is None or not r.get("range_test"):
                continue
            rates = committed_rates(r["range_test"])
            x = _within(rates, best)
            distance = plateau_distance(rates, plateau) if plateau else None
            rows.append({"seed": r["seed"], "factor": x,
                         "within": all(abs(math.log10(v)) <= BAND_DECADES + 1e-9 for v in x.values()),
                         "plateau_distance_decades": distance,
                         "on_plateau": None if distance is None else distance <= HALF_STEP_DECADES + 1e-9})
        out[start] = rows
    return out


def _met(marks: Sequence[Optional[bool]]) -> Optional[bool]:
    if any(m is False for m in marks):
        return False
    return True if marks and all(m is True for m in marks) else None


def travel_targets(result: Mapping[str, Any], seeds: int = 3) -> Dict[str, Any]:
    """Per range-test rule with a planned run on the setting: (a)-(d) above, each with its figures."""
    out: Dict[str, Any] = {}
    results = result["starts"]
    for v in RANGE_TEST_VARIANTS:
        if not any(r.get("planned") for s in results.values() for r in s["runs"].get(v, [])):
            continue
        issue46 = range_test_targets(results, result.get("contender_cost"), v=v)
        d = issue46["best"]["diff"]  # its "met" is None until every seed of both is in
        per_start = commits(result, v)
        c_starts = {start: {"within": sum(r["within"] for r in rows), "runs": len(rows),
                            "on_plateau": sum(bool(r["on_plateau"]) for r in rows),
                            "met": None if len(rows) < seeds else 3 * sum(r["within"] for r in rows) >= 2 * len(rows)}
                    for start, rows in per_start.items()}
        ratio = issue46["cost"]["wall_ratio"]
        out[v] = {"label": LABELS[v],
                  "a": {"starts": issue46["misset"]["starts"], "met": issue46["misset"]["met"]},
                  "b": {"diff": d, "met": None if issue46["best"]["met"] is None or not d else d["mean"] <= BEST_LIMIT},
                  "c": {"starts": c_starts, "commits": per_start,
                        "met": _met([c["met"] for c in c_starts.values()]) if c_starts else None},
                  "d": {"wall_ratio": ratio, "limit": COST_LIMIT,
                        "steps_ratio_max": issue46["cost"]["steps_ratio_max"],
                        "met": None if ratio is None else ratio <= COST_LIMIT}}
    return out


def _mark(m: Optional[bool]) -> str:
    return "pending" if m is None else "met" if m else "missed"


def render(targets: Mapping[str, Any]) -> List[str]:
    """The report's section: per rule, (a)-(d) met or missed, and per start its commits against the best cell and
    the plateau."""
    if not targets:
        return []
    lines = ["", "### The travel-rule's targets", "",
             "(a) from every misset start >= 75% of the gap closed, the paired 95% interval below 0, 0 failed; (b) at "
             f"the best cell within +{BEST_LIMIT} NE of plain + rollback; (c) the committed rates within x3.2 of the "
             "best cell (both axes) in 2 of 3 seeds at every start; (d) at most "
             f"{COST_LIMIT}x plain + rollback's wall time side by side (docs/results/hdet_history.md, travel-rule). "
             "Commits: embedding x / dense x (the dense groups' geometric mean) of the best cell per seed; P: on the "
             "plateau (a plateau cell within x10^0.25 on both axes).", ""]
    for v, t in targets.items():
        d = t["b"]["diff"]
        best = "-" if not d else f"{d['mean']:+.4f}"
        lines += [f"**{t['label']}**: (a) **{_mark(t['a']['met'])}**; (b) **{_mark(t['b']['met'])}** "
                  f"({best}); (c) **{_mark(t['c']['met'])}**; "
                  f"(d) **{_mark(t['d']['met'])}** (wall ratio "
                  f"{'-' if t['d']['wall_ratio'] is None else format(t['d']['wall_ratio'], '.2f')}, steps ratio up to "
                  f"{'-' if t['d']['steps_ratio_max'] is None else format(t['d']['steps_ratio_max'], '.2f')}).", "",
                  "| start | (a) gap closed [95% CI], failed | (c) within x3.2 | on the plateau | commits |",
                  "|---|---|---|---|---|"]
        for start, c in t["c"]["starts"].items():
            a = t["a"]["starts"].get(start)
            misset = "-" if a is None else (
                f"{_mark(a['met'])}: {'-' if a['gap_fraction'] is None else format(a['gap_fraction'] * 100, '.0f') + '%'}"
                f" {'-' if not a['ci95'] else '[{:+.4f}, {:+.4f}]'.format(*a['ci95'])}, {a['failed']} failed")
            cm = "; ".join(f"s{r['seed']} x{r['factor']['embedding']:.2g} / x{r['factor']['dense']:.2g}"
                           f"{' P' if r['on_plateau'] else ''}" for r in t["c"]["commits"][start])
            lines.append(f"| {start} | {misset} | {_mark(c['met'])} ({c['within']} of {c['runs']}) | "
                         f"{c['on_plateau']} of {c['runs']} | {cm or '-'} |")
        lines.append("")
    return lines
