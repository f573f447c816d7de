"""``report.html``: one self-contained page per run (or per comparison of runs).

Figures are matplotlib PNGs embedded as data URIs, so the file can be mailed or attached to a
review as it is. Every figure is an ``<img class="figure">`` inside a ``<figure>``; the page
sets ``data-figures`` on ``<body>`` to their count, which the rendering test checks against the
images the browser actually decoded.

Inputs are the run's artifacts only (``summary.json``, ``metrics.jsonl``, ``hdet.jsonl``,
``eval.json``), so a report can be rebuilt without rescoring.
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Any, Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recsys_hdet.components.metrics_log import read_json, read_jsonl, sync_records  # noqa: E402
from recsys_hdet.fileio import write_text_atomic  # noqa: E402

TASK_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
SEGMENT_TITLES = {"user_activity": "user activity level", "item_popularity": "item popularity bucket", "tab": "tab"}


# ----------------------------------------------------------------------------------------------
# Reading a run's artifacts


class RunArtifacts:
    def __init__(self, run_dir: str, label: Optional[str] = None) -> None:
        self.run_dir = run_dir
        self.summary = read_json(os.path.join(run_dir, "summary.json")) or {}
        self.evaluation = read_json(os.path.join(run_dir, "eval.json")) or {}
        self.metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        self.hdet = sync_records(os.path.join(run_dir, "hdet.jsonl"))
        self.label = label or self.summary.get("experiment") or os.path.basename(run_dir.rstrip("/"))

    @property
    def tasks(self) -> List[str]:
        return list(self.evaluation.get("eval", self.summary.get("eval", {})).keys())


# ----------------------------------------------------------------------------------------------
# Figures


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
                top.plot(steps, [s["values"][k] for s in series], lw=0.9, alpha=0.8, color=cmap(k))
                rel = [(s["values"][k] / s["base"] if s["base"] else float("nan")) if ratio else s["values"][k] - s["base"]
                       for s in series]
                bottom.plot(steps, rel, lw=0.9, drawstyle="steps-pre", color=cmap(k), label=f"replica {k}" if i == 0 else None)
            top.plot(steps, [s["base"] for s in series], color="black", lw=2.2, label="base")
            bottom.axhline(1.0 if ratio else 0.0, color="black", lw=1.5)
            top.set_title(name, fontsize=10)
            if ratio and all(s["base"] > 0 for s in series):
                top.set_yscale("log")
            bottom.set_ylabel("replica / base" if ratio else "replica − base", fontsize=8)
            bottom.set_xlabel("step")
            top.grid(alpha=0.3)
            bottom.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        if n <= 8:
            axes[1][0].legend(fontsize=6, ncol=2, loc="upper right", framealpha=0.6)
        return _figure(fig, "Explored hyperparameters per replica: top, each replica's value in its window (thin) "
                            "and the shared base (bold) at each sync; bottom, each replica relative to the base")
    if run.metrics and run.metrics[0].get("lr"):
        fig, ax = plt.subplots(figsize=(8, 3.4))
        groups = list(run.metrics[0]["lr"].keys())
        for i, g in enumerate(groups):
            ax.plot([m["step"] for m in run.metrics], [m["lr"][g] for m in run.metrics], lw=1.4, label=g,
                    color=TASK_COLORS[i % 5])
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return _figure(fig, "Learning rate per parameter group (HDET off: one value per group, no replicas)")
    return None


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
            ax.plot(xs, ys, lw=1.3, label=r.label)
        ax.set_title(f"lr/{g}", fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return _figure(fig, "Base learning rate per parameter group, runs overlaid (HDET runs: the base at each sync)")


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


# ----------------------------------------------------------------------------------------------
# Tables


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}"


def has_oracle(run: RunArtifacts) -> bool:
    """Whether the run's eval.json has oracle metrics: the generator's true probabilities, which
    only synthetic data carries (real logs have none)."""
    ev = run.evaluation
    return bool(ev.get("oracle") or (ev.get("random_exposure") or {}).get("oracle"))


def _metrics_head(oracle: bool, gauc: bool) -> str:
    cols = (["run", "task", "AUC"] + (["GAUC (user)"] if gauc else []) + ["NE"]
            + (["oracle NE", "NE gap"] if oracle else []) + ["log loss", "calibration", "ECE", "positive rate", "count"])
    return "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"


def _metric_rows(label: str, ev: Dict[str, Any], oracle: Optional[Dict[str, Any]],
                 gauc: Optional[Dict[str, Any]] = None) -> List[str]:
    """``oracle``: eval.json's ``oracle`` ({} for a run without one: '–'), or None to leave the
    oracle NE and NE gap columns out. ``gauc``: eval.json's ``gauc_user``, or None to leave the
    GAUC column out (it is computed on the whole held-out set only)."""
    rows = []
    for t, m in ev.items():
        cells = [html.escape(label), t, _num(m["auc"])]
        if gauc is not None:
            cells.append(_num(gauc.get(t, {}).get("gauc")))
        cells.append(_num(m["ne"]))
        if oracle is not None:
            o = oracle.get(t, {}).get("ne")
            gap = m["ne"] - o if (o is not None and m["ne"] is not None) else None
            cells += [_num(o), "–" if gap is None else f"{gap:+.4f}"]
        cells += [_num(m["logloss"]), _num(m["calibration"], 3), _num(m.get("ece")), _num(m["positive_rate"]),
                  _num(m["count"])]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return rows


def metrics_table(runs: Sequence[RunArtifacts]) -> str:
    """The held-out metrics per run and task; the oracle NE and NE gap columns only where some run
    has true probabilities (synthetic data)."""
    oracle = any(has_oracle(r) for r in runs)
    rows = []
    for r in runs:
        rows += _metric_rows(r.label, r.evaluation.get("eval", {}), r.evaluation.get("oracle", {}) if oracle else None,
                             r.evaluation.get("gauc_user", {}))
    return f"<table>{_metrics_head(oracle, gauc=True)}{''.join(rows)}</table>"


def metrics_note(runs: Sequence[RunArtifacts]) -> str:
    """The text above the metrics table: what NE, oracle NE, calibration and ECE mean; on real
    data (no true probabilities), that the oracle columns are omitted and why."""
    without = [r.label for r in runs if not has_oracle(r)]
    if not without:
        oracle = ("Oracle NE: the generator's true probabilities (synthetic data) scored on the same impressions, "
                  "the floor no model can beat; NE gap: the model's NE minus the oracle's. ")
    elif len(without) == len(runs):
        oracle = ("Real data: no true probabilities (only the synthetic generator's data has them), so the oracle "
                  "NE and NE gap columns are omitted. ")
    else:
        oracle = ("Oracle NE: the generator's true probabilities scored on the same impressions, the floor no model "
                  "can beat; NE gap: the model's NE minus the oracle's. Real data has no true probabilities: no "
                  f"oracle for {', '.join(html.escape(x) for x in without)} ('–'). ")
    return ("<p class='note'>NE: log loss / entropy of the positive rate (lower is better). " + oracle
            + "Calibration: mean prediction / positive rate (1 is calibrated). ECE: expected calibration error, "
              "15 bins (torchmetrics).</p>")


RANDOM_EXPOSURE_NOTE = ("<p class='note'>The held-out impressions whose video was shown uniformly at random "
                        "(<code>is_rand</code> = 1): the unbiased estimate of each task's metrics, free of the "
                        "serving policy's selection of what users see. A small sample: read its row count. "
                        "(GAUC is computed on the whole held-out set only.)</p>")


def random_exposure_table(runs: Sequence[RunArtifacts]) -> str:
    """eval.json's ``random_exposure`` per run: the held-out metrics on the is_rand = 1 rows with
    their row count, or the reason the slice is absent. One table per run, with the oracle columns
    only where that run has true probabilities."""
    parts = []
    for r in runs:
        rnd = r.evaluation.get("random_exposure")
        if rnd is None:
            reason = ("not in this eval.json (evaluated before the slice existed; rescore=true computes it)"
                      if r.evaluation else "no eval.json")
            parts.append(f"<p>{html.escape(r.label)}: random-exposure slice absent: {html.escape(reason)}</p>")
        elif rnd.get("status") != "present":
            parts.append(f"<p>{html.escape(r.label)}: random-exposure slice absent: "
                         f"{html.escape(str(rnd.get('reason')))}</p>")
        else:
            note = f" {html.escape(rnd['note'])}" if rnd.get("note") else ""
            parts.append(f"<p>{html.escape(r.label)}: {_num(int(rnd['rows']))} random-exposure impressions "
                         f"({html.escape(rnd.get('label', 'unbiased estimate'))}).{note}</p>")
            oracle = has_oracle(r)
            rows = _metric_rows(r.label, rnd.get("eval", {}), rnd.get("oracle", {}) if oracle else None)
            parts.append(f"<table>{_metrics_head(oracle, gauc=False)}{''.join(rows)}</table>")
    return "".join(parts)


def runs_table(runs: Sequence[RunArtifacts]) -> str:
    head = ("<tr><th>run</th><th>status</th><th>steps</th><th>examples</th><th>train loss (avg)</th>"
            "<th>examples/s</th><th>wall s</th><th>peak RSS MB</th><th>evaluated days</th><th>directory</th></tr>")
    rows = []
    for r in runs:
        s = r.summary
        rows.append(f"<tr><td>{html.escape(r.label)}</td><td>{s.get('status', '–')}</td><td>{_num(s.get('steps'))}</td>"
                    f"<td>{_num(s.get('examples'))}</td><td>{_num(s.get('train_loss', {}).get('avg'))}</td>"
                    f"<td>{_num(s.get('examples_per_sec'), 0)}</td><td>{_num(s.get('wall_seconds'), 1)}</td>"
                    f"<td>{_num(s.get('peak_rss_mb'), 0)}</td><td>{', '.join(r.evaluation.get('days', []))}</td>"
                    f"<td><code>{html.escape(r.run_dir)}</code></td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def segment_tables(runs: Sequence[RunArtifacts]) -> str:
    """Per segment kind, one row per segment value. One run: NE and AUC per task. Several runs:
    one table per task with each run's NE side by side (AUC is in each run's own report)."""
    out = []
    kinds: List[str] = []
    for r in runs:
        kinds += [k for k in r.evaluation.get("segments", {}) if k not in kinds]
    tasks = runs[0].tasks
    for kind in kinds:
        values: List[str] = []
        for r in runs:
            values += [v for v in r.evaluation.get("segments", {}).get(kind, {}) if v not in values]

        def seg(r: RunArtifacts, v: str, t: str) -> Optional[Dict[str, Any]]:
            return r.evaluation.get("segments", {}).get(kind, {}).get(v, {}).get(t)

        def count(v: str) -> Optional[int]:
            return next((seg(r, v, tasks[0])["count"] for r in runs if seg(r, v, tasks[0])), None)

        title = SEGMENT_TITLES.get(kind, kind)
        if len(runs) == 1:
            cols = "".join(f"<th>{t} NE</th><th>{t} AUC</th>" for t in tasks)
            rows = "".join(
                f"<tr><td>{html.escape(v)}</td><td>{_num(count(v))}</td>"
                + "".join(f"<td>{_num(m and m['ne'])}</td><td>{_num(m and m['auc'])}</td>"
                          for m in (seg(runs[0], v, t) for t in tasks)) + "</tr>"
                for v in values)
            out.append(f"<h3>by {title}</h3><table><tr><th>segment</th><th>impressions</th>{cols}</tr>{rows}</table>")
            continue
        for t in tasks:
            cols = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
            rows = "".join(
                f"<tr><td>{html.escape(v)}</td><td>{_num(count(v))}</td>"
                + "".join(f"<td>{_num(m and m['ne'])}</td>" for m in (seg(r, v, t) for r in runs)) + "</tr>"
                for v in values)
            out.append(f"<h3>{t} NE by {title}</h3><table><tr><th>segment</th><th>impressions</th>{cols}</tr>"
                       f"{rows}</table>")
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# The page

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1280px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
figure{margin:12px 0}img.figure{max-width:100%}figcaption{font-size:13px;color:#555}
.note{font-size:13px;color:#555}
"""


