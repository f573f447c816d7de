"""The range test's configuration (``hdet=enabled``): :class:`RangeTestForm`, the ``hdet`` group's schema for it,
and its sweep's settings. Import-light (no torch), so the config schema can use it without the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from recsys_hdet.config_values import is_number, require
from recsys_hdet.constants import LR_AXES
from recsys_hdet.hdet.form import HDETForm


@dataclass
class ReplicaRangeTestConfig:
    """The range test on the replicas (:mod:`recsys_hdet.hdet.range_test.sweep`; docs/hdet.md). Before the pass each replica sweeps one axis (the embedding; the dense groups together) from max
    LR x ``low`` to x ``high`` over ``steps`` steps, the other axis held at x ``low``; the run commits each axis's
    suggestion and trains plain from the step-0 state at the committed max LRs (cost: these steps, in parallel).
    The suggestion is fastai's rule (the smoothed loss's minimum) divided per axis by ``divisors``: how far below
    its stability edge the axis trains best. That distance belongs to the model and its optimizers, not to the
    start; the defaults were measured on the benchmark's model against its grid's best cell
    (docs/results/hdet_history.md, the third form), where the dense groups' edge, read with the embedding held
    low, lies about 20x above their best rate and the embedding's about 10x (fastai's 10)."""
    steps: int = 100   # the sweep's length in steps (each run by every replica at once)
    low: float = 0.001     # the sweep's first rate, x each axis's configured max LR (the other axis's held rate)
    high: float = 10000.0  # the sweep's last rate, x each axis's configured max LR
    # per axis: how far below its smoothed minimum the committed max LR lies (measured on the benchmark's model)
    divisors: Dict[str, float] = field(default_factory=lambda: {"embedding": 10.0, "dense": 20.0})
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


@dataclass
class RangeTestForm(HDETForm):
    """``hdet=enabled``: the range test on the replicas (:mod:`recsys_hdet.hdet.range_test`; docs/hdet.md). After
    its commit the run trains plain, so it reads no key of the controller."""
    enabled: bool = True
    range_test: ReplicaRangeTestConfig = field(default_factory=ReplicaRangeTestConfig)
