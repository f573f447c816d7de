"""A run's artifacts as the reports read them (``RunDir.SUMMARY``, ``eval.json``, ``RunDir.METRICS``,
``hdet.jsonl``, read through :class:`~recsys_hdet.run_dir.RunDir`), under a label: a report is rebuilt
from them without rescoring. A registry version's directory also holds its manifest: the report's lineage
(the gate's decision and reasons, the parent version, the paired difference against it)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from data_tools.fileio import read_json
from recsys_hdet.run_dir import RunDir


def read_lineage(run_dir: str) -> Optional[Dict[str, Any]]:
    """The manifest of the registry version ``run_dir`` is, or None for a plain run directory (no manifest,
    or one without a gate record). An unreadable manifest gives ``{"unreadable": "<path>: <what>"}``: the
    report says so instead of failing."""
    path = os.path.join(run_dir, RunDir.VERSION_MANIFEST)
    try:
        manifest = read_json(path)
    except (OSError, ValueError) as e:
        return {"unreadable": f"{path}: {type(e).__name__}: {e}"}
    return manifest if isinstance(manifest, dict) and "gate" in manifest else None


class RunArtifacts:
    """``evaluation_dir``: where its eval.json and predictions.parquet are read (default the run directory;
    a comparison's own directory when the comparison scored the run on other days than its own)."""

    def __init__(self, run_dir: str, label: Optional[str] = None, evaluation_dir: Optional[str] = None) -> None:
        self.run_dir = run_dir
        self.files = RunDir(run_dir)
        self.evaluation_files = RunDir(evaluation_dir or run_dir)
        self.summary = self.files.summary() or {}
        self.evaluation = self.evaluation_files.evaluation() or {}
        self.metrics = self.files.metrics()
        self.hdet = self.files.syncs()
        self.lineage = read_lineage(run_dir)
        self.label = label or self.summary.get("experiment") or os.path.basename(run_dir.rstrip("/"))

    @property
    def predictions(self) -> str:
        """The path of the predictions.parquet that goes with :attr:`evaluation`."""
        return self.evaluation_files.path(RunDir.PREDICTIONS)

    @property
    def tasks(self) -> List[str]:
        return list(self.evaluation.get("eval", self.summary.get("eval", {})).keys())
