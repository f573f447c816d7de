"""The LR range tests as the studies run them, spelled out once so that a study does not move when the product's
defaults do: the sweep (100 steps from x0.001 to x10000 of the start: lr_find's default,
recsys_hdet.optim_schema.RangeTestConfig, which tests/test_lr_recovery.py checks it against), the range test on
the replicas as an HDET form (:data:`HDET_RANGE_TEST`; its revised rule, :data:`HDET_RANGE_TEST_REVISED`), the LR finder's two sweeps as a run's overrides
(:func:`finder_sweeps`) and the suggestion a sweep's results line gives (:func:`sweep_suggestion`).

Used by the recovery study (its ``hdet_range_test`` and ``lr_finder`` contenders), the range test's kill test
(:mod:`studies.range_commit`) and the contenders' cost benchmark (:mod:`benchmarks.contender_cost`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.hdet.range_test.rule import CLASSIC_SMOOTHING, smoothing, suggest_multiplier
from recsys_hdet.constants import DENSE_GROUPS
from studies.contract import CONTRACT
from studies.starts import lr_overrides

# (steps, low, high): the sweep of the finder and of the range test on the replicas.
SWEEP: Tuple[int, float, float] = (100, 0.001, 10000.0)
# The smoothing window (decades of the multiplier) a finder's sweeps are read with; None: fastai's per-step 0.98,
# as lr_find and fastai read them (every finder of the studies).
FINDER_WINDOW_DECADES: Optional[float] = None
# The range test on the replicas' window (recsys_hdet.hdet.range_test.sweep.SMOOTHING_DECADES), its second form.
REPLICA_WINDOW_DECADES = 1.0
# The retired narrow finder's sweep (lr_find's default before it was widened): its recorded runs are read.
NARROW_SWEEP: Tuple[int, float, float] = (100, 0.01, 100.0)
# The range test on the replicas' divisor per axis (hdet.range_test.divisors), its third form: the dense groups'
# chosen on the first two forms' recorded curves (studies.range_commit.divisor_dev); fastai's 10 before it.
REPLICA_DIVISORS: Dict[str, float] = {"embedding": 10.0, "dense": 20.0}
# The range test on the replicas: each replica sweeps one axis (the other held at x low) before the pass, every
# rank commits the suggestion, and the pass trains plain from the step-0 state (recsys_hdet/hdet/range_test/job.py).
HDET_RANGE_TEST = ("hdet=enabled", f"hdet.range_test.steps={SWEEP[0]}", f"hdet.range_test.low={SWEEP[1]:g}",
                   f"hdet.range_test.high={SWEEP[2]:g}",
                   *(f"hdet.range_test.divisors.{axis}={d:g}" for axis, d in REPLICA_DIVISORS.items()))
# The revised rule (issue 59 item 4: studies.range_rule_fit, fitted on the benchmark and data_regime; judged only on
# the settings not yet run, hdet_history.md range-rule-revised): the same sweep, each curve read at the centre of
# its bottom (the geometric mean of its smoothed minimum and its explosion) over the divisors fitted for that read.
# Spelled out (the product's FITTED_DIVISORS, which tests/test_range_rule_fit.py checks them against).
REVISED_READ = "bottom_centre"
REVISED_DIVISORS: Dict[str, float] = {"embedding": 65.0, "dense": 42.0}
HDET_RANGE_TEST_REVISED = (*HDET_RANGE_TEST[:4], f"hdet.range_test.read={REVISED_READ}",
                           *(f"hdet.range_test.divisors.{axis}={d:g}" for axis, d in REVISED_DIVISORS.items()))


def finder_sweeps(embedding: float, dense: float, sweep: Tuple[int, float, float] = SWEEP) -> Dict[str, List[str]]:
    """The LR finder's two range tests' overrides: per axis, that axis's groups sweep from the start's LR x low to
    x high over ``steps`` steps (``sweep``; log-spaced, the loss logged every step); the other axis is held at its
    start x low, so each sweep measures its own groups. Rollback off and the divergence check at its default: a
    sweep ends where the loss explodes, as a range test does; no checkpoints, no evaluation."""
    steps, low, high = sweep
    common = ["optim.schedule.name=range_test", f"optim.schedule.range_test.steps={steps}",
              f"optim.schedule.range_test.low={low}", f"optim.schedule.range_test.high={high}",
              f"trainer.stop_at_step={steps}", "trainer.log_every=1", f"trainer.metrics_every={steps}",
              "trainer.rollback.max_rollbacks=0",
              "trainer.periodic_checkpoint.every_steps=0", "trainer.checkpoint=false", "trainer.tensorboard=false",
              f"data.reserve_rows={CONTRACT.reserve_rows}"]
    return {"embedding": [*lr_overrides(embedding, dense * low), *common,
                          "optim.schedule.range_test.groups=[embedding]"],
            "dense": [*lr_overrides(embedding * low, dense), *common,
                      "optim.schedule.range_test.groups=[" + ",".join(DENSE_GROUPS) + "]"]}


def sweep_suggestion(record: Mapping[str, Any], window_decades: Optional[float] = FINDER_WINDOW_DECADES) -> Optional[float]:
    """The suggestion (fastai's classic rule, :func:`recsys_hdet.hdet.range_test.rule.suggest_multiplier`) from a
    range-test run's results line, read with the range the line records and the loss smoothed over
    ``window_decades`` (None: fastai's per-step 0.98). None without a logged step."""
    rt = record.get("range_test") or {}
    if not rt.get("step"):
        return None
    steps, low, high = int(rt["steps"]), float(rt["low"]), float(rt["high"])
    beta = CLASSIC_SMOOTHING if window_decades is None else smoothing(low, high, steps, window_decades)
    return suggest_multiplier(rt["step"], rt["loss"], low, high, steps, beta)


# A commit against a setting's plateau (the curve check's study and the travel-rule's targets): on the plateau when a
# plateau cell lies within half the recovery lattice's step (half a decade: the area a cell stands for) on both axes.
HALF_STEP_DECADES = 0.25


def committed_rates(record: Mapping[str, Any]) -> Dict[str, float]:
    """A range test's committed max LRs (its record's ``committed``) on the study's two axes: the embedding's, and
    the dense groups' geometric mean."""
    c = record["committed"]
    return {"embedding": c["embedding"],
            "dense": math.exp(sum(math.log(c[g]) for g in DENSE_GROUPS) / len(DENSE_GROUPS))}


def plateau_distance(rates: Mapping[str, float], plateau: Sequence[Mapping[str, Any]]) -> float:
    """In decades: the smallest, over the plateau's cells, of the larger of the two axes' distances from the cell."""
    return min(max(abs(math.log10(rates[a] / cell[a])) for a in ("embedding", "dense")) for cell in plateau)
