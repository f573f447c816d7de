"""The range test on the replicas, its kill test: where does the sweep-and-commit phase alone put the rates?

Before any full pass with the form (``hdet.range_test``), only its sweep and commit run (then one plain step:
``trainer.stop_at_step=1``) from the recovery study's best cell, its four misset starts and two more
(``emb_low_30``: the embedding 30x low; ``all_high_3``: both axes 3x high), 3 seeds each, on the recovery
study's preset, data and layout (benchmark data, 2 x 2: one replica sweeps the embedding, the other the dense
groups) under its fairness contract. Each run's committed max LRs are compared with the best cell (the
recovery study's anchor): the kill rule (issue 46) stops the form when at any start 2 or more seeds commit
outside x3.2 of the best cell on either axis.

Beside it, the same question for the LR finder as the product now runs it (``python -m recsys_hdet.lr_find``'s
default sweep, widened to x0.001-x10000 in 100 steps): its two sweeps alone, one axis after the other, from the
same starts and seeds (``finder_commit``): whether a bias of the range test's rule shows in both (the sweep's
speed, decades per step, under fastai's fixed smoothing) or in the replicas' sweeps only.

Each form of the rule has its own kill test on its own seeds (:data:`KILL_TESTS`). The first form read the
curves with fastai's per-step smoothing (0.98) on seeds 0-2 and was killed; the rule's smoothing window (1 decade
of the multiplier) was then chosen on that test's recorded curves (:func:`rule_dev`, every candidate window
re-read on the same curves, the replicas' and the finder's), and its own kill test on seeds 3-5 killed it too,
the dense axis committed about 2x above the best cell. The third form divides each axis's smoothed minimum by its
own divisor, chosen on both tests' recorded curves (seeds 0-5, :func:`divisor_dev`), and its kill test runs on
fresh seeds 6-8.

Run by ``python -m studies.lr_truth --range-commit`` (its lines go to the truth study's results file, the
tables to ``docs/results/lr_truth/lr_truth.json``: ``range_commit`` (the current form's kill test),
``range_commit_retired`` (earlier forms'), ``range_rule_dev``, ``range_divisor_dev`` and ``finder_commit``); this
module holds the runs' overrides and the tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.hdet.range_test.rule import CLASSIC_SMOOTHING, smoothing, suggest_multiplier
from recsys_hdet.constants import DENSE_GROUPS, LR_AXES
from studies.contract import CONTRACT
from studies.range_tests import (HDET_RANGE_TEST, REPLICA_DIVISORS, REPLICA_WINDOW_DECADES, SWEEP, finder_sweeps,
                                  sweep_suggestion)
from studies.starts import PRESET, STARTS, lr_overrides, recovery_anchor, start_lrs

# (embedding, dense) factors of the anchor: the best cell, the four misset starts, and the two the issue adds.
KILL_STARTS: Dict[str, Tuple[float, float]] = {
    k: STARTS[k] for k in ("best", "all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low", "emb_low_30",
                           "all_high_3")}
SWEEP_RECORD = dict(zip(("steps", "low", "high"), SWEEP))  # as the tables record it
WITHIN = 3.2  # the kill rule's band around the best cell, each axis
KILL_SEEDS = 2  # this many seeds outside the band at one start stop the form




@dataclass(frozen=True)
class KillTest:
    """One form of the rule's kill test: the rule it commits with, its seeds, its runs' name prefix."""

    rule: str
    window_decades: Optional[float]  # the loss's smoothing window; None: fastai's per-step 0.98
    seeds: Tuple[int, ...]
    prefix: str
    divisors: Optional[Mapping[str, float]] = None  # per axis; None: fastai's 10 on both


KILL_TESTS: Dict[str, KillTest] = {
    "divisors_10_20": KillTest("the smoothed minimum / 10 (embedding) and / 20 (dense), the loss smoothed over 1 "
                               "decade of the multiplier", REPLICA_WINDOW_DECADES, (6, 7, 8), "range_commit_divisors",
                               REPLICA_DIVISORS),
    "window_1_decade": KillTest("fastai's classic (smoothed minimum / 10), the loss smoothed over 1 decade of the "
                                "multiplier", REPLICA_WINDOW_DECADES, (3, 4, 5), "range_commit_window1"),
    "classic": KillTest("fastai's classic (smoothed minimum / 10), the loss smoothed per step by 0.98", None,
                        (0, 1, 2), "range_commit"),
}
CURRENT = "divisors_10_20"  # the form the product runs (recsys_hdet.hdet.range_test.sweep, hdet.range_test.divisors)
DEV_FORMS = ("classic", "window_1_decade")  # the recorded kill tests whose curves chose the divisors
DEV_DIVISORS = (5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0)  # the candidates, each axis
SEEDS = KILL_TESTS["classic"].seeds  # the finder's sweeps beside the first kill test
DEV_WINDOWS = (0.25, 0.5, 1.0, 2.0, None)  # the candidate smoothing windows re-read on the first test's curves


def run_name(start: str, seed: int, form: str = CURRENT) -> str:
    return f"{KILL_TESTS[form].prefix}/{start}/seed{seed}"


def overrides(start: str, seed: int, anchor: Tuple[float, float]) -> List[str]:
    """One sweep-and-commit run: the recovery study's preset at the start's LRs, the contract, the form, one step."""
    return [f"+experiment={PRESET}", f"seed={seed}", *CONTRACT.overrides(), *lr_overrides(*start_lrs(start, anchor)),
            *HDET_RANGE_TEST, "trainer.stop_at_step=1",
            "trainer.log_every=1", "trainer.checkpoint=false", "trainer.periodic_checkpoint.every_steps=0",
            "trainer.tensorboard=false"]


def committed(line: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The committed max LRs and the sweep's record of a results line (None if the run has no commit)."""
    rt = ((line.get("hdet") or {}).get("range_test")) if line else None
    return rt if rt and rt.get("committed") else None


