"""The report's figures (:mod:`recsys_hdet.evaluation.report`): matplotlib PNGs embedded as data URIs,
each an ``<img class="figure">`` inside a ``<figure>`` with its caption; a figure a run has no data
for is None."""

from __future__ import annotations

import base64
import html
import io
from typing import Any, Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recsys_hdet.evaluation.run_artifacts import RunArtifacts  # noqa: E402

TASK_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def _png(fig) -> str:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(fig, caption: str) -> str:
    return (f'<figure><img class="figure" alt="{html.escape(caption)}" src="data:image/png;base64,{_png(fig)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def examples_axis_unit(max_examples: float) -> tuple:
    """``(divisor, axis label)`` for an axis counting training examples, by the run's size:
    plain examples below 10,000, thousands below a million, millions from there (so a 24-example
    run's axis reads 5 ... 25 examples, not 0.00002 million)."""
    if max_examples < 1e4:
        return 1.0, "examples"
    if max_examples < 1e6:
        return 1e3, "examples (thousands)"
    return 1e6, "examples (millions)"


def fig_train_loss(runs: Sequence[RunArtifacts]) -> Optional[str]:
    runs = [r for r in runs if r.metrics]
    if not runs:
        return None
    div, unit = examples_axis_unit(max(m["examples"] for r in runs for m in r.metrics))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    if len(runs) == 1:
        r = runs[0]
        keys = [k for k in r.metrics[0]["loss"] if k != "avg"]
        x = [m["examples"] / div for m in r.metrics]
        for i, k in enumerate(keys):
            ax.plot(x, [m["loss"][k] for m in r.metrics], color=TASK_COLORS[i % 5], lw=1.2, label=k)
        ax.plot(x, [m["loss"]["avg"] for m in r.metrics], color="black", lw=2, label="avg (task-weighted)")
        caption = "Training loss per logging interval over the one pass (all ranks)"
    else:
        for r in runs:
            ax.plot([m["examples"] / div for m in r.metrics], [m["loss"]["avg"] for m in r.metrics], lw=1.3, label=r.label)
        caption = "Training loss (task-weighted avg) per logging interval, runs overlaid"
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)  # no "1e-5" or offset beside the axis
    ax.set_xlabel(f"training {unit}")
    ax.set_ylabel("BCE")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _figure(fig, caption)


