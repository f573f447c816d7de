"""The report's lineage of a registry version: what the retraining job decided about the model the report
describes, read from the version's manifest (:func:`~recsys_hdet.evaluation.run_artifacts.read_lineage`, or
handed over by the job before the manifest is written: ``pipelines.version_manifest.write_version_report``).

It shows the gate's decision and reasons, the parent version (the model in service when the day trained),
and per task the paired difference of the candidate's NE minus the parent's on the same held-out rows with
its interval, as the gate computed them (the manifest's ``gate.tasks``), beside the parent's calibration
from ``published_eval.json`` where the version holds it. Nothing here recomputes the gate: the report
shows the record the registry keeps.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional

from data_tools.fileio import read_json
from recsys_hdet.evaluation.run_artifacts import RunArtifacts
from recsys_hdet.run_dir import RunDir


def _fmt(x: Any, digits: int = 4, sign: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _parent_text(m: Dict[str, Any]) -> str:
    if m.get("parent"):
        return (f"parent <code>{html.escape(str(m['parent']))}</code> (the version in service when this day trained; "
                "the gate scored both on the same held-out rows)")
    if m.get("adopted_from"):
        return f"no parent: adopted from <code>{html.escape(str(m['adopted_from']))}</code>"
    return "no parent: a cold start (nothing was published before it)"


def lineage_line(run: RunArtifacts) -> str:
    """The provenance line's tail for a registry version: `` · version v0002 (published, parent v0001)``."""
    m = run.lineage
    if not m or "unreadable" in m:
        return ""
    decision = (m.get("gate") or {}).get("decision") or m.get("status") or "?"
    return (f" · registry version <code>{html.escape(str(m.get('version', '?')))}</code> ({html.escape(decision)}, "
            f"parent {html.escape(str(m.get('parent') or 'none'))})")


def _parent_eval(run: RunArtifacts) -> Dict[str, Any]:
    """The parent's metrics on the same rows (``published_eval.json``'s ``eval``), or {} without one."""
    try:
        published = read_json(run.files.path(RunDir.PUBLISHED_EVAL)) or {}
    except (OSError, ValueError):
        return {}
    return published.get("eval") or {}


def lineage_section(run: RunArtifacts) -> List[str]:
    """The "Registry version" section, or nothing for a run that is not one."""
    m = run.lineage
    if not m:
        return []
    if "unreadable" in m:
        return ["<h2>Registry version</h2>",
                f"<p class='note'>The version's manifest is unreadable: {html.escape(m['unreadable'])}</p>"]
    gate = m.get("gate") or {}
    decision = gate.get("decision") or m.get("status") or "not recorded"
    days = m.get("train_days") or []
    trained = f"trained on {days[0]}..{days[-1]}" if days else "training days not recorded"
    head = (f"<p>Version <code>{html.escape(str(m.get('version', '?')))}</code> of day {html.escape(str(m.get('day')))}, "
            f"{html.escape(trained)}{' (cold start)' if m.get('cold_start') else ''}; {_parent_text(m)}.</p>"
            f"<p>Gate decision: <b>{html.escape(decision)}</b></p>")
    reasons = gate.get("reasons") or []
    why = ("<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in reasons) + "</ul>") if reasons else \
        "<p class='note'>Every check passed.</p>"
    setting = lambda key: html.escape(str(gate.get(key, "not recorded")))  # as the gate's own reasons write them
    rule = (f"<p class='note'>The gate publishes a candidate whose run completed when, for every task, its NE is below "
            f"gate.max_ne {setting('max_ne')}, its calibration lies within gate.calibration {setting('calibration')} "
            f"and, against the parent, the paired interval of the NE difference (z {setting('z')}) is not entirely "
            f"above gate.ne_tolerance {setting('ne_tolerance')} (docs/operations.md).</p>")
    parent_eval = _parent_eval(run)
    rows = []
    for t, r in (gate.get("tasks") or {}).items():
        paired: Optional[Dict[str, Any]] = r.get("paired")
        diff = (f"{_fmt(paired.get('diff'), sign=True)} [{_fmt(paired.get('low'), sign=True)}, "
                f"{_fmt(paired.get('high'), sign=True)}]") if paired else "–"
        cells = [t, f"{r['rows']:,}" if isinstance(r.get("rows"), int) else "–", _fmt(r.get("candidate_ne")),
                 _fmt(r.get("published_ne")), diff, _fmt(r.get("candidate_calibration"), 3),
                 _fmt((parent_eval.get(t) or {}).get("calibration"), 3)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    table = ("<table><tr><th>task</th><th>rows</th><th>NE</th><th>parent's NE</th><th>NE − parent's [paired interval]"
             "</th><th>calibration</th><th>parent's calibration</th></tr>" + "".join(rows) + "</table>") if rows else ""
    return ["<h2>Registry version</h2>", head, why, rule, table]

