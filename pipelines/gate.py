"""The retraining job's gate: the candidate and the published model score the same held-out rows of
the day just trained on (the recsys_hdet evaluation code), and the candidate is published only if
the run completed and, for every task, the base-rate bound and the calibration pass and the candidate
is not worse than the published model *with confidence*: the paired interval of the NE difference
over the same rows (:func:`recsys_hdet.evaluation.task_metrics.paired_ne_difference`, ``gate.z``)
lies above ``gate.ne_tolerance`` (the smallest harm worth refusing). A point difference alone is
noise on a day's few thousand held-out rows: ordinary days differ by 0.007 to 0.014 NE there
(docs/operations.md has the measured false- and true-reject rates and the command that measures them).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from data_tools.fileio import read_json
from data_tools.fileio import write_json_atomic
from recsys_hdet.run_dir import RunDir


def evaluate_models(cfg: DictConfig, run_dir: str, day: str, current_dir: Optional[str]) -> Tuple[Dict, Optional[Dict]]:
    """(candidate eval.json, published model's metrics on the same rows or None): both score the
    held-out slice of ``day`` with the recsys_hdet evaluation code. The published version's
    directory is only read (its scratch files go to the candidate's run directory)."""
    from recsys_hdet.evaluation import evaluate_frame, load_run, predictions_frame, score_run
    from recsys_hdet.evaluate import evaluate_run

    nproc = int(cfg.eval_nproc)
    candidate = evaluate_run(run_dir, days=[day], nproc=nproc)  # eval.json, report.html
    if current_dir is None:
        return candidate, None
    published_path = RunDir(run_dir).path(RunDir.PUBLISHED_EVAL)
    if os.path.isfile(published_path):
        published = read_json(published_path)
        if "paired" in published:
            return candidate, published
    run = load_run(current_dir, [day], os.path.abspath(str(cfg.data.root)))
    # The job's held-out slice, whatever slice the published run held out itself (an adopted run may
    # have held out none): both models score the same rows.
    OmegaConf.set_struct(run.cfg, False)
    run.cfg.data.holdout = OmegaConf.create(OmegaConf.to_container(cfg.holdout))
    probs = score_run(run, nproc=nproc, scratch=run_dir)
    frame = predictions_frame(run, probs)
    published = {"version_dir": current_dir, "days": [day], **evaluate_frame(frame, list(run.cfg.tasks)),
                 "paired": paired_differences(RunDir(run_dir).path(RunDir.PREDICTIONS), frame, list(run.cfg.tasks),
                                              float(cfg.gate.z))}
    write_json_atomic(published_path, published)
    return candidate, published


def paired_differences(candidate_predictions: str, published, tasks, z: float) -> Dict[str, Dict[str, float]]:
    """Per task, the candidate's NE minus the published model's on the same rows, with its paired
    interval (``candidate_predictions``: the candidate's predictions.parquet; ``published``: the
    published model's predictions frame of the same rows, in the same order)."""
    import polars as pl

    from data_tools.contract import label_column
    from recsys_hdet.evaluation.task_metrics import paired_ne_difference

    cand = pl.read_parquet(candidate_predictions)
    if cand.height != published.height or not (cand["time_ms"] == published["time_ms"]).all():
        raise ValueError(f"{candidate_predictions}: not the rows the published model scored ({cand.height} vs "
                         f"{published.height} rows)")
    return {t: paired_ne_difference(cand[label_column(t)].to_numpy(), cand[f"pred_{t}"].to_numpy(),
                                    published[f"pred_{t}"].to_numpy(), z) for t in tasks}


def worse_with_confidence(paired: Dict[str, float], tolerance: float) -> bool:
    """The candidate is worse than the published model by more than ``tolerance`` with confidence:
    the paired interval's low end is above it (a NaN interval, e.g. one class on the rows, is not)."""
    low = paired.get("low")
    return low is not None and math.isfinite(low) and low > tolerance


def gate(cfg: DictConfig, summary: Optional[Dict[str, Any]], candidate: Optional[Dict],
         published: Optional[Dict]) -> Dict[str, Any]:
    """The gate's decision: ``{"decision": "published"|"rejected", "reasons": [...], "tasks": {...}}``."""
    g = cfg.gate
    reasons: List[str] = []
    tasks: Dict[str, Dict[str, Any]] = {}
    if summary is None or summary.get("status") != "completed":
        reasons.append(f"the run did not complete (status {summary.get('status') if summary else None!r})")
    if candidate is None:
        if not reasons:  # a completed run must have been scored: nothing unchecked is published
            reasons.append("the candidate was not scored on the held-out rows (no metrics to check)")
    else:
        low, high = (float(x) for x in g.calibration)
        for t, m in candidate["eval"].items():
            row = {"candidate_ne": m["ne"], "candidate_calibration": m["calibration"], "rows": candidate.get("rows")}
            if published is not None:
                row["published_ne"] = published["eval"][t]["ne"]
                row["paired"] = published["paired"][t]
            if candidate.get("oracle"):
                row["oracle_ne"] = candidate["oracle"][t]["ne"]
            tasks[t] = row
            ne = m["ne"]
            if ne is None or not math.isfinite(ne):
                reasons.append(f"{t}: NE is not finite")
                continue
            if ne >= float(g.max_ne):
                reasons.append(f"{t}: NE {ne:.4f} >= gate.max_ne {float(g.max_ne):g} (no better than the held-out "
                               f"rows' positive rate)")
            if published is not None and worse_with_confidence(row["paired"], float(g.ne_tolerance)):
                p = row["paired"]
                reasons.append(f"{t}: NE {ne:.4f} worse than the published model's {row['published_ne']:.4f} by "
                               f"{p['diff']:+.4f}, interval [{p['low']:+.4f}, {p['high']:+.4f}] (z {float(g.z):g}, "
                               f"{p['rows']} rows) entirely above gate.ne_tolerance {float(g.ne_tolerance):g}")
            cal = m["calibration"]
            if cal is None or not low <= cal <= high:
                shown = "undefined" if cal is None else f"{cal:.3f}"
                reasons.append(f"{t}: calibration {shown} outside gate.calibration [{low:g}, {high:g}]")
    return {"decision": "rejected" if reasons else "published", "reasons": reasons, "tasks": tasks,
            "ne_tolerance": float(g.ne_tolerance), "z": float(g.z), "max_ne": float(g.max_ne),
            "calibration": [float(x) for x in g.calibration]}
