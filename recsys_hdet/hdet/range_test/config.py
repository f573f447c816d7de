"""The range test's configuration (``hdet=enabled``): :class:`RangeTestForm`, the ``hdet`` group's schema for it,
and its sweep's settings. Import-light (no torch), so the config schema can use it without the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from recsys_hdet.config_values import is_number, require
from recsys_hdet.constants import LR_AXES
from recsys_hdet.hdet.form import HDETForm
from recsys_hdet.hdet.range_test.rule import READS

# The point of each axis's curve the divisor divides (recsys_hdet.hdet.range_test.rule.READS) -> the divisors fitted
# for it. minimum: fastai's point, the divisors read off the benchmark's curves (the third form); bottom_centre: the
# geometric mean of the minimum and the explosion, fitted on the benchmark's and data_regime's recorded curves
# (python -m studies.range_rule_fit: docs/results/rule_travels/rule_fit/; hdet_history.md, range-rule-revised).
FITTED_DIVISORS = {"minimum": {"embedding": 10.0, "dense": 20.0},
                   "bottom_centre": {"embedding": 65.0, "dense": 42.0}}
assert set(FITTED_DIVISORS) == set(READS), "every read has its fitted divisors"
# Keys added to the range test's config after commits and checkpoints were recorded without them -> the value those
# were made with (a resume, a branch and a reused commit read an absent key as this).
ADDED_KEYS = {"off_map": "keep", "read": "minimum"}


@dataclass
class ReplicaRangeTestConfig:
    """The range test on the replicas (:mod:`recsys_hdet.hdet.range_test.sweep`; docs/hdet.md). Before the pass each replica sweeps one axis (the embedding; the dense groups together) from max
    LR x ``low`` to x ``high`` over ``steps`` steps, the other axis held at x ``low``; the run commits each axis's
    suggestion and trains plain from the step-0 state at the committed max LRs (cost: these steps, in parallel).
    The suggestion is the point of the curve ``read`` names - by default fastai's (the smoothed loss's minimum) -
    divided per axis by ``divisors``: how far below its stability edge the axis trains best. That distance belongs
    to the model and its optimizers, not to the start; the defaults were measured on the benchmark's model against
    its grid's best cell (docs/results/hdet_history.md, the third form), where the dense groups' edge, read with the
    embedding held low, lies about 20x above their best rate and the embedding's about 10x (fastai's 10);
    ``read=bottom_centre`` takes its own (:data:`FITTED_DIVISORS`)."""
    steps: int = 100   # the sweep's length in steps (each run by every replica at once)
    low: float = 0.001     # the sweep's first rate, x each axis's configured max LR (the other axis's held rate)
    high: float = 10000.0  # the sweep's last rate, x each axis's configured max LR
    # which point of each curve the divisors divide: minimum (the smoothed minimum, fastai's) or bottom_centre (the
    # geometric mean of the minimum and the explosion, fitted later; under judgement: docs/hdet.md)
    read: str = "minimum"
    # per axis: how far below the point read the committed max LR lies (fitted per read: FITTED_DIVISORS)
    divisors: Dict[str, float] = field(default_factory=lambda: dict(FITTED_DIVISORS["minimum"]))
    # An axis whose answer lies off the map (within a sweep step of the range's end, a curve that never explodes
    # or never descends) is flagged (the commit's line, range_test.json, summary.json, the report). keep: an axis
    # whose curve never descended or rose from its first steps (its minimum says nothing: a trained model, rates
    # too high from the start) trains at its configured rates; an answer at the range's top is a lower bound and
    # is committed. commit: the rule's answer always.
    off_map: str = "keep"

    def __post_init__(self) -> None:
        require(isinstance(self.steps, int) and self.steps >= 2, "hdet.range_test.steps", self.steps,
                "the sweep needs an integer >= 2 (0 turned HDET's controller on before the range test had its own "
                "config: that form is hdet=controller)")
        require(is_number(self.low) and self.low > 0, "hdet.range_test.low", self.low, "must be a number > 0")
        require(is_number(self.high) and self.high > self.low, "hdet.range_test.high", self.high,
                f"must be a number above hdet.range_test.low={self.low}")
        require(set(self.divisors) == set(LR_AXES), "hdet.range_test.divisors", dict(self.divisors),
                f"needs one divisor per axis: {', '.join(LR_AXES)}")
        for axis, divisor in self.divisors.items():
            require(is_number(divisor) and divisor >= 1, f"hdet.range_test.divisors.{axis}", divisor,
                    "must be a number >= 1 (the suggestion lies below the stability edge)")
        require(self.off_map in ("keep", "commit"), "hdet.range_test.off_map", self.off_map, "must be keep or commit")
        require(self.read in READS, "hdet.range_test.read", self.read, f"must be one of {', '.join(READS)}")
        # The minimum's divisors put another point's answer far above the best rate (x6.5 on the embedding): a
        # read other than the default takes its own divisors, spelled out for every axis.
        fitted, kept = FITTED_DIVISORS[self.read], [a for a, d in self.divisors.items()
                                                    if d == FITTED_DIVISORS["minimum"].get(a)]
        require(self.read == "minimum" or not kept, "hdet.range_test.divisors", dict(self.divisors),
                f"{', '.join(kept)} still at the minimum's; hdet.range_test.read={self.read} divides another point: set "
                + " ".join(f"hdet.range_test.divisors.{a}={d:g}" for a, d in fitted.items()) + " (fitted for it)")


@dataclass
class RangeTestForm(HDETForm):
    """``hdet=enabled``: the range test on the replicas (:mod:`recsys_hdet.hdet.range_test`; docs/hdet.md). After
    its commit the run trains plain, so it reads no key of the controller."""
    enabled: bool = True
    range_test: ReplicaRangeTestConfig = field(default_factory=ReplicaRangeTestConfig)
