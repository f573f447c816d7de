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
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recsys_hdet.components.metrics import read_json, read_jsonl, sync_records, write_text_atomic  # noqa: E402

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


def fig_train_loss(runs: Sequence[RunArtifacts]) -> Optional[str]:
    runs = [r for r in runs if r.metrics]
    if not runs:
        return None
    if len(runs) == 1:
        r = runs[0]
        fig, ax = plt.subplots(figsize=(8, 3.6))
        keys = [k for k in r.metrics[0]["loss"] if k != "avg"]
        x = [m["examples"] / 1e6 for m in r.metrics]
        for i, k in enumerate(keys):
            ax.plot(x, [m["loss"][k] for m in r.metrics], color=TASK_COLORS[i % 5], lw=1.2, label=k)
        ax.plot(x, [m["loss"]["avg"] for m in r.metrics], color="black", lw=2, label="avg (task-weighted)")
        caption = "Training loss per logging interval over the one pass (all ranks)"
    else:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for r in runs:
            ax.plot([m["examples"] / 1e6 for m in r.metrics], [m["loss"]["avg"] for m in r.metrics], lw=1.3, label=r.label)
        caption = "Training loss (task-weighted avg) per logging interval, runs overlaid"
    ax.set_xlabel("examples (millions)")
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


def fig_reliability(runs: Sequence[RunArtifacts]) -> Optional[str]:
    runs = [r for r in runs if r.evaluation.get("reliability")]
    if not runs:
        return None
    tasks = list(runs[0].evaluation["reliability"].keys())
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        lo, hi = 1.0, 0.0
        for r in runs:
            c = r.evaluation["reliability"].get(t)
            if not c:
                continue
            ax.plot(c["predicted"], c["observed"], marker="o", ms=3, lw=1.2, label=r.label if len(runs) > 1 else None)
            vals = [v for v in c["predicted"] + c["observed"] if v > 0]
            lo, hi = min(lo, min(vals, default=1.0)), max(hi, max(vals, default=0.0))
        lo, hi = max(lo * 0.8, 1e-5), min(hi * 1.2, 1.0)
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1, label="perfect calibration")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # minor labels on a short log axis collide
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("observed positive rate")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return _figure(fig, "Reliability (calibration) curves per task: 20 equal-count bins of the prediction")


# ----------------------------------------------------------------------------------------------
# Tables


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}"


_METRICS_HEAD = ("<tr><th>run</th><th>task</th><th>AUC</th><th>GAUC (user)</th><th>NE</th><th>oracle NE</th><th>NE gap</th>"
                 "<th>log loss</th><th>calibration</th><th>ECE</th><th>positive rate</th><th>count</th></tr>")


def _metric_rows(label: str, ev: Dict[str, Any], oracle: Dict[str, Any],
                 gauc: Optional[Dict[str, Any]] = None) -> List[str]:
    """``gauc``: eval.json's ``gauc_user`` (the whole held-out set only; '–' in segment rows)."""
    rows = []
    for t, m in ev.items():
        g = (gauc or {}).get(t, {}).get("gauc")
        o = oracle.get(t, {}).get("ne")
        gap = m["ne"] - o if (o is not None and m["ne"] is not None) else None
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{t}</td><td>{_num(m['auc'])}</td><td>{_num(g)}</td><td>{_num(m['ne'])}</td>"
                    f"<td>{_num(o)}</td><td>{'–' if gap is None else f'{gap:+.4f}'}</td><td>{_num(m['logloss'])}</td>"
                    f"<td>{_num(m['calibration'], 3)}</td><td>{_num(m.get('ece'))}</td>"
                    f"<td>{_num(m['positive_rate'])}</td><td>{_num(m['count'])}</td></tr>")
    return rows


def metrics_table(runs: Sequence[RunArtifacts]) -> str:
    rows = []
    for r in runs:
        rows += _metric_rows(r.label, r.evaluation.get("eval", {}), r.evaluation.get("oracle", {}),
                             r.evaluation.get("gauc_user", {}))
    return f"<table>{_METRICS_HEAD}{''.join(rows)}</table>"


RANDOM_EXPOSURE_NOTE = ("<p class='note'>The held-out impressions whose video was shown uniformly at random "
                        "(<code>is_rand</code> = 1): the unbiased estimate of each task's metrics, free of the "
                        "serving policy's selection of what users see. A small sample: read its row count.</p>")


def random_exposure_table(runs: Sequence[RunArtifacts]) -> str:
    """eval.json's ``random_exposure`` per run: the held-out metrics on the is_rand = 1 rows with
    their row count, or the reason the slice is absent."""
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
            parts.append(f"<table>{_METRICS_HEAD}"
                         f"{''.join(_metric_rows(r.label, rnd.get('eval', {}), rnd.get('oracle', {})))}</table>")
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


def render_run(run: RunArtifacts) -> str:
    body = [f"<h1>Offline evaluation: {html.escape(run.label)}</h1>",
            "<h2>Run</h2>", runs_table([run]),
            "<h2>Held-out metrics</h2>",
            "<p class='note'>NE: log loss / entropy of the positive rate (lower is better). Oracle NE: the "
            "generator's true probabilities on the same impressions, the floor no model can beat. "
            "Calibration: mean prediction / positive rate (1 is calibrated). ECE: expected calibration "
            "error, 15 bins (torchmetrics).</p>",
            metrics_table([run]),
            "<h2>Random exposure (unbiased estimate)</h2>", RANDOM_EXPOSURE_NOTE, random_exposure_table([run])]
    for fig in (fig_train_loss([run]), fig_replica_losses(run), fig_hparams(run), fig_reliability([run])):
        if fig:
            body.append(fig)
    if not run.hdet:
        body.append("<p class='note'>HDET was off in this run: no replicas, no syncs.</p>")
    body += ["<h2>Segments</h2>", segment_tables([run])]
    return _page(f"report: {run.label}", body)


def render_comparison(runs: Sequence[RunArtifacts]) -> str:
    body = [f"<h1>Offline evaluation: {len(runs)} runs compared</h1>",
            "<h2>Runs</h2>", runs_table(runs),
            "<h2>Held-out metrics</h2>", metrics_table(runs),
            "<h2>Random exposure (unbiased estimate)</h2>", RANDOM_EXPOSURE_NOTE, random_exposure_table(runs)]
    for fig in (fig_train_loss(runs), fig_base_lrs(runs), fig_reliability(runs)):
        if fig:
            body.append(fig)
    body += ["<h2>Per-run HDET detail</h2>"]
    for r in runs:
        if r.hdet:
            body.append(f"<h3>{html.escape(r.label)}</h3>")
            for fig in (fig_replica_losses(r), fig_hparams(r)):
                if fig:
                    body.append(fig)
    body += ["<h2>Segments</h2>", segment_tables(runs)]
    return _page("report: comparison", body)


write_report = write_text_atomic
