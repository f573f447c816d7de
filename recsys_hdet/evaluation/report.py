"""``report.html``: one self-contained page per run (or per comparison of runs).

Figures (:mod:`recsys_hdet.evaluation.report_figures`) are matplotlib PNGs embedded as data URIs, so
the file can be mailed or attached to a review as it is. Every figure is an ``<img class="figure">`` inside a ``<figure>``; the page
sets ``data-figures`` on ``<body>`` to their count, which the rendering test checks against the
images the browser actually decoded.

Inputs are the run's artifacts only (``RunDir.SUMMARY``, ``RunDir.METRICS``, ``hdet.jsonl``,
``eval.json``), so a report can be rebuilt without rescoring.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Sequence

from recsys_hdet.evaluation.report_figures import (fig_base_lrs, fig_hparams, fig_range_test, fig_reliability,
                                                   fig_replica_losses, fig_train_loss, range_test_record)
from recsys_hdet.evaluation.report_lineage import lineage_line, lineage_section
from recsys_hdet.evaluation.run_artifacts import RunArtifacts
from data_tools.contract import label_column
from data_tools.fileio import write_text_atomic

SEGMENT_TITLES = {"user_activity": "user activity level", "item_popularity": "item popularity bucket", "tab": "tab"}


# ----------------------------------------------------------------------------------------------
# Tables


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}"


def with_interval(m: Optional[Dict[str, Any]], key: str, digits: int = 4) -> str:
    """A metric of eval.json (``m``: one task's metrics) and its 95% interval, ``0.7404 [0.7301, 0.7502]``;
    the value alone where eval.json has no interval (written before intervals existed, or undefined)."""
    value = _num(m.get(key) if m else None, digits)
    low_high = ((m or {}).get("interval") or {}).get(key)
    if not low_high or value == "–" or None in low_high:
        return value
    return f"{value} <span class='ci'>[{low_high[0]:.{digits}f}, {low_high[1]:.{digits}f}]</span>"


def positives(m: Optional[Dict[str, Any]]) -> Optional[int]:
    """A slice's positive count: eval.json's ``positives``, or its positive rate times its count in an
    eval.json written before positives were recorded."""
    if not m:
        return None
    if m.get("positives") is not None:
        return int(m["positives"])
    rate, count = m.get("positive_rate"), m.get("count")
    return None if rate is None or count is None else int(round(rate * count))


def has_oracle(run: RunArtifacts) -> bool:
    """Whether the run's eval.json has oracle metrics: the generator's true probabilities, which
    only synthetic data carries (real logs have none)."""
    ev = run.evaluation
    return bool(ev.get("oracle") or (ev.get("random_exposure") or {}).get("oracle"))


def _metrics_head(oracle: bool, gauc: bool) -> str:
    cols = (["run", "task", "AUC [95%]"] + (["GAUC (user)"] if gauc else []) + ["NE [95%]"]
            + (["oracle NE", "NE gap"] if oracle else []) + ["log loss", "calibration [95%]", "ECE", "positive rate",
                                                             "positives", "count"])
    return "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"


def _metric_rows(label: str, ev: Dict[str, Any], oracle: Optional[Dict[str, Any]],
                 gauc: Optional[Dict[str, Any]] = None) -> List[str]:
    """``oracle``: eval.json's ``oracle`` ({} for a run without one: '–'), or None to leave the
    oracle NE and NE gap columns out. ``gauc``: eval.json's ``gauc_user``, or None to leave the
    GAUC column out (it is computed on the whole held-out set only)."""
    rows = []
    for t, m in ev.items():
        cells = [html.escape(label), t, with_interval(m, "auc")]
        if gauc is not None:
            cells.append(_num(gauc.get(t, {}).get("gauc")))
        cells.append(with_interval(m, "ne"))
        if oracle is not None:
            o = oracle.get(t, {}).get("ne")
            gap = m["ne"] - o if (o is not None and m["ne"] is not None) else None
            cells += [_num(o), "–" if gap is None else f"{gap:+.4f}"]
        cells += [_num(m["logloss"]), with_interval(m, "calibration", 3), _num(m.get("ece")), _num(m["positive_rate"]),
                  _num(positives(m)), _num(m["count"])]
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
              "15 bins (torchmetrics). " + INTERVALS_NOTE + "</p>")


INTERVALS_NOTE = ("[95%]: the interval of the metric over the slice's rows (normal approximations: NE by the delta "
                  "method, calibration on the log scale, AUC by DeLong's variance on the logit scale; rows treated as "
                  "independent). Read a slice by its positives: a few dozen give a wide interval.")
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


def provenance(runs: Sequence[RunArtifacts]) -> str:
    """Where each run's numbers come from: the commit it trained at, the checkpoint scored (its step),
    when it was evaluated."""
    lines = []
    for r in runs:
        ev = r.evaluation
        lines.append(f"{html.escape(r.label) + ': ' if len(runs) > 1 else ''}commit <code>{html.escape(str(r.summary.get('code', 'not recorded')))}</code>"
                     f" · checkpoint <code>{html.escape(str(ev.get('checkpoint', '–')))}</code> (step "
                     f"{_num(ev.get('checkpoint_steps'))}) · evaluated {html.escape(str(ev.get('evaluated_at', '–')))}"
                     f" on days {html.escape(', '.join(ev.get('days', [])) or '–')}" + lineage_line(r))
    return "<p class='note'>" + "<br>".join(lines) + "</p>"


def paired_table(runs: Sequence[RunArtifacts]) -> str:
    """Each later run's NE minus the first run's, per task, with the paired 95% interval over the
    held-out rows both scored (:func:`~recsys_hdet.evaluation.task_metrics.paired_ne_difference`): a
    difference whose interval holds 0 is within the rows' noise."""
    import os

    import polars as pl

    from recsys_hdet.evaluation.task_metrics import paired_ne_difference

    def frame(r: RunArtifacts) -> Optional[pl.DataFrame]:
        return pl.read_parquet(r.predictions) if os.path.isfile(r.predictions) else None

    base, base_frame = runs[0], frame(runs[0])
    tasks = base.tasks
    rows = []
    for r in runs[1:]:
        other = frame(r)
        same = (base_frame is not None and other is not None and other.height == base_frame.height
                and all((other[c] == base_frame[c]).all() for c in ("user_id_raw", "video_id_raw", "time_ms")
                        if c in other.columns and c in base_frame.columns))
        cells = []
        for t in tasks:
            if not same:
                cells.append("–")
                continue
            d = paired_ne_difference(base_frame[label_column(t)].to_numpy(), other[f"pred_{t}"].to_numpy(),
                                     base_frame[f"pred_{t}"].to_numpy())
            cells.append(f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
        rows.append(f"<tr><td>{html.escape(r.label)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "<tr><th>run</th>" + "".join(f"<th>{t}: NE − {html.escape(base.label)}'s [95% interval]</th>" for t in tasks)
    note = ("<p class='note'>Paired over the held-out rows both runs scored (the interval treats rows as independent); "
            "'–': the runs scored different rows.</p>")
    return note + f"<table>{head}</tr>{''.join(rows)}</table>"


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
    """Per segment kind and task, one row per segment value with its impressions and positives (read the
    intervals by them). One run: AUC, NE and calibration with their 95% intervals. Several runs: each run's
    NE and calibration side by side (AUC is in each run's own report)."""
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

        def counted(v: str, t: str) -> Optional[Dict[str, Any]]:
            """The segment's metrics in the first run that has it, for its impressions and positives (runs
            scored on the same rows count the same)."""
            return next((seg(r, v, t) for r in runs if seg(r, v, t)), None)

        def metric_cells(v: str, t: str) -> str:
            if len(runs) == 1:
                return "".join(f"<td>{with_interval(seg(runs[0], v, t), key, digits)}</td>"
                               for key, digits in (("auc", 4), ("ne", 4), ("calibration", 3)))
            return "".join(f"<td>{with_interval(seg(r, v, t), 'ne')}</td>"
                           f"<td>{with_interval(seg(r, v, t), 'calibration', 3)}</td>" for r in runs)

        title = SEGMENT_TITLES.get(kind, kind)
        cols = ("<th>AUC [95%]</th><th>NE [95%]</th><th>calibration [95%]</th>" if len(runs) == 1 else
                "".join(f"<th>{html.escape(r.label)} NE [95%]</th><th>{html.escape(r.label)} calibration [95%]</th>"
                        for r in runs))
        for t in tasks:
            rows = "".join(f"<tr><td>{html.escape(v)}</td><td>{_num((counted(v, t) or {}).get('count'))}</td>"
                           f"<td>{_num(positives(counted(v, t)))}</td>{metric_cells(v, t)}</tr>" for v in values)
            out.append(f"<h3>{t} by {title}</h3><table><tr><th>segment</th><th>impressions</th><th>positives</th>{cols}"
                       f"</tr>{rows}</table>")
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
.ci{font-size:11px;color:#666;white-space:nowrap}
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
    body = [f"<h1>Offline evaluation: {html.escape(run.label)}</h1>", provenance([run]), *lineage_section(run),
            "<h2>Run</h2>", runs_table([run]),
            "<h2>Held-out metrics</h2>", metrics_note([run]), metrics_table([run]),
            "<h2>Random exposure (unbiased estimate)</h2>", RANDOM_EXPOSURE_NOTE, random_exposure_table([run])]
    body += _section("Training loss", fig_train_loss([run]))
    body += _section("HDET: the range test on the replicas", fig_range_test(run))
    if run.hdet:
        body += _section("HDET: per-replica window loss", fig_replica_losses(run))
        body += _section("HDET: explored hyperparameters", fig_hparams(run))
    else:
        note = ("The pass trained plain at the rates the range test committed (above): no syncs."
                if range_test_record(run) else "HDET was off in this run: no replicas, no syncs.")
        body += _section("Learning rate", f"<p class='note'>{note}</p>", fig_hparams(run))
    body += _section("Calibration (reliability curves)", fig_reliability([run]))
    body += ["<h2>Segments</h2>", segment_tables([run])]
    return _page(f"report: {run.label}", body)


def render_comparison(runs: Sequence[RunArtifacts]) -> str:
    body = [f"<h1>Offline evaluation: {len(runs)} runs compared</h1>", provenance(runs),
            "<h2>Runs</h2>", runs_table(runs),
            "<h2>Held-out metrics</h2>", metrics_note(runs), metrics_table(runs),
            f"<h2>Differences against {html.escape(runs[0].label)}</h2>", paired_table(runs),
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
