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

Run by ``python -m studies.lr_truth --range-commit`` (its lines go to the truth study's results file, the
tables to ``docs/results/lr_truth/lr_truth.json`` as ``range_commit`` and ``finder_commit``); this module holds the runs'
overrides and the tables.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.constants import DENSE_GROUPS, LR_AXES
from studies.contract import CONTRACT
from studies.range_tests import HDET_RANGE_TEST, SWEEP, finder_sweeps, sweep_suggestion
from studies.starts import PRESET, STARTS, lr_overrides, recovery_anchor, start_lrs

# (embedding, dense) factors of the anchor: the best cell, the four misset starts, and the two the issue adds.
KILL_STARTS: Dict[str, Tuple[float, float]] = {
    k: STARTS[k] for k in ("best", "all_low", "all_high", "emb_low_dense_high", "emb_high_dense_low", "emb_low_30",
                           "all_high_3")}
SEEDS = (0, 1, 2)
SWEEP_RECORD = dict(zip(("steps", "low", "high"), SWEEP))  # as the tables record it
WITHIN = 3.2  # the kill rule's band around the best cell, each axis
KILL_SEEDS = 2  # this many seeds outside the band at one start stop the form


def run_name(start: str, seed: int) -> str:
    return f"range_commit/{start}/seed{seed}"


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


def table(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """Per start and seed the committed rates as factors of the best cell, whether they lie within x3.2 on
    both axes, and the kill rule's verdict."""
    anchor = anchor or recovery_anchor()
    starts: Dict[str, Any] = {}
    killed_at: List[str] = []
    for start, (fe, fd) in KILL_STARTS.items():
        rows = []
        for seed in SEEDS:
            rt = committed(results.get(run_name(start, seed)) or {})
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
        starts[start] = {"factors": [fe, fd], "seeds": rows, "outside": outside, "complete": len(rows) == len(SEEDS)}
    complete = all(s["complete"] for s in starts.values())
    return {"rule": f"stop when at any start {KILL_SEEDS}+ seeds commit outside x{WITHIN:g} of the best cell "
                    "on either axis", "anchor": {"embedding": anchor[0], "dense": anchor[1]}, "sweep": SWEEP_RECORD,
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
    lines = ["", "## The range test on the replicas: sweep and commit only (the kill test)", "",
             f"Committed max LRs as factors of the best cell (embedding {t['anchor']['embedding']:g}, dense "
             f"{t['anchor']['dense']:g}), per seed; sweep {t['sweep']['steps']} steps from x{t['sweep']['low']:g} to "
             f"x{t['sweep']['high']:g}. Rule: {t['rule']}. Verdict: **{t['verdict']}**"
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


def finder_table(results: Mapping[str, Mapping[str, Any]], anchor: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """The finder's suggested max LRs as factors of the best cell, per start and seed (as :func:`table`)."""
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
                m = sweep_suggestion(line)
                of_best[axis] = None if m is None else (fe if axis == "embedding" else fd) * m
            inside = all(f is not None and 1 / WITHIN <= f <= WITHIN for f in of_best.values())
            rows.append({"seed": seed, "of_best": of_best, "within": inside,
                         "seconds": sum(line.get("process_seconds") or 0 for line in lines.values())})
        starts[start] = {"factors": [fe, fd], "seeds": rows, "outside": sum(not r["within"] for r in rows)}
    return {"sweep": SWEEP_RECORD, "starts": starts,
            "outside_2_of_3_at": [s for s, v in starts.items() if v["outside"] >= KILL_SEEDS]}


def train_all(run: Any, anchor: Optional[Tuple[float, float]] = None, starts: Sequence[str] = tuple(KILL_STARTS)) -> None:
    """Trains every (start, seed) not yet recorded, seed-major, through ``run(name, overrides)``: the form's
    sweep and commit, then the finder's two sweeps."""
    anchor = anchor or recovery_anchor()
    for seed in SEEDS:
        for start in starts:
            run(run_name(start, seed), overrides(start, seed, anchor))
            for axis in LR_AXES:
                run(finder_name(start, seed, axis), finder_overrides(start, seed, axis, anchor))