def fig_replica_losses(run: RunArtifacts) -> Optional[str]:
    if not run.hdet:
        return None
    steps = [r["step"] for r in run.hdet]
    n = max(len(r["losses"]) for r in run.hdet)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    cmap = plt.get_cmap("viridis", max(n, 2))
    for k in range(n):
        ys = [r["losses"][k] if k < len(r["losses"]) and r["losses"][k] is not None else float("nan") for r in run.hdet]
        ax.plot(steps, ys, marker="o", ms=3, lw=1, color=cmap(k), label=f"replica {k}")
    for r in run.hdet:
        for k in r.get("excluded", []):
            ax.axvline(r["step"], color="red", alpha=0.3, lw=1)
    ax.set_xlabel("step (sync)")
    ax.set_ylabel("window loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=min(n, 4))
    return _figure(fig, "Per-replica window loss at each HDET sync (red lines: a replica excluded at that sync)")


def _hparam_panels(names: Sequence[str]):
    cols = min(len(names), 3)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.1 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def fig_hparams(run: RunArtifacts) -> Optional[str]:
    """Per explored hyperparameter, two panels: every replica's value (thin) and the base (bold)
    over training; below, each replica relative to the base (ratio for multiplicative ones such
    as LRs, difference for additive ones), where the fan-out around the base is visible even when
    the schedule spans decades."""
    if run.hdet:
        names = list(run.hdet[0]["hparams"].keys())
        cols = min(len(names), 4)
        blocks = -(-len(names) // cols)
        fig, axes = plt.subplots(2 * blocks, cols, figsize=(3.6 * cols, 5.0 * blocks), squeeze=False,
                                 gridspec_kw={"height_ratios": [3, 2] * blocks})
        for i in range(len(names), blocks * cols):
            axes[2 * (i // cols)][i % cols].set_visible(False)
            axes[2 * (i // cols) + 1][i % cols].set_visible(False)
        steps = [r["step"] for r in run.hdet]
        for i, name in enumerate(names):
            top, bottom = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
            series = [r["hparams"][name] for r in run.hdet]
            n = len(series[0]["values"])
            cmap = plt.get_cmap("viridis", max(n, 2))
            ratio = name.startswith("lr/") or name in ("weight_decay", "temperature")
            for k in range(n):
                label = f"replica {k}" if n <= 8 else ("replicas" if k == 0 else None)
                top.plot(steps, [s["values"][k] for s in series], lw=0.9, alpha=0.8, color=cmap(k), label=label)
                rel = [(s["values"][k] / s["base"] if s["base"] else float("nan")) if ratio else s["values"][k] - s["base"]
                       for s in series]
                bottom.plot(steps, rel, lw=0.9, drawstyle="steps-pre", color=cmap(k), label=label)
            top.plot(steps, [s["base"] for s in series], color="black", lw=2.2, label="base")
            bottom.axhline(1.0 if ratio else 0.0, color="black", lw=1.5, label="base")
            top.legend(fontsize=6, ncol=2, loc="best", framealpha=0.6)  # every panel: which line is what
            bottom.legend(fontsize=6, ncol=2, loc="best", framealpha=0.6)
            top.set_title(name, fontsize=10)
            if ratio and all(s["base"] > 0 for s in series):
                top.set_yscale("log")
            bottom.set_ylabel("replica / base" if ratio else "replica − base", fontsize=8)
            bottom.set_xlabel("step")
            top.grid(alpha=0.3)
            bottom.grid(alpha=0.3)
        return _figure(fig, "Explored hyperparameters per replica: top, each replica's value in its window (thin) "
                            "and the shared base (bold) at each sync; bottom, each replica relative to the base")
    if run.metrics and run.metrics[0].get("lr"):
        fig, ax = plt.subplots(figsize=(8, 3.4))
        groups = list(run.metrics[0]["lr"].keys())
        described = run_schedules(run)
        total = run.summary.get("total_steps") or run.metrics[-1]["step"]
        for i, g in enumerate(groups):
            color = TASK_COLORS[i % 5]
            label = f"{g}: {schedule_label(described[g])}" if g in described else g
            ax.plot([m["step"] for m in run.metrics], [m["lr"][g] for m in run.metrics], lw=1.4, label=label,
                    color=color)
            start = (described.get(g) or {}).get("decay_start")
            if start is not None and not described[g].get("shared", True):  # where its own anneal starts
                ax.axvline(start * total, color=color, lw=1, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        own = [g for g in groups if not (described.get(g) or {}).get("shared", True)]
        caption = "Learning rate per parameter group (HDET off: one value per group, no replicas)"
        if own:
            caption += f"; own decay: {', '.join(own)} (dotted: where each one's anneal starts), the others shared"
        elif described:
            caption += "; every group on the shared one-cycle"
        return _figure(fig, caption)
    return None


def run_schedules(run: RunArtifacts) -> Dict[str, Dict[str, Any]]:
    """Each group's schedule as the run trained it (RunDir.SUMMARY's ``lr.schedule``; empty for a run from before)."""
    return dict((run.summary.get("lr") or {}).get("schedule") or {})


def schedule_label(schedule: Dict[str, Any]) -> str:
    """A group's schedule in a legend: "one-cycle, cos from 0.3" or "own decay: held to 0.7, then linear"."""
    if schedule.get("schedule") != "one_cycle":
        return str(schedule.get("schedule"))
    if schedule.get("decay_start") is None:
        return "one-cycle, three phases"
    if schedule.get("shared", True):
        return f"one-cycle, {schedule.get('shape')} from {schedule['decay_start']:g}"
    return f"own decay: held to {schedule['decay_start']:g}, then {schedule.get('shape')}"


def fig_base_lrs(runs: Sequence[RunArtifacts]) -> Optional[str]:
    """Comparison: each run's base LR per group (HDET's base, or the schedule's LR without HDET)."""
    groups: List[str] = []
    for r in runs:
        for m in r.metrics[:1]:
            groups += [g for g in m.get("lr", {}) if g not in groups]
    if not groups:
        return None
    fig, axes = _hparam_panels(groups)
    for ax, g in zip(axes, groups):
        for r in runs:
            if r.hdet and f"lr/{g}" in r.hdet[0]["hparams"]:
                xs = [h["step"] for h in r.hdet]
                ys = [h["hparams"][f"lr/{g}"]["base"] for h in r.hdet]
            else:
                xs = [m["step"] for m in r.metrics if g in m.get("lr", {})]
                ys = [m["lr"][g] for m in r.metrics if g in m.get("lr", {})]
            own = run_schedules(r).get(g) or {}
            ax.plot(xs, ys, lw=1.3, label=r.label if own.get("shared", True) else f"{r.label} ({schedule_label(own)})")
        ax.set_title(f"lr/{g}", fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[:len(groups)]:  # every panel: a run on a group's own decay is named in its panel's legend
        ax.legend(fontsize=7)
    return _figure(fig, "Base learning rate per parameter group, runs overlaid (HDET runs: the base at each sync; "
                        "a run whose group has its own decay is labelled with it in that group's panel)")


def reliability_points(curve: Dict[str, List[Any]]) -> Dict[str, Any]:
    """The bins of one reliability curve (eval.json's ``reliability[task]``) that can be drawn:
    those with examples and both a mean prediction and an observed rate. ``empty`` counts the
    bins left out (no examples, or no value), so the figure can say so instead of plotting them."""
    pred, obs = curve.get("predicted") or [], curve.get("observed") or []
    counts = curve.get("count") or [None] * len(pred)
    out: Dict[str, Any] = {"predicted": [], "observed": [], "count": [], "empty": 0}
    for p, o, n in zip(pred, obs, counts):
        if p is None or o is None or (n is not None and n <= 0):
            out["empty"] += 1
            continue
        out["predicted"].append(float(p))
        out["observed"].append(float(o))
        out["count"].append(n)
    return out


def _per_bin(counts: Sequence[Optional[int]]) -> str:
    known = [int(n) for n in counts if n is not None]
    if not known:
        return f"{len(counts)} bins"
    lo, hi = min(known), max(known)
    return f"{len(counts)} bins of {lo:,} examples" if lo == hi else f"{len(counts)} bins of {lo:,}–{hi:,} examples"


def reliability_figure(runs: Sequence[RunArtifacts]):
    """``(figure, caption)`` of the reliability curves, or None without any. Linear axes, the same
    range on both (0 to just above the largest mean prediction or observed rate drawn), so the
    diagonal is perfect calibration and every drawn bin lies inside; bins without examples are
    not drawn, and each panel states its examples per bin (and how many bins were empty)."""
    runs = [r for r in runs if r.evaluation.get("reliability")]
    if not runs:
        return None
    tasks = list(runs[0].evaluation["reliability"].keys())
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4.0), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        hi, notes = 0.0, []
        for r in runs:
            pts = reliability_points(r.evaluation["reliability"].get(t) or {})
            if pts["predicted"]:
                ax.plot(pts["predicted"], pts["observed"], marker="o", ms=3, lw=1.2,
                        label=r.label if len(runs) > 1 else None)
                hi = max(hi, *pts["predicted"], *pts["observed"])
            note = _per_bin(pts["count"]) + (f", {pts['empty']} empty (not drawn)" if pts["empty"] else "")
            notes.append(f"{r.label}: {note}" if len(runs) > 1 else note)
        hi = min(1.0, hi * 1.08) if hi > 0 else 1.0
        pad = 0.02 * hi  # markers on the edge (rate 0 or the maximum) stay whole
        ax.plot([0, hi], [0, hi], color="grey", ls="--", lw=1, label="perfect calibration")
        ax.set_xlim(-pad, hi + pad)
        ax.set_ylim(-pad, hi + pad)
        ax.set_aspect("equal", adjustable="box")
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("observed positive rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        ax.text(0.98, 0.02, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                color="#444", bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85))
    caption = ("Reliability (calibration) curves per task, linear axes: equal-count bins of the prediction "
               "(mean prediction against the observed positive rate; the dashed diagonal is perfect calibration). "
               "Each panel gives the examples per bin; a bin without examples is not drawn.")
    return fig, caption


def fig_reliability(runs: Sequence[RunArtifacts]) -> Optional[str]:
    made = reliability_figure(runs)
    return _figure(*made) if made else None


def range_test_record(run: RunArtifacts) -> Optional[Dict[str, Any]]:
    """The range test on the replicas' record (RunDir.SUMMARY's ``hdet.range_test``: the first sweep's, also after
    a resume), None when the run had none."""
    record = (run.summary.get("hdet") or {}).get("range_test")
    return record if record and record.get("axes") else None


def range_curves_figure(axes: Dict[str, Any], title: str = ""):
    """One panel per swept axis: each replica's loss (thin), the pooled loss (grey) and the smoothed loss the rule
    read (bold) against the rate multiplier (log scale), the smoothed minimum, the cut and the committed
    multiplier marked; an axis off the map says why in its title. ``axes``: a range test's per-axis record
    (``multipliers``, ``loss``, ``smoothed``, ``minimum_at``, ``cut_at``, ``multiplier``, ``read``, ``divisor``,
    ``replicas``, ``off_map``); the committed line's label names the point read and the divisor. Shared by the report and ``python -m recsys_hdet.lr_find``'s PNG."""
    fig, panels = plt.subplots(1, len(axes), figsize=(5.2 * len(axes), 3.6), squeeze=False)
    for ax, (name, a) in zip(panels[0], axes.items()):
        x = a["multipliers"]
        for rep, r in (a.get("replicas") or {}).items():
            if len(a.get("replicas") or {}) > 1:
                ax.plot(x, [v if v is not None else float("nan") for v in r["loss"]], lw=0.6, alpha=0.6,
                        label=f"replica {rep}")
        ax.plot(x, [v if v is not None else float("nan") for v in a["loss"]], color="0.6", lw=0.8, label="loss")
        ax.plot(x, [v if v is not None else float("nan") for v in a["smoothed"]], color="k", lw=1.8, label="smoothed")
        finite = [v for v in a["smoothed"] if v is not None]
        if finite:  # the explosion would flatten the curve: show up to 4x the smoothed minimum, as the rule cuts
            low = min(finite)
            ax.set_ylim(low - 0.05 * abs(low), 4.2 * low if low > 0 else None)
        if a.get("minimum_at"):
            ax.axvline(a["minimum_at"], color="#2ca02c", ls=":", label=f"smoothed minimum x{a['minimum_at']:.3g}")
        if a.get("cut_at"):
            ax.axvline(a["cut_at"], color="#d62728", ls=":", label=f"cut x{a['cut_at']:.3g}")
        ax.axvline(a["multiplier"], color="#1f77b4", lw=1.5,
                   label=f"committed x{a['multiplier']:.3g} ({a.get('read', 'minimum').replace('_', ' ')} "
                         f"/ {a.get('divisor', 10):g})")
        ax.set_xscale("log")
        ax.set_xlabel("learning-rate multiplier of the configured max LR")
        ax.set_ylabel("training loss")
        flags = a.get("off_map") or []
        ax.set_title(f"{name}" + (f" - OFF THE MAP: {', '.join(flags)}" if flags else ""),
                     color="#d62728" if flags else "k", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def fig_range_test(run: RunArtifacts) -> Optional[str]:
    """The range test's curves (:func:`range_curves_figure`) with what it committed, None without one."""
    record = range_test_record(run)
    if record is None:
        return None
    flagged = [a for a, x in record["axes"].items() if x.get("off_map")]
    caption = (f"The range test on the replicas: {record['steps']} steps from x{record['low']:g} to x{record['high']:g} "
               "of the configured max LRs, one axis per replica, the other held at the range's bottom; committed max "
               "LRs " + ", ".join(f"{g} {v:.4g}" for g, v in record["committed"].items())
               + (f". Off the map: {', '.join(flagged)} (see its title; docs/hdet.md, reading the curves)" if flagged
                  else "") + (f". Reused from {record['reused_from']} (no second sweep)" if record.get("reused_from")
                              else ""))
    return _figure(range_curves_figure(record["axes"]), caption)
