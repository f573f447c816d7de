"""A run's artifacts as the reports read them (``summary.json``, ``eval.json``, ``metrics.jsonl``,
``hdet.jsonl``): a report is rebuilt from them without rescoring."""

from __future__ import annotations

import os
from typing import List, Optional

from recsys_hdet.components.metrics_log import read_json, read_jsonl, sync_records


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
