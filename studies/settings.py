"""The settings the range test's rule is judged on besides the benchmark ("The range test's rule travels",
docs/results/hdet_history.md): each a name the studies take (``python -m studies.lr_recovery --setting NAME``) and the Hydra
overrides that make it, over the recovery study's preset (:data:`studies.starts.PRESET`, ``baseline_low``: the
benchmark data, the default ranker, 4 workers in a 2 x 2 layout, 512 rows per rank).

Each was chosen and written down (commit and docs/results/hdet_history.md, ``travel-rule``) before any range-test run on it, so
that neither a setting nor its definition can be fitted to the rule. Its truth (the lattice, the plateau) and
the rule's judgement are recorded in ``docs/results/rule_travels/<name>/`` (:data:`RESULTS_ROOT`).

The lattice of every setting is the benchmark's (:mod:`studies.lr_recovery_grid`), started at the benchmark's
best cell; the neighbourhood rule then walks to the setting's own best cell, and the misset starts are factors
of that cell (:func:`studies.lr_recovery.study`, ``starts_at_best``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Tuple

from studies.provenance import REPO

RESULTS_ROOT = os.path.join("docs", "results", "rule_travels")
# A setting's side-by-side cost (python -m benchmarks.contender_cost --setting NAME --write), which its study reads.
COST_FILE = "contender_cost.json"


@dataclass(frozen=True)
class Setting:
    name: str
    overrides: Tuple[str, ...]  # Hydra overrides over the study's preset, before the study's own
    what: str                   # one line for the reports
    # the contenders its study plans (studies.lr_recovery_plan.planned): the travel-rule's step 2, and the revised
    # rule on the settings not yet run when it was fitted (hdet_history.md, range-rule-revised)
    contenders: Tuple[str, ...] = ("plain_rollback", "hdet_range_test", "hdet_range_test_revised", "lr_finder")

    @property
    def out(self) -> str:
        """The setting's study directory (results.jsonl and the reports), relative to the repository."""
        return os.path.join(RESULTS_ROOT, self.name)

    def path(self, *parts: str) -> str:
        return os.path.join(REPO, self.out, *parts)

    def record(self) -> Dict[str, object]:
        """The setting as a study's report records it."""
        return {"name": self.name, "overrides": list(self.overrides), "what": self.what,
                "contenders": list(self.contenders)}


SETTINGS: Dict[str, Setting] = {s.name: s for s in (
    Setting("data_regime", ("data=bench_regime",),
            "another data regime (conf/data/bench_regime.yaml): generator seed 31, user_zipf 0.8, item_zipf 1.4, "
            "drift 0.15, signal_scale 0.6, positive rates 2% / 6% / 45%; 6 training days",
            ("plain_rollback", "hdet_range_test", "lr_finder")),  # judged before the revised rule, which it fitted
    Setting("model_shape", ("model=ranker_wide",),
            "another model shape (conf/model/ranker_wide.yaml): embedding_dim 32, 4 attention heads, towers [32]; "
            "the benchmark data"),
    Setting("batch_4x", ("data.batch_size=2048",),
            "4x the global batch: 2048 rows per rank (8192 a step against 2048); the benchmark data and model"),
)}
