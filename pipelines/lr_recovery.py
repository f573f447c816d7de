"""``python -m pipelines.lr_recovery``: can one HDET run find each group's learning rate?

A study with a known answer, on the benchmark data set, cold start (no warm-start checkpoint):

1. A grid of plain runs (HDET off) over the embedding LR x one shared dense LR (the transformer,
   non_embedding and no_decay groups), 5 x 5 points on a log grid spanning 100x, one seed: the
   grid optimum (lowest held-out NE, mean over tasks). While the optimum lies on an edge of the
   grid, a line of points half a decade beyond that edge is added (at most ``--max-extensions``
   times), so that the starts are set from an interior optimum, or the report says it is not.
2. From the grid optimum (``tuned``) and four misset starts (every group 10x too low; 10x too
   high; embedding 10x low with dense 10x high; the reverse), seeds 0 1 2 each:
   - the plain run at that point (the gap HDET should close),
   - full HDET with the scale-free controller (``HDET_NEW``),
   - full HDET in the paper's form (softmax, sigma 0.1, training-loss signal: ``HDET_PAPER``).
3. ``lr_recovery.json`` and ``lr_recovery.md``: per start, plain and HDET held-out NE (mean over
   tasks and seeds), the share of the gap to the grid optimum that HDET closed, each group's final
   base (mean over the last quarter of the syncs) over the grid-optimal LR, diverged counts, wall
   time; and ``lr_recovery.png``: each group's base over the pass with the grid optimum drawn.

Every run is an ordinary ``python -m recsys_hdet.train +experiment=baseline_low ...`` job trained
by :func:`pipelines.ablation.run_one`, so the study is resumable exactly as the ablation is: each
finished run appends its line to ``<out>/results.jsonl`` (:mod:`pipelines.study_results`), a run
with a line is skipped, a crashed one is redone, and the reports are rebuilt from that file alone
(``--report-only``). Run directories go to ``--work`` (for a study under docs/, the git-ignored
``outputs/studies/<study>``). Phase 2 needs phase 1's optimum, so a rerun after an interrupted grid
continues the grid first.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pipelines import study_results as SR
from pipelines.ablation import (AblationConfig, StudyMismatch, run_schedules, fmt as _f, machine_line,
                                run_one, write_reports)
from pipelines.study_results import StudyFiles
from recsys_hdet.components.metrics import read_json, read_jsonl

TASKS = ("contribution", "like", "long_dwell")
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
# The scale-free controller (items 1-4 of issue 10), conf/hdet/enabled.yaml's defaults spelled out so
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
VARIANTS = {"plain": (), "hdet": HDET_NEW, "hdet_paper": HDET_PAPER}


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


def edge_extensions(grid: Dict[Tuple[int, int], Dict[str, Any]]) -> List[Tuple[int, int]]:
    """The grid points to add when the optimum found so far lies on an edge of the explored grid.

    A grid optimum on the edge is censored: the true optimum may lie beyond it, and a study that
    measures recovery "to the optimum" needs the optimum inside the grid. The rule is fixed in
    advance and knows nothing of HDET: for each axis along which the best finished point is on an
    edge, add the points half a decade beyond that edge next to it (the optimum's own line and its
    two neighbours across the other axis), and the diagonal point when it is in a corner. Returns
    nothing once the optimum is interior (a line beyond that diverged everywhere makes it so)."""
    done = {k: v for k, v in grid.items() if v["ne"] is not None}
    if not done:
        return []
    bi, bj = min(done, key=lambda k: done[k]["ne"])
    rows = sorted({i for i, _ in grid})
    cols = sorted({j for _, j in grid})

    def beyond(pos: int, line: List[int]) -> Optional[int]:
        return pos - 1 if pos == line[0] else pos + 1 if pos == line[-1] else None

    ei, ej = beyond(bi, rows), beyond(bj, cols)
    new: List[Tuple[int, int]] = []
    if ei is not None:
        new += [(ei, j) for j in (bj - 1, bj, bj + 1) if cols[0] <= j <= cols[-1]]
    if ej is not None:
        new += [(i, ej) for i in (bi - 1, bi, bi + 1) if rows[0] <= i <= rows[-1]]
    if ei is not None and ej is not None:
        new.append((ei, ej))
    return [k for k in new if k not in grid]


def study(out: StudyFiles, seeds: Sequence[int], extra: Sequence[str], points: int = 5,
          starts: Sequence[str] = tuple(STARTS), report_only: bool = False, max_extensions: int = 2,
          variants: Sequence[str] = tuple(VARIANTS)) -> Dict[str, Any]:
    # Phase 1: the grid, one seed; extended beyond an edge while the optimum lies on it.
    grid: Dict[Tuple[int, int], Dict[str, Any]] = {}

    def train_point(i: int, j: int) -> None:
        e, d = grid_lr(GRID_CENTRE["embedding"], points, i), grid_lr(GRID_CENTRE["dense"], points, j)
        s = _run(out, grid_name(i, j), seeds[0], lr_overrides(e, d), extra, report_only)
        grid[(i, j)] = {"embedding": e, "dense": d, "ne": mean_ne(s) if s else None, "finished": s is not None,
                        "status": s["status"] if s else None, "wall_seconds": s["wall_seconds"] if s else None}

    for i in range(points):
        for j in range(points):
            train_point(i, j)
    extensions = 0
    while all(v["finished"] for v in grid.values()) and extensions < max_extensions:
        new = [k for k in edge_extensions(grid) if k not in grid]
        if not new:
            break
        extensions += 1
        print(f"grid optimum on an edge: extension {extensions} adds {len(new)} points", flush=True)
        for i, j in new:
            train_point(i, j)
    partial = {"grid": [{k: v[k] for k in ("embedding", "dense", "ne", "status")} for v in grid.values()],
               "grid_points": points, "grid_extensions": extensions, "seeds": list(seeds), "starts": {},
               "grid_optimum": None, "wall_seconds_grid": sum(v["wall_seconds"] or 0 for v in grid.values())}
    if not all(v["finished"] for v in grid.values()):
        # (report_only) the optimum is not known until every grid point has run: no starts yet.
        partial["partial"] = f"{sum(v['finished'] for v in grid.values())} of {len(grid)} grid runs finished"
        return partial
    done = {k: v for k, v in grid.items() if v["ne"] is not None}
    best = min(done, key=lambda k: done[k]["ne"])
    optimum = {"embedding": grid[best]["embedding"], "dense": grid[best]["dense"], "ne": grid[best]["ne"],
               "interior": not edge_extensions(grid)}
    print(f"grid optimum: embedding {optimum['embedding']:.4g}, dense {optimum['dense']:.4g}, "
          f"mean NE {optimum['ne']:.4f}", flush=True)
    # Phase 2: the starts.
    results: Dict[str, Any] = {}
    forms: Dict[str, List[str]] = {}
    for start in starts:
        fe, fd = STARTS[start]
        lrs = lr_overrides(optimum["embedding"] * fe, optimum["dense"] * fd)
        per_variant = {}
        for variant, overrides in VARIANTS.items():
            runs = []
            for seed in seeds:
                name = f"{start}/{variant}"
                # A variant not asked for is only read (e.g. while its controller is being changed).
                s = _run(out, name, seed, [*lrs, *overrides], extra, report_only or variant not in variants)
                missing = "not run yet" if report_only or variant not in variants else "crashed"
                runs.append({"seed": seed, "status": s["status"] if s else missing, "ne": mean_ne(s) if s else None,
                             "wall_seconds": s["wall_seconds"] if s else None,
                             "bases": final_bases(s) if s and variant != "plain" and s["status"] == "completed" else None,
                             "run": SR.run_name(name, seed)})
                if s and variant != "plain" and variant not in forms:
                    # the form a variant's runs were trained with, read from a run, not assumed
                    forms[variant] = hdet_overrides(s)
            per_variant[variant] = runs
        results[start] = summarize_start(per_variant, optimum)
    unfinished = sum(r["status"] == "not run yet" for s in results.values() for v in s["runs"].values() for r in v)
    if unfinished:
        partial["partial"] = f"{unfinished} runs of the starts not run yet"
    # What one HDET run replaces: a 25-point grid of plain runs (mean wall time of the grid's runs x 25,
    # diverged ones included: a grid pays for them too) against the mean wall time of one completed HDET
    # run (every start and seed finished so far; a diverged one stops early and would flatter the ratio).
    grid_walls = [v["wall_seconds"] for v in grid.values() if v["wall_seconds"]]
    completed_walls = lambda variant: [r["wall_seconds"] for s in results.values() for r in s["runs"][variant]
                                       if r["wall_seconds"] and r["status"] == "completed"]
    hdet_walls = completed_walls("hdet")
    # The grid ran in earlier sessions, some of its runs beside other work; the completed plain runs of
    # the starts ran beside the HDET runs, so their ratio is the like-for-like per-run cost.
    plain_walls = completed_walls("plain")
    wall = {"grid_run_mean_seconds": _mean(grid_walls), "hdet_run_mean_seconds": _mean(hdet_walls),
            "hdet_runs": len(hdet_walls), "start_plain_run_mean_seconds": _mean(plain_walls),
            "start_plain_runs": len(plain_walls)}
    wall["grid25_over_one_hdet_run"] = (25 * wall["grid_run_mean_seconds"] / wall["hdet_run_mean_seconds"]
                                        if hdet_walls else None)
    wall["hdet_run_over_plain_run"] = (wall["hdet_run_mean_seconds"] / wall["start_plain_run_mean_seconds"]
                                       if hdet_walls and plain_walls else None)
    return {**partial, "grid_optimum": optimum, "starts": results, "forms": forms, "wall_time": wall}


def hdet_overrides(record: Dict[str, Any]) -> List[str]:
    """The ``hdet`` overrides a finished run was launched with (its results line's record of it)."""
    return [o for o in record["overrides"] if o == "hdet=enabled" or o.startswith("hdet.")]


# What a diverged run scores in the gap closed: the NE of the base-rate predictor, which is 1 by
# NE's definition (a model that learnt nothing; a NaN model is worth no more). Without it a start
# whose plain runs all diverge (dense 10x high does, at every embedding LR of the grid) has no gap,
# and HDET's diverged seeds would silently drop out of its own mean. The NE columns themselves stay
# means over the completed runs, with the diverged counted beside them.
DIVERGED_NE = 1.0


def ne_for_gap(runs: List[Dict[str, Any]]) -> Optional[float]:
    """Mean NE over a variant's finished runs, a diverged run counted as ``DIVERGED_NE``."""
    return _mean([DIVERGED_NE if r["status"] == "diverged" else r["ne"] for r in runs])


def summarize_start(per_variant: Dict[str, List[Dict[str, Any]]], optimum: Dict[str, float]) -> Dict[str, Any]:
    plain_ne = _mean([r["ne"] for r in per_variant["plain"]])
    plain_gap_ne = ne_for_gap(per_variant["plain"])
    out: Dict[str, Any] = {"plain_ne": plain_ne, "plain_ne_std": _std([r["ne"] for r in per_variant["plain"]]),
                           "plain_diverged": sum(r["status"] == "diverged" for r in per_variant["plain"]),
                           "plain_ne_for_gap": plain_gap_ne,
                           # No gap to close when the plain runs at the start are not worse than the grid
                           # optimum (the grid's optimum is then not the optimum, e.g. censored at its edge).
                           "no_gap": plain_gap_ne is not None and plain_gap_ne <= optimum["ne"]}
    for variant in ("hdet", "hdet_paper"):
        runs = per_variant[variant]
        ne = _mean([r["ne"] for r in runs])
        gap_ne = ne_for_gap(runs)
        prefix = "hdet" if variant == "hdet" else "paper"
        gap = None if plain_gap_ne is None or out["no_gap"] or gap_ne is None else \
            (plain_gap_ne - gap_ne) / (plain_gap_ne - optimum["ne"])
        finished = [r["bases"] for r in runs if r["bases"]]
        ratios = {key: _geomean([b[g] / optimum[key] for b in finished for g in groups])
                  for key, groups in REPORTED.items()} if finished else {}
        out.update({f"{prefix}_ne": ne, f"{prefix}_ne_std": _std([r["ne"] for r in runs]),
                    f"{prefix}_ne_for_gap": gap_ne,
                    f"{prefix}_ne_over_optimum": None if ne is None else ne - optimum["ne"],
                    f"{prefix}_gap_closed": gap, f"{prefix}_final_base_over_optimum": ratios,
                    f"{prefix}_diverged": sum(r["status"] == "diverged" for r in runs),
                    f"{prefix}_wall_seconds": _mean([r["wall_seconds"] for r in runs])})
    # The acceptance keys name the new controller's figures without a prefix.
    out.update({"gap_closed": out["hdet_gap_closed"], "final_base_over_optimum": out["hdet_final_base_over_optimum"],
                "diverged": out["hdet_diverged"], "seeds": len(per_variant["hdet"]), "runs": per_variant})
    return out


def render_markdown(result: Dict[str, Any]) -> str:
    o = result["grid_optimum"]
    lines = ["# Learning-rate recovery on the benchmark data set", ""]
    if result.get("partial"):
        lines += [f"**PARTIAL RESULT: {result['partial']}.** Every figure below comes from a finished run; "
                  "rerun `python -m pipelines.lr_recovery` to continue the study (finished runs are skipped).", ""]
    if o is None:
        lines += [f"Produced by `{result['command']}` on {result['machine']}. The grid optimum and the starts "
                  "follow once every grid point has run.", ""]
        return "\n".join(lines + _grid_table(result)) + "\n"
    lines += [f"Produced by `{result['command']}` on {result['machine']}. Grid optimum (plain runs, seed "
             f"{result['seeds'][0]}): embedding {o['embedding']:.4g}, dense {o['dense']:.4g}, mean held-out NE "
             f"{o['ne']:.4f}" + ("" if o.get("interior", True) else
                                  f" (ON THE GRID'S EDGE after {result.get('grid_extensions', 0)} extensions: "
                                  "the true optimum may lie beyond it)") +
             ". NE is the held-out day's normalized entropy, mean over the three tasks and the seeds.",
             "Diverged runs are left out of the NE means and counted in the diverged columns (plain, HDET, "
             "paper form, of the seeds run). In the gap closed, `(plain - HDET) / (plain - optimum)` over the "
             f"seeds, a diverged run counts as NE {DIVERGED_NE:g} (the base-rate predictor's), for plain and HDET "
             "alike, so a start whose plain runs all diverge still has a gap, and HDET's own diverged seeds "
             "count against it. `HDET - opt` is HDET's mean NE over its completed runs minus the grid optimum's.",
             *(f"{label}: `{' '.join(result['forms'][v])}`." for v, label in
               (("hdet", "HDET (the scale-free controller)"), ("hdet_paper", "Paper form"))
               if result.get("forms", {}).get(v)),
             "", "| start | plain NE | plain diverged | HDET NE | HDET - opt | gap closed | emb base / opt | dense base / opt | diverged | "
             "paper-form NE | paper gap closed | paper emb / opt | paper dense / opt | paper diverged |",
             "|---|" + "---|" * 13]
    for name, s in result["starts"].items():
        r, p = s["final_base_over_optimum"], s["paper_final_base_over_optimum"]
        lines.append(f"| {name} | {_f(s['plain_ne'])} ± {_f(s['plain_ne_std'])} | {s.get('plain_diverged', 0)}/{s['seeds']} | "
                     f"{_f(s['hdet_ne'])} ± {_f(s['hdet_ne_std'])} | {_signed(s.get('hdet_ne_over_optimum'))} | "
                     f"{_f(s['gap_closed'], 2)} | {_f(r.get('embedding'), 2)} | "
                     f"{_f(r.get('dense'), 2)} | {s['diverged']}/{s['seeds']} | {_f(s['paper_ne'])} | "
                     f"{_f(s['paper_gap_closed'], 2)} | {_f(p.get('embedding'), 2)} | {_f(p.get('dense'), 2)} | "
                     f"{s['paper_diverged']}/{s['seeds']} |")
    for name, s in result["starts"].items():
        if name != "tuned" and s["no_gap"]:
            lines += ["", f"{name}: no gap to close (gap closed \"-\"): its plain runs ({s['plain_ne_for_gap']:.4f}) are "
                          f"not worse than the grid optimum ({o['ne']:.4f}): this start is not misset in NE, "
                          "whatever its LRs' distance from the grid's optimum."]
    w = result.get("wall_time") or {}
    if w.get("grid25_over_one_hdet_run"):
        lines += ["", f"Wall time: a plain grid run took {w['grid_run_mean_seconds']:.0f} s on average, one HDET run "
                      f"{w['hdet_run_mean_seconds']:.0f} s (mean of {w['hdet_runs']} completed), so a 25-run grid costs "
                      f"{w['grid25_over_one_hdet_run']:.1f}x one HDET run (2 cores, other work beside some runs)."]
        if w.get("hdet_run_over_plain_run"):
            lines[-1] += (f" Like for like, the completed plain runs of the starts took {w['start_plain_run_mean_seconds']:.0f} s "
                          f"(mean of {w['start_plain_runs']}): one HDET run costs {w['hdet_run_over_plain_run']:.2f} plain "
                          f"runs, so it replaces a 25-run grid at {25 / w['hdet_run_over_plain_run']:.1f}x less wall time.")
    lines += [""] + _grid_table(result) + ["", "![each group's base over the pass](lr_recovery.png)", ""]
    return "\n".join(lines) + "\n"


def _signed(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.4f}"


def _grid_table(result: Dict[str, Any]) -> List[str]:
    emb = sorted({g["embedding"] for g in result["grid"]})
    dense = sorted({g["dense"] for g in result["grid"]})
    by = {(g["embedding"], g["dense"]): g for g in result["grid"]}
    # A point the grid's edge extensions did not add is "-": only the optimum's neighbourhood grows.
    cell = lambda g: "-" if g is None else "diverged" if g.get("status") == "diverged" else \
        "not run yet" if g.get("status") is None else _f(g["ne"])
    lines = ["## The grid (mean held-out NE over the tasks, plain runs, one seed)", "",
             "| embedding \\ dense | " + " | ".join(f"{d:.3g}" for d in dense) + " |", "|---|" + "---|" * len(dense)]
    for e in emb:
        lines.append(f"| {e:.3g} | " + " | ".join(cell(by.get((e, d))) for d in dense) + " |")
    return lines


def plot(result: Dict[str, Any], records: Dict[str, Dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = result["grid_optimum"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes, ("embedding", "dense")):
        for colour, (name, s) in zip(colours, result["starts"].items()):
            # Every completed HDET run of the start, one line per seed; a diverged run has no base to end on.
            done = [r for r in s["runs"]["hdet"] if r["bases"]]
            for k, run in enumerate(done):
                trajectory = record_trajectory(records[run["run"]])
                # dense: the geometric mean of the dense groups' bases, as in the table and the JSON
                values = [_geomean([v[g] for g in REPORTED[key]]) for _, v in trajectory]
                label = f"{name} ({len(done)} of {len(s['runs']['hdet'])} seeds completed)" if k == 0 else None
                ax.plot([step for step, _ in trajectory], values, color=colour, linewidth=1.2, alpha=0.8, label=label)
        ax.axhline(o[key], color="k", linestyle="--", label="grid optimum")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{key}: controlled base in max-LR units" +
                     (" (geometric mean of the dense groups)" if key == "dense" else ""), fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.lr_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="docs/lr_recovery_f2",
                    help="study directory: its results.jsonl (one line per finished run, committed, so a later "
                         "session resumes where an earlier one stopped; docs/lr_recovery holds the first study, on "
                         "format-1 data, with its own report)")
    ap.add_argument("--work", default=None,
                    help="where the run directories go (runs/<start>/<variant>/seed<k>; default: --out, or "
                         "outputs/studies/<study> for a study under docs/)")
    ap.add_argument("--grid-points", type=int, default=5, help="LRs per grid axis (default 5; at least 2)")
    ap.add_argument("--max-extensions", type=int, default=2,
                    help="how many times the grid may grow beyond an edge that holds its optimum (default 2)")
    ap.add_argument("--starts", nargs="+", default=list(STARTS), choices=list(STARTS), help="a subset of the starts")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="train only these variants of the starts (the others' finished runs are still reported)")
    ap.add_argument("--docs", default="docs", help="where lr_recovery.{md,json,png} go (default docs)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write the reports from the results file alone (marked partial until "
                         "every run has its line)")
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
    result["command"] = "python -m pipelines.lr_recovery " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = machine_line()
    docs = os.path.abspath(args.docs)
    write_reports(docs, "lr_recovery", result, render_markdown(result))
    if result["grid_optimum"] is not None:
        plot(result, files.results, os.path.join(docs, "lr_recovery.png"))
    print(f"wrote lr_recovery.md/.json{'/.png' if result['grid_optimum'] is not None else ''} into {docs}"
          + (f" (partial: {result['partial']})" if result.get("partial") else ""), flush=True)
    crashed = [f"{n} {r['seed']}" for n, s in result["starts"].items() for v in s["runs"].values() for r in v
               if r["status"] == "crashed"] + [f"grid {g['embedding']:.3g}/{g['dense']:.3g}" for g in result["grid"]
                                               if g["status"] is None and not args.report_only]
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
