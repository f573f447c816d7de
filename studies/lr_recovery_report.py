"""The recovery study's report (:mod:`studies.lr_recovery`'s): :func:`render_markdown` and :func:`plot`,
``lr_recovery.md`` and ``lr_recovery.png`` from the study's result, and :data:`RETIRED`, the report's
paragraph on the contenders no longer trained.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from studies.contract import COLLAPSED_NE
from studies.lr_recovery_contenders import FORM_VARIANTS, LABELS, REPORTED
from studies.lr_recovery_grid import GRID_CENTRE, POINTS, grid_index, grid_lr
from studies.lr_recovery_targets import RANGE_TEST, TARGET_STARTS
from studies.lr_recovery_travel import render as render_travel_targets
from studies.reporting import fmt as _f
from studies.trajectory import geomean, record_trajectory

# The contenders no longer trained, and why (the report's "Retired" paragraph, ``retired`` in its JSON): their
# rows recorded under the contract are read and reported; the others are not in this study's results file.
RETIRED = {"lr_finder_narrow": "the LR finder with lr_find's earlier default sweep (100 steps, x0.01 to x100 "
                               "of the start: a suggestion could not pass x10); replaced by the widened "
                               "sweep (lr_finder, x0.001 to x10000, runs {start}/lr_finder_wide); its "
                               "recorded runs ({start}/lr_finder) are read and reported, never trained again",
           "hdet_controller_forms": "hdet (the earlier default) and the controller issue's variants: "
                                    "dominated (every one missed every target); not planned at emb_low_30, "
                                    "all_high_3 or a --start start; their recorded runs are read and reported",
           "hdet_previous": "the earlier defaults (probe signal, regression score): dominated in "
                            "docs/results/lr_recovery/lr_recovery_f2; not rerun under the contract",
           "hdet_paper": "the paper's form: dominated in docs/results/lr_recovery/lr_recovery_f2; not rerun under "
                         "the contract",
           "plain": "plain without rollback: the contract turns rollback on for every contender",
           "hdet_credit": "the discounted-credit signal under the effect controller: not among the variants "
                          "pre-registered in docs/results/hdet_history.md, and its signal missed the truth target (4 of 6 "
                          "cases at the low start, docs/results/hdet_history.md); never run under the contract"}


def _ci(p: Optional[Dict[str, Any]], digits: int = 4) -> str:
    if p is None:
        return "-"
    text = f"{p['mean']:+.{digits}f}"
    return text + (f" [{p['ci95'][0]:+.{digits}f}, {p['ci95'][1]:+.{digits}f}]" if p.get("ci95") else " (1 seed)")


def _lr(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_markdown(result: Dict[str, Any]) -> str:
    """The markdown report of a study's result (:func:`studies.lr_recovery.study`'s)."""
    setting = result.get("setting")
    lines = [f"# Learning-rate recovery on the setting `{setting['name']}`, under the fairness contract" if setting
             else "# Learning-rate recovery on the benchmark data set, under the fairness contract", ""]
    if setting:
        lines += [f"The setting (studies/settings.py): {setting['what']}; its overrides over the benchmark's "
                  f"`baseline_low`: `{' '.join(setting['overrides'])}`. The figures that name the benchmark's pass "
                  "(960 steps) below are the benchmark's; this setting's steps are in its runs' lines.", ""]
    if result.get("partial"):
        pending: Dict[str, int] = {}
        for st in result["starts"].values():
            for v, runs in st["runs"].items():
                pending[v] = pending.get(v, 0) + sum(r["planned"] and r["outcome"] is None for r in runs)
        lines += [f"**PARTIAL RESULT: {result['partial']}.** Every figure below comes from a finished run; "
                  "rerun `python -m studies.lr_recovery` to continue the study (finished runs are skipped). "
                  "Planned runs not in yet: " + (", ".join(f"{LABELS[v]} {n}" for v, n in pending.items() if n) or
                                                  "none") + ".", ""]
    a = result["anchor"]
    lines += [f"Produced by `{result['command']}` on {result['machine']}. NE is the held-out day's normalized "
              "entropy, mean over the three tasks. Every run trains the same rows (4,096 rows of each training "
              "day reserved by every contender: 960 steps), with rollback on (3 rollbacks, each halving every "
              f"LR); a run that diverged or ended at NE >= {COLLAPSED_NE} on a task (the base-rate predictor) "
              "**failed** and is never paired ([studies.md](../../studies.md#the-fairness-contract)). Every run names "
              "the commit it trained from (clean trees only).", "",
              f"**Anchor**: embedding {a['embedding']:.4g}, dense {a['dense']:.4g} ({a['from']}): "
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
              "plain + rollback's measured side by side (benchmarks/contender_cost.py: benchmarks/results.json, or a "
              "setting's contender_cost.json; - where not measured); cost s: mean wall seconds of a completed run (sweeps included; runs from different "
              "sessions and loads).",
              *(f"{LABELS[v]}: `{' '.join(result['forms'][v])}`." for v in FORM_VARIANTS if result["forms"].get(v)),
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
            lines.append(f"{head} {LABELS[v]} | {ne} | {failed} | {_ci(c['paired_diff'])}{n} | {ratio} | "
                         f"{_f(c['gap_closed'], 2)} | "
                         f"{_lr(lr_a['embedding'])} / {_lr(lr_a['dense'])} | "
                         f"{'-' if ip['embedding'] is None else ip['embedding']} / {'-' if ip['dense'] is None else ip['dense']}"
                         f" of {c['completed']} | {', '.join(map(str, c['rollbacks'])) or '-'} | {cost} |")
    lines += _targets_table(result)
    lines += _range_test_targets_table(result)
    lines += render_travel_targets(result.get("travel_targets") or {})
    lines += _orderings_table(result)
    w = result["wall_time"]
    if w.get("hdet_over_plain"):
        lines += ["", f"Wall time: one completed HDET run took {w['hdet_over_plain']:.2f}x one completed plain + "
                      f"rollback run (means over {w['per_variant']['hdet']['runs']} and "
                      f"{w['per_variant']['plain_rollback']['runs']} runs, 2 cores)."]
    lines += ["", "Retired (never trained again, or not at the newer starts; the rows recorded under the contract are "
                  "read and shown above, the earlier study's in [lr_recovery_f2/lr_recovery.md]"
                  "(lr_recovery_f2/lr_recovery.md)): "
              + "; ".join(f"`{k}`: {v}" for k, v in result["retired"].items()) + "."]
    lines += [""] + _grid_table(result) + ["", "![each group's base over the pass](lr_recovery.png)", ""]
    return "\n".join(lines) + "\n"


def _mark(m: Optional[bool]) -> str:
    return "pending" if m is None else "met" if m else "missed"


def _targets_table(result: Dict[str, Any]) -> List[str]:
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
        lines.append(f"| {LABELS[v]} | " + " | ".join(cells) + f" | {best} | {beats} |")
    return lines


def _range_test_targets_table(result: Dict[str, Any]) -> List[str]:
    """Issue 46's targets for the range test on the replicas (:func:`range_test_targets`), per start."""
    t = (result.get("targets") or {}).get(RANGE_TEST)
    if not t:
        return []
    c = t["cost"]
    wall = ("not measured side by side" if c["wall_ratio"] is None
            else f"wall ratio {c['wall_ratio']:.2f} ({c['wall_source']})")
    lines = ["", f"### Issue 46's targets: {LABELS[RANGE_TEST]}", "",
             "(a) from every misset start: >= 75% of the gap closed with the paired 95% interval against plain + "
             "rollback below 0 and 0 failed runs: " + f"**{_mark(t['misset']['met'])}**; "
             "(b) at best: mean difference <= +0.001 with the interval including 0: "
             f"**{_mark(t['best']['met'])}** ({'-' if not t['best']['diff'] else _ci(t['best']['diff'])}); "
             f"(c) cost: steps ratio <= {c['limit']} at every start (stretch {c['stretch']}), wall ratio <= {c['limit']} "
             f"where measured: **{_mark(c['met'])}** (stretch: {_mark(c['stretch_met'])}; largest steps ratio "
             f"{_ratio(c['steps_ratio_max'])}; {wall}); "
             "(d) against the widened LR finder at every start: NE no worse (no more failed seeds, the paired "
             "interval of range test - finder including 0 or below it) at a lower cost: "
             f"**{_mark(t['vs_lr_finder']['met'])}**."
             + (" Pending: not every run it reads is in yet." if None in (
                 t["misset"]["met"], t["best"]["met"], c["met"], t["vs_lr_finder"]["met"]) else ""), "",
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
    points, centre = POINTS, GRID_CENTRE
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


def plot(result: Dict[str, Any], records: Dict[str, Dict[str, Any]], path: str) -> None:
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
                values = [geomean([v[g] for g in REPORTED[key]]) for _, v in trajectory]
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
