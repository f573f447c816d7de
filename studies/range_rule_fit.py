"""``python -m studies.range_rule_fit``: the range test's revised rule, fitted on the settings already judged
(issue 59 item 4; the travel-rule's step 4). Trains nothing.

The rule as shipped (the smoothed minimum / 10 on the embedding, / 20 on the dense groups) missed its targets on
``data_regime``: its embedding commits lay x2.8-x8.7 above that setting's best cell. This re-reads every recorded
range-test curve of the settings already judged - the benchmark's (its recovery and truth studies, against
``docs/results/lr_recovery/lr_recovery.json``'s best cell) and ``data_regime``'s (against its own) - with each
candidate point of the curve (:data:`CANDIDATES`), on the product's sweep and smoothing, and fits per candidate and
axis one divisor: 10 to the mean over the two settings of the median of log10(point / best cell), rounded to two
significant figures (each setting weighs the same, however many curves it has). A candidate passes when, divided by
its divisors, both axes lie within x3.2 of the setting's best cell in at least 2 of 3 runs at every start of both
settings (the travel-rule's (c)); of those passing, the chosen one has the smallest largest |median error| (over the
settings and axes). ``transfer`` is what a fit on the benchmark alone would have missed ``data_regime`` by.

The chosen candidate and divisors are the revised rule (``hdet.range_test.read`` and ``hdet.range_test.divisors``;
``recsys_hdet.hdet.range_test.config.FITTED_DIVISORS``), judged only on settings not yet run
(docs/results/hdet_history.md, ``range-rule-revised``). Results: ``docs/results/rule_travels/rule_fit/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections import defaultdict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.hdet.range_test.rule import read_curve, read_point, smoothed_curve, smoothing, sweep_multiplier
from recsys_hdet.hdet.range_test.sweep import SMOOTHING_DECADES
from studies.provenance import REPO, code_state
from studies.reporting import machine_line, write_reports
from studies.settings import RESULTS_ROOT

OUT = os.path.join(REPO, RESULTS_ROOT, "rule_fit")
BENCHMARK_RESULTS = ("docs/results/lr_recovery/lr_recovery_f3/results.jsonl", "docs/results/lr_truth/lr_truth/results.jsonl")
SOURCES = {"benchmark": (BENCHMARK_RESULTS, "docs/results/lr_recovery/lr_recovery.json"),
           "data_regime": ((f"{RESULTS_ROOT}/data_regime/results.jsonl",), f"{RESULTS_ROOT}/data_regime/lr_recovery.json")}
SWEEP = (100, 0.001, 10000.0)  # the product's sweep (steps, low, high): curves of other sweeps are not read
BAND_DECADES = 0.5  # x3.2 either way
AXIS_START = {"embedding": "embedding", "dense": "transformer"}  # the group whose start rate an axis's multiplier scales


def _fall(fraction: float) -> Callable[[Sequence[float], Sequence[float], int, Optional[int]], float]:
    def point(m: Sequence[float], s: Sequence[float], best: int, cut: Optional[int]) -> float:
        target = s[0] - fraction * (s[0] - s[best])
        return m[next(k for k in range(best + 1) if s[k] <= target)]
    return point


def _steepest(m: Sequence[float], s: Sequence[float], best: int, cut: Optional[int]) -> float:
    if best < 2:
        return m[best]
    lg = [math.log10(x) for x in m]
    slopes = [(s[k + 1] - s[k - 1]) / (lg[k + 1] - lg[k - 1]) for k in range(1, best)]
    return m[1 + min(range(len(slopes)), key=slopes.__getitem__)]


def _valley(m: Sequence[float], s: Sequence[float], best: int, cut: Optional[int]) -> float:
    """fastai's ``valley``: the longest decreasing run of the (smoothed) loss, two thirds of the way down it."""
    end = len(m) if cut is None else cut
    lds, start, stop = [1] * end, 0, 0
    for i in range(1, end):
        for j in range(i):
            if s[i] < s[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
            if lds[stop] < lds[i]:
                stop, start = i, i - lds[i]
    third = (stop - start) / 3
    return m[start + int(third) + int(third / 2)]


def _edge(m: Sequence[float], cut: Optional[int]) -> float:
    return m[len(m) - 1 if cut is None else cut]


# candidate -> its point on a curve (multipliers, smoothed loss, index of the smoothed minimum, index of the cut)
CANDIDATES: Dict[str, Callable[[Sequence[float], Sequence[float], int, Optional[int]], float]] = {
    "minimum": lambda m, s, b, c: read_point(m[b], _edge(m, c), "minimum"),
    "explosion": lambda m, s, b, c: _edge(m, c),
    "bottom_centre": lambda m, s, b, c: read_point(m[b], _edge(m, c), "bottom_centre"),
    "fall_90": _fall(0.9), "fall_50": _fall(0.5), "steepest": _steepest, "valley": _valley}


def curves(root: str) -> Dict[str, Dict[str, List[Dict[str, float]]]]:
    """setting -> start -> one dict per unique recorded curve pair: per axis log10(candidate point / best cell)."""
    steps, low, high = SWEEP
    beta = smoothing(low, high, steps, SMOOTHING_DECADES)
    m = [sweep_multiplier(k, low, high, steps) for k in range(steps)]
    out: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    for setting, (files, best_file) in SOURCES.items():
        with open(os.path.join(root, best_file)) as f:
            best = json.load(f)["best_cell"]
        seen, starts = set(), defaultdict(list)
        for path in files:
            with open(os.path.join(root, path)) as f:
                for line in f:
                    r = json.loads(line)
                    rt = (r.get("hdet") or {}).get("range_test") or {}
                    if r.get("status") != "completed" or not rt.get("axes") or \
                            (rt["steps"], rt["low"], rt["high"]) != SWEEP:
                        continue
                    key = tuple((tuple(a["loss"]), rt["start"][AXIS_START[ax]]) for ax, a in sorted(rt["axes"].items()))
                    if key in seen:  # the truth study re-ran some of the recovery study's sweeps
                        continue
                    seen.add(key)
                    parts = r["name"].split("/")
                    start = parts[1] if parts[0] == "range_commit" else parts[0]
                    point = {}
                    if any(read_curve(a["loss"], beta)[0] is None for a in rt["axes"].values()):
                        continue  # no finite loss on an axis: no point to read
                    for ax, a in rt["axes"].items():
                        b, cut = read_curve(a["loss"], beta)
                        s = smoothed_curve(a["loss"], beta)
                        for name, fn in CANDIDATES.items():
                            point[f"{ax}/{name}"] = math.log10(fn(m, s, b, cut) * rt["start"][AXIS_START[ax]]
                                                               / best[ax])
                    starts[start].append(point)
        out[setting] = dict(starts)
    return out


def _round2(x: float) -> float:
    return float(f"{x:.2g}")


def fit(data: Mapping[str, Mapping[str, List[Mapping[str, float]]]]) -> Dict[str, Any]:
    """Per candidate: each axis's fitted divisor, the per-setting median errors after it, the benchmark-only fit's
    transfer error, the per-start counts within x3.2 and whether it passes."""
    out: Dict[str, Any] = {}
    for name in CANDIDATES:
        axes: Dict[str, Any] = {}
        for ax in AXIS_START:
            med = {st: statistics.median(p[f"{ax}/{name}"] for runs in starts.values() for p in runs)
                   for st, starts in data.items()}
            divisor = _round2(10 ** statistics.fmean(med.values()))
            axes[ax] = {"divisor": divisor, "median_error": {st: v - math.log10(divisor) for st, v in med.items()},
                        "transfer": med["data_regime"] - med["benchmark"]}
        per_start = {st: {start: [sum(all(abs(p[f"{ax}/{name}"] - math.log10(axes[ax]["divisor"])) <= BAND_DECADES
                                          for ax in AXIS_START) for p in runs), len(runs)]
                          for start, runs in sorted(starts.items())} for st, starts in data.items()}
        passes = all(3 * within >= 2 * n for starts in per_start.values() for within, n in starts.values())
        worst = max(abs(e) for a in axes.values() for e in a["median_error"].values())
        out[name] = {"axes": axes, "per_start": per_start, "passes": passes, "worst_median_error": worst}
    passing = [n for n, c in out.items() if c["passes"]]
    chosen = min(passing, key=lambda n: out[n]["worst_median_error"]) if passing else None
    return {"candidates": out, "chosen": chosen}


def render(r: Mapping[str, Any]) -> str:
    lines = ["# The range test's revised rule, fitted on the benchmark and data_regime", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Curves read: {r['curves']}. Chosen: **{r['fit']['chosen']}** "
             + (", ".join(f"{ax} / {a['divisor']:g}" for ax, a in r['fit']['candidates'][r['fit']['chosen']]['axes'].items())
                if r['fit']['chosen'] else "(none passes)") + ".", "",
             "| candidate | axis | divisor | median error, benchmark (decades) | data_regime | benchmark-only fit's "
             "transfer error | passes (c) at every start |", "|---|---|---|---|---|---|---|"]
    for name, c in r["fit"]["candidates"].items():
        for ax, a in c["axes"].items():
            lines.append(f"| {name} | {ax} | {a['divisor']:g} | {a['median_error']['benchmark']:+.2f} | "
                         f"{a['median_error']['data_regime']:+.2f} | {a['transfer']:+.2f} | "
                         f"{'yes' if c['passes'] else 'no'} |")
    lines += ["", "Runs with both axes within x3.2 of the setting's best cell, per start (after the candidate's "
              "divisors):", "", "| candidate | " + " | ".join(
                  f"{st} {start}" for st, starts in next(iter(r['fit']['candidates'].values()))['per_start'].items()
                  for start in starts) + " |"]
    lines.append("|---" * (1 + sum(len(s) for s in next(iter(r['fit']['candidates'].values()))['per_start'].values()))
                 + "|")
    for name, c in r["fit"]["candidates"].items():
        lines.append(f"| {name} | " + " | ".join(f"{w}/{n}" for starts in c["per_start"].values()
                                                  for w, n in starts.values()) + " |")
    code = r["code"]
    lines += ["", f"Command: `{r['command']}` at {(code['commit'] or '-')[:7]}"
              f"{'' if code['clean'] else ' (with uncommitted changes)'}; {r['machine']}", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=REPO, help="read the results under this checkout")
    a = p.parse_args(argv)
    data = curves(a.root)
    result = {"fit": fit(data), "curves": {st: sum(len(v) for v in s.values()) for st, s in data.items()},
              "band_decades": BAND_DECADES, "sweep": list(SWEEP), "command": "python -m studies.range_rule_fit",
              "code": code_state(), "machine": machine_line()}
    write_reports(OUT, "rule_fit", result, render(result))
    chosen = result["fit"]["chosen"]
    print(f"chosen: {chosen}" + ("" if not chosen else " " + json.dumps(
        {ax: x["divisor"] for ax, x in result["fit"]["candidates"][chosen]["axes"].items()})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
