"""Where the recovery study's runs start, shared by every study and benchmark that starts from its points:
the preset, the anchor (the recovery grid's best cell, read from ``docs/results/lr_recovery/lr_recovery.json``),
the starts as (embedding, dense) factors of it, a start's LRs and their overrides.

:mod:`studies.lr_recovery` trains from these starts; :mod:`studies.range_commit`, :mod:`studies.paired_runs`
and :mod:`benchmarks.contender_cost` start from the same points without importing the study.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from data_tools.fileio import read_json
from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import StudyMismatch
from studies.provenance import REPO

PRESET = "baseline_low"  # plain, 2 x 2 layout, benchmark data, cold start
ANCHOR_FILE = os.path.join(REPO, "docs", "results", "lr_recovery", "lr_recovery.json")

# (embedding, dense) factors of the anchor (the best cell), and what each start is.
STARTS: Dict[str, Tuple[float, float]] = {
    "best": (1.0, 1.0),
    "old_tuned": (0.1, 10 ** 0.5),
    "all_low": (0.1, 0.1),
    "all_high": (10.0, 10.0),
    "emb_low_dense_high": (0.1, 10.0),
    "emb_high_dense_low": (10.0, 0.1),
    "emb_low": (0.1, 1.0),
    "emb_low_30": (1 / 30, 1.0),
    "all_high_3": (3.0, 3.0),
}


def lr_overrides(embedding: float, dense: float) -> List[str]:
    """A run's overrides for these max LRs: the embedding group's, and every dense group's (6 significant
    digits)."""
    return [f"optim.lr.embedding={embedding:.6g}", *(f"optim.lr.{g}={dense:.6g}" for g in DENSE_GROUPS)]


def recovery_anchor(path: str = ANCHOR_FILE) -> Tuple[float, float]:
    """The point every start is a factor of: ``anchor`` of the recovery study's JSON (written by every
    run of that study, so it stays put)."""
    d = read_json(path)
    if d is None:
        raise StudyMismatch(f"{path}: missing: the recovery study's anchor (best cell) is read from it")
    a = d.get("anchor")
    if not a:
        raise StudyMismatch(f"{path}: no anchor")
    return float(a["embedding"]), float(a["dense"])


def start_lrs(start: str, anchor: Tuple[float, float],
              factors: Optional[Tuple[float, float]] = None) -> Tuple[float, float]:
    """A start's (embedding, dense) LRs: its factors (default :data:`STARTS`'s) times the anchor."""
    fe, fd = STARTS[start] if factors is None else factors
    # rounded to the 6 significant digits the overrides carry: a start on the lattice is that cell
    return float(f"{anchor[0] * fe:.6g}"), float(f"{anchor[1] * fd:.6g}")