def table(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None,
          form: str = CURRENT) -> Dict[str, Any]:
    """Per start and seed the committed rates as factors of the best cell, whether they lie within x3.2 on
    both axes, and the kill rule's verdict, for one form's kill test."""
    anchor = anchor or recovery_anchor()
    test = KILL_TESTS[form]
    starts: Dict[str, Any] = {}
    killed_at: List[str] = []
    for start, (fe, fd) in KILL_STARTS.items():
        rows = []
        for seed in test.seeds:
            rt = committed(results.get(run_name(start, seed, form)) or {})
            if rt is None:
                continue
            dense = math.exp(sum(math.log(rt["committed"][g]) for g in DENSE_GROUPS) / len(DENSE_GROUPS))
            factors = {"embedding": rt["committed"]["embedding"] / anchor[0], "dense": dense / anchor[1]}
            inside = all(1 / WITHIN <= f <= WITHIN for f in factors.values())
            rows.append({"seed": seed, "of_best": factors, "within": inside,
                         "multiplier": {a: rt["axes"][a]["multiplier"] for a in ("embedding", "dense")},
                         "range_edge": {a: rt["axes"][a]["range_edge"] for a in ("embedding", "dense")},
                         "seconds": rt.get("seconds")})
        outside = sum(not r["within"] for r in rows)
        if outside >= KILL_SEEDS:
            killed_at.append(start)
        starts[start] = {"factors": [fe, fd], "seeds": rows, "outside": outside,
                         "complete": len(rows) == len(test.seeds)}
    complete = all(s["complete"] for s in starts.values())
    return {"form": form, "commit_rule": test.rule, "seeds": list(test.seeds),
            "rule": f"stop when at any start {KILL_SEEDS}+ seeds commit outside x{WITHIN:g} of the best cell on either axis",
            "anchor": {"embedding": anchor[0], "dense": anchor[1]}, "sweep": SWEEP_RECORD,
            "starts": starts, "killed_at": killed_at,
            "verdict": "killed" if killed_at else ("passed" if complete else "pending")}