def _page(title: str, body: List[str]) -> str:
    n_figures = sum(part.count('<img class="figure"') for part in body)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body data-figures='{n_figures}'>" + "".join(body) + "</body></html>\n")


def _section(heading: str, *parts: Optional[str]) -> List[str]:
    """A heading and its parts; nothing at all when every part is empty (no figure to show)."""
    parts = [p for p in parts if p]
    return [f"<h2>{html.escape(heading)}</h2>", *parts] if parts else []


def render_run(run: RunArtifacts) -> str:
    body = [f"<h1>Offline evaluation: {html.escape(run.label)}</h1>",
            "<h2>Run</h2>", runs_table([run]),
            "<h2>Held-out metrics</h2>", metrics_note([run]), metrics_table([run]),
            "<h2>Random exposure (unbiased estimate)</h2>", RANDOM_EXPOSURE_NOTE, random_exposure_table([run])]
    body += _section("Training loss", fig_train_loss([run]))
    if run.hdet:
        body += _section("HDET: per-replica window loss", fig_replica_losses(run))
        body += _section("HDET: explored hyperparameters", fig_hparams(run))
    else:
        body += _section("Learning rate", "<p class='note'>HDET was off in this run: no replicas, no syncs.</p>",
                         fig_hparams(run))
    body += _section("Calibration (reliability curves)", fig_reliability([run]))
    body += ["<h2>Segments</h2>", segment_tables([run])]
    return _page(f"report: {run.label}", body)


def render_comparison(runs: Sequence[RunArtifacts]) -> str:
    body = [f"<h1>Offline evaluation: {len(runs)} runs compared</h1>",
            "<h2>Runs</h2>", runs_table(runs),
            "<h2>Held-out metrics</h2>", metrics_note(runs), metrics_table(runs),
            "<h2>Random exposure (unbiased estimate)</h2>", RANDOM_EXPOSURE_NOTE, random_exposure_table(runs)]
    body += _section("Training loss", fig_train_loss(runs))
    body += _section("Base learning rates", fig_base_lrs(runs))
    body += _section("Calibration (reliability curves)", fig_reliability(runs))
    detail = []
    for r in runs:
        for title, fig in (("per-replica window loss", fig_replica_losses(r)),
                           ("explored hyperparameters", fig_hparams(r) if r.hdet else None)):
            if fig:
                detail += [f"<h3>{html.escape(r.label)}: {title}</h3>", fig]
    body += _section("Per-run HDET detail", *detail) or \
        ["<h2>Per-run HDET detail</h2>", "<p class='note'>HDET was off in every run: no replicas, no syncs.</p>"]
    body += ["<h2>Segments</h2>", segment_tables(runs)]
    return _page("report: comparison", body)


write_report = write_text_atomic
