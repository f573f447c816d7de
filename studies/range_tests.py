"""The LR range tests as the studies run them, spelled out once so that a study does not move when the product's
defaults do: the sweep (100 steps from x0.001 to x10000 of the start: lr_find's default,
recsys_hdet.optim_schema.RangeTestConfig, which tests/test_lr_recovery.py checks it against), the range test on
the replicas as an HDET form (:data:`HDET_RANGE_TEST`), the LR finder's two sweeps as a run's overrides
(:func:`finder_sweeps`) and the suggestion a sweep's results line gives (:func:`sweep_suggestion`).

Used by the recovery study (its ``hdet_range_test`` and ``lr_finder`` contenders), the range test's kill test
(:mod:`studies.range_commit`) and the contenders' cost benchmark (:mod:`benchmarks.contender_cost`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

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