def render_finder(t: Mapping[str, Any]) -> List[str]:
    lines = ["", "## The LR finder's default sweeps from the same starts (sweeps only)", "",
             f"`python -m recsys_hdet.lr_find`'s suggestions ({t['sweep']['steps']} steps, x{t['sweep']['low']:g} to "
             f"x{t['sweep']['high']:g}, one axis after the other) as factors of the best cell; the kill test's band "
             f"applied for comparison (outside in 2+ seeds at: {', '.join(t['outside_2_of_3_at']) or 'none'}).", "",
             "| start | seed | embedding x best | dense x best | within x3.2 |", "|---|---|---|---|---|"]
    shown = lambda f: "-" if f is None else f"{f:.3g}"  # noqa: E731
    for start, s in t["starts"].items():
        for r in s["seeds"]:
            lines.append(f"| {start} | {r['seed']} | {shown(r['of_best']['embedding'])} | {shown(r['of_best']['dense'])} "
                         f"| {'yes' if r['within'] else 'no'} |")
    return lines


def render(t: Mapping[str, Any]) -> List[str]:
    lines = ["", f"## The range test on the replicas: sweep and commit only (the kill test, form `{t['form']}`)", "",
             f"Committed max LRs as factors of the best cell (embedding {t['anchor']['embedding']:g}, dense "
             f"{t['anchor']['dense']:g}), per seed; sweep {t['sweep']['steps']} steps from x{t['sweep']['low']:g} to "
             f"x{t['sweep']['high']:g}, seeds {', '.join(map(str, t['seeds']))}; the suggestion: {t['commit_rule']}. "
             f"Kill rule: {t['rule']}. Verdict: **{t['verdict']}**"
             + (f" (at {', '.join(t['killed_at'])})" if t["killed_at"] else "") + ".", "",
             "| start (emb, dense factor) | seed | embedding x best | dense x best | within x3.2 | edge |",
             "|---|---|---|---|---|---|"]
    for start, s in t["starts"].items():
        for r in s["seeds"]:
            edge = ", ".join(f"{a} {e}" for a, e in r["range_edge"].items() if e) or "-"
            lines.append(f"| {start} ({s['factors'][0]:.3g}, {s['factors'][1]:.3g}) | {r['seed']} | "
                         f"{r['of_best']['embedding']:.3g} | {r['of_best']['dense']:.3g} | "
                         f"{'yes' if r['within'] else 'no'} | {edge} |")
    return lines


def finder_name(start: str, seed: int, axis: str) -> str:
    return f"finder_commit/{start}/seed{seed}/sweep_{axis}"


def finder_overrides(start: str, seed: int, axis: str, anchor: Tuple[float, float]) -> List[str]:
    """One of the LR finder's two sweeps (:func:`studies.range_tests.finder_sweeps`) from a start, as the
    recovery study's ``lr_finder`` runs it."""
    return [f"+experiment={PRESET}", f"seed={seed}", *finder_sweeps(*start_lrs(start, anchor))[axis]]


def finder_table(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None,
                 window_decades: Optional[float] = None) -> Dict[str, Any]:
    """The finder's suggested max LRs as factors of the best cell, per start and seed (as :func:`table`), its
    sweeps read with the loss smoothed over ``window_decades`` (None: fastai's per-step 0.98, as they ran)."""
    anchor = anchor or recovery_anchor()
    starts: Dict[str, Any] = {}
    for start, (fe, fd) in KILL_STARTS.items():
        rows = []
        for seed in SEEDS:
            lines = {a: results.get(finder_name(start, seed, a)) for a in LR_AXES}
            if not all(lines.values()):
                continue
            of_best = {}
            for axis, line in lines.items():
                m = sweep_suggestion(line, window_decades)
                of_best[axis] = None if m is None else (fe if axis == "embedding" else fd) * m
            inside = all(f is not None and 1 / WITHIN <= f <= WITHIN for f in of_best.values())
            rows.append({"seed": seed, "of_best": of_best, "within": inside,
                         "seconds": sum(line.get("process_seconds") or 0 for line in lines.values())})
        starts[start] = {"factors": [fe, fd], "seeds": rows, "outside": sum(not r["within"] for r in rows)}
    return {"sweep": SWEEP_RECORD, "window_decades": window_decades, "starts": starts,
            "outside_2_of_3_at": [s for s, v in starts.items() if v["outside"] >= KILL_SEEDS]}


