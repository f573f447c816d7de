"""A run's artifacts as the reports read them (``RunDir.SUMMARY``, ``eval.json``, ``RunDir.METRICS``,
``hdet.jsonl``, read through :class:`~recsys_hdet.run_dir.RunDir`), under a label: a report is rebuilt
from them without rescoring."""

from __future__ import annotations

import os
from typing import List, Optional

from recsys_hdet.run_dir import RunDir


class RunArtifacts:
    def __init__(self, run_dir: str, label: Optional[str] = None) -> None:
        self.run_dir = run_dir
        self.files = RunDir(run_dir)
        self.summary = self.files.summary() or {}
        self.evaluation = self.files.evaluation() or {}
        self.metrics = self.files.metrics()
        self.hdet = self.files.syncs()
        self.label = label or self.summary.get("experiment") or os.path.basename(run_dir.rstrip("/"))

    @property
    def tasks(self) -> List[str]:
        return list(self.evaluation.get("eval", self.summary.get("eval", {})).keys())
