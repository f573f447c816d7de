"""What a registry version holds: the files of its run (:func:`version_files`), its manifest, and a report
that names its lineage (:func:`write_version_report`).

The manifest (``manifest.json``, :class:`pipelines.registry.Registry`) records the version's lineage,
the gate's decision, the LRs it started from and ended with, its settings and the exact data it was
trained on (:func:`data_fingerprint`): for a day the job trained (:func:`day_manifest`), or for an
existing run adopted as version 1 (:func:`adopted_manifest`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from pipelines.day_plan import DayPlan
from pipelines.lr_carry import final_hdet_bases
from pipelines.settings import job_settings, settings_hash
from recsys_hdet.provenance import code_version
from recsys_hdet.run_dir import RunDir
from data_tools import contract

# Files of a finished run copied into its version directory (when present).
VERSION_FILES = (RunDir.CHECKPOINT, RunDir.EXPORT, RunDir.HYDRA, RunDir.SUMMARY, RunDir.EVAL, RunDir.REPORT, RunDir.HDET,
                 RunDir.METRICS, RunDir.PUBLISHED_EVAL, RunDir.TRAIN_LOG)


def version_files(run_dir: str) -> Dict[str, str]:
    """The files of the finished run ``run_dir`` a version holds (those present): name -> path."""
    return {name: os.path.join(run_dir, name) for name in VERSION_FILES if os.path.exists(os.path.join(run_dir, name))}


def write_version_report(run_dir: str, manifest: Dict[str, Any], version: str,
                         path: Optional[str] = None) -> Optional[str]:
    """Renders the scored run's report.html with the registry version's lineage: the gate's decision and
    reasons, the parent version and the paired NE difference against it (the report's "Registry version"
    section, read from ``manifest``, the version's manifest before the registry writes it). Into ``path``
    (default the run's own report.html, which the version then copies). Returns the path, or None for a run
    that was not scored (no eval.json: a failed day has no report). Call it after the gate decides and
    before the version's files are copied: a version is never rewritten."""
    from recsys_hdet.evaluation.report import render_run, write_report
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts

    files = RunDir(run_dir)
    if not os.path.isfile(files.path(RunDir.EVAL)):
        return None
    run = RunArtifacts(run_dir)
    run.lineage = {**manifest, "version": version}
    target = path or files.path(RunDir.REPORT)
    write_report(target, render_run(run))
    return target


def data_fingerprint(root: str, days: Sequence[str]) -> str:
    """blake2b of the training day files' bytes (the exact data a version was trained on)."""
    meta = contract.read_meta(root)
    h = hashlib.blake2b(digest_size=16)
    for d in days:
        h.update(d.encode())
        with open(os.path.join(root, meta["days"][d]["file"]), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()



def day_manifest(cfg: DictConfig, plan: DayPlan, *, parent: Optional[str], run_dir: str, summary: Dict[str, Any],
                 decision: Dict[str, Any], candidate: Optional[Dict[str, Any]], carried: Dict[str, float],
                 preset: Dict[str, float], experiment: str, overrides: List[str]) -> Dict[str, Any]:
    """The manifest of the version trained on ``plan``'s day in ``run_dir`` (``parent``: the version
    current then), gated by ``decision``."""
    resolved = RunDir(run_dir).path(RunDir.CONFIG)
    return {
        "status": decision["decision"],
        "parent": parent,
        "day": plan.day,
        "train_days": plan.train_days,
        "cold_start": plan.cold_start,
        "gap": plan.gap,  # days missing from the data set before this one (allow_gaps=true trained across them)
        "gate": decision,
        "hdet_bases": final_hdet_bases(run_dir) if summary.get("status") == "completed" else {},
        "lr_start": {g: float(v) for g, v in carried.items()} or "static",
        "lr_preset": preset,
        "metrics": candidate["eval"] if candidate else {},
        "experiment": experiment,
        "settings": job_settings(cfg),
        "settings_hash": settings_hash(job_settings(cfg)),
        "overrides": overrides,
        "holdout": OmegaConf.to_container(cfg.holdout),
        "data": {"root": os.path.abspath(str(cfg.data.root)),
                 "fingerprint": data_fingerprint(str(cfg.data.root), plan.train_days)},
        "config_hash": hashlib.blake2b(open(resolved, "rb").read(), digest_size=16).hexdigest()
        if os.path.isfile(resolved) else None,
        "commit": code_version(),
        "train_seconds": summary.get("wall_seconds"),
    }


def adopted_manifest(cfg: DictConfig, run, decision: Dict[str, Any], candidate: Dict[str, Any]) -> Dict[str, Any]:
    """The manifest of version 1 of a registry that adopts the completed run ``run``
    (:func:`recsys_hdet.evaluation.load_run`'s), scored as ``candidate`` and gated by ``decision``."""
    overrides_path = run.files.path(RunDir.OVERRIDES)
    return {
        "status": "published", "parent": None, "day": run.train_days[-1], "train_days": run.train_days,
        "cold_start": True, "adopted_from": run.run_dir, "gate": decision, "hdet_bases": final_hdet_bases(run.run_dir),
        "lr_start": "static", "lr_preset": {g: float(run.cfg.optim.lr[g]) for g in run.cfg.optim.lr},
        "metrics": candidate["eval"], "experiment": str(run.cfg.experiment_name),
        "overrides": [str(o) for o in OmegaConf.load(overrides_path)] if os.path.isfile(overrides_path) else [],
        "holdout": OmegaConf.to_container(cfg.holdout), "settings": job_settings(cfg),
        "settings_hash": settings_hash(job_settings(cfg)),
        "data": {"root": run.meta.root, "fingerprint": data_fingerprint(run.meta.root, run.train_days)},
        "commit": run.summary.get("code", "unknown"), "train_seconds": run.summary.get("wall_seconds"),
    }