def rule_dev(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """How the smoothing window was chosen: the first kill test's recorded curves (the replicas' sweeps and the
    finder's, seeds 0-2) re-read with every candidate window of :data:`DEV_WINDOWS` (None: fastai's per-step 0.98,
    the rule they ran under). Per window and kind of sweep: per axis the geometric mean of the suggestions as
    factors of the best cell, the spread (standard deviation in decades), the runs outside x3.2, and the starts
    where 2+ seeds lie outside on either axis (the kill rule applied to the re-read commits)."""
    anchor = anchor or recovery_anchor()
    steps, low, high = SWEEP
    per_step = list(range(1, steps + 1))
    out: Dict[str, Any] = {"sweep": SWEEP_RECORD, "seeds": list(KILL_TESTS["classic"].seeds), "windows": {}}
    for window in DEV_WINDOWS:
        beta = CLASSIC_SMOOTHING if window is None else smoothing(low, high, steps, window)
        found: Dict[str, Dict[Tuple[str, int], Dict[str, Optional[float]]]] = {"replicas": {}, "finder": {}}
        for start, factors in KILL_STARTS.items():
            for seed in KILL_TESTS["classic"].seeds:
                rt = committed(results.get(run_name(start, seed, "classic")) or {})
                if rt is not None:
                    found["replicas"][start, seed] = {
                        axis: _times(factors[i], suggest_multiplier(per_step, rt["axes"][axis]["loss"], low, high,
                                                                    steps, beta))
                        for i, axis in enumerate(LR_AXES)}
                lines = {a: results.get(finder_name(start, seed, a)) for a in LR_AXES}
                if all(lines.values()):
                    found["finder"][start, seed] = {axis: _times(factors[i], sweep_suggestion(lines[axis], window))
                                                    for i, axis in enumerate(LR_AXES)}
        entry: Dict[str, Any] = {"beta": beta}
        for kind, runs in found.items():
            outside = {start: sum(any(f is None or not 1 / WITHIN <= f <= WITHIN for f in axes.values())
                                  for (s, _), axes in runs.items() if s == start) for start in KILL_STARTS}
            entry[kind] = {"runs": len(runs), "killed_at": [s for s, n in outside.items() if n >= KILL_SEEDS],
                           "axes": {axis: _spread([a[axis] for a in runs.values()]) for axis in LR_AXES}}
        out["windows"]["fastai_0.98" if window is None else f"{window:g}"] = entry
    return out


def divisor_dev(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """How the third form's divisors were chosen: the replicas' recorded curves of the first two kill tests (seeds
    0-5, :data:`DEV_FORMS`) re-read with the second form's window (1 decade) and each candidate divisor of
    :data:`DEV_DIVISORS`, per axis: the geometric mean of the suggestions as factors of the best cell, the spread,
    the runs outside x3.2 on that axis and the starts where 2+ of 3 seeds do. Per axis the ``chosen`` divisor is the
    one whose geometric mean lies nearest the best cell (the centre, which the second kill test showed to be off;
    the spread does not depend on the divisor)."""
    anchor = anchor or recovery_anchor()
    steps, low, high = SWEEP
    per_step = list(range(1, steps + 1))
    beta = smoothing(low, high, steps, REPLICA_WINDOW_DECADES)
    curves: Dict[Tuple[str, str, int], Tuple[Tuple[float, float], Dict[str, Any]]] = {}
    for form in DEV_FORMS:
        for start, factors in KILL_STARTS.items():
            for seed in KILL_TESTS[form].seeds:
                rt = committed(results.get(run_name(start, seed, form)) or {})
                if rt is not None:
                    curves[form, start, seed] = (factors, rt["axes"])
    out: Dict[str, Any] = {"sweep": SWEEP_RECORD, "window_decades": REPLICA_WINDOW_DECADES, "runs": len(curves),
                           "forms": {f: list(KILL_TESTS[f].seeds) for f in DEV_FORMS}, "axes": {}, "chosen": {}}
    for i, axis in enumerate(LR_AXES):
        rows: Dict[str, Any] = {}
        for divisor in DEV_DIVISORS:
            of_best = {key: _times(factors[i], suggest_multiplier(per_step, axes[axis]["loss"], low, high, steps, beta,
                                                                  divisor))
                       for key, (factors, axes) in curves.items()}
            outside = _by_form_start(of_best)
            rows[f"{divisor:g}"] = {**_spread(list(of_best.values())),
                                    "killed_at": [f"{start} (seeds {', '.join(map(str, KILL_TESTS[form].seeds))})"
                                                  for (form, start), n in outside.items() if n >= KILL_SEEDS]}
        out["axes"][axis] = rows
        if curves:
            out["chosen"][axis] = float(min(rows, key=lambda d: abs(math.log10(rows[d]["geomean"]))))
    return out


def _by_form_start(of_best: Mapping[Tuple[str, str, int], Optional[float]]) -> Dict[Tuple[str, str], int]:
    """Per (form, start) the runs outside x3.2 (a kill test's seeds are one form's)."""
    counts: Dict[Tuple[str, str], int] = {}
    for (form, start, _), f in of_best.items():
        counts[form, start] = counts.get((form, start), 0) + (f is None or not 1 / WITHIN <= f <= WITHIN)
    return counts


def render_divisor_dev(d: Mapping[str, Any]) -> List[str]:
    lines = ["", "## How the third form's divisors were chosen (the first two kill tests' curves re-read)", "",
             f"The replicas' {d['runs']} recorded sweep pairs (seeds "
             + ", ".join(f"{f}: {', '.join(map(str, s))}" for f, s in d["forms"].items())
             + f") re-read with the {d['window_decades']:g}-decade window and each divisor, per axis; the divisor "
             "whose geometric mean lies nearest the best cell was declared before the form's kill test on fresh "
             f"seeds (chosen: {', '.join(f'{a} /{v:g}' for a, v in d['chosen'].items()) or 'none'}).", "",
             "| axis | divisor | geomean x best | sd (decades) | outside x3.2 | starts with 2+ seeds outside |",
             "|---|---|---|---|---|---|"]
    for axis, rows in d["axes"].items():
        for divisor, r in rows.items():
            lines.append(f"| {axis} | {divisor} | {r['geomean']:.2f} | {r['sd_decades']:.2f} | {r['outside']} | "
                         f"{', '.join(r['killed_at']) or '-'} |")
    return lines


def _times(factor: float, multiplier: Optional[float]) -> Optional[float]:
    return None if multiplier is None else factor * multiplier


def _spread(of_best: Sequence[Optional[float]]) -> Dict[str, Any]:
    found = [math.log10(f) for f in of_best if f is not None]
    mean = sum(found) / len(found) if found else math.nan
    sd = (sum((x - mean) ** 2 for x in found) / len(found)) ** 0.5 if found else math.nan
    return {"geomean": 10 ** mean, "sd_decades": sd, "none": len(of_best) - len(found),
            "outside": sum(f is None or not 1 / WITHIN <= f <= WITHIN for f in of_best)}


def render_dev(d: Mapping[str, Any]) -> List[str]:
    lines = ["", "## How the smoothing window was chosen (the first kill test's curves re-read)", "",
             f"Every recorded sweep of the first kill test (seeds {', '.join(map(str, d['seeds']))}; the replicas' "
             "and the finder's) re-read with each candidate window; the window with the fewest runs outside x3.2 on "
             "the replicas' sweeps was declared before its own kill test on fresh seeds.", "",
             "| window (decades) | beta | sweeps | embedding: geomean x best, sd (decades), outside | dense: same | "
             "killed at |", "|---|---|---|---|---|---|"]
    for window, e in d["windows"].items():
        for kind in ("replicas", "finder"):
            a = e[kind]["axes"]
            cell = lambda x: f"{x['geomean']:.2f}, {x['sd_decades']:.2f}, {x['outside']}"  # noqa: E731
            lines.append(f"| {window} | {e['beta']:.3f} | {kind} ({e[kind]['runs']}) | {cell(a['embedding'])} | "
                         f"{cell(a['dense'])} | {', '.join(e[kind]['killed_at']) or '-'} |")
    return lines


def train_all(run: Any, anchor: Optional[Tuple[float, float]] = None, starts: Sequence[str] = tuple(KILL_STARTS)) -> None:
    """Trains every (start, seed) of the current form's kill test not yet recorded, seed-major, through
    ``run(name, overrides)``: its sweep and commit. (The earlier form's runs and the finder's sweeps beside them
    reproduce from the commit their lines name.)"""
    anchor = anchor or recovery_anchor()
    for seed in KILL_TESTS[CURRENT].seeds:
        for start in starts:
            run(run_name(start, seed), overrides(start, seed, anchor))
