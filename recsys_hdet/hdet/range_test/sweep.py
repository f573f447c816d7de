"""The range test on the replicas: HDET's replicas sweep the learning rates apart, per axis, at once.

The LR range test (Smith 2017; fastai's ``lr_find``) reads where the loss stops falling as the rate
climbs (the stability edge). :mod:`recsys_hdet.lr_find` runs it before a plain run, one axis after the
other. Here the replicas that a data-parallel run has anyway run it in parallel, inside the run:

- **Fan-out, one axis per replica.** Replica ``r`` (a sharding group: one copy of the embedding tables)
  sweeps axis ``axes[r % len(axes)]``: its groups' rates rise geometrically from max LR x ``low`` to x
  ``high`` over ``steps`` steps (:func:`~recsys_hdet.hdet.range_test.rule.sweep_multiplier`) while every
  other group is held at its max LR x ``low``, so the axes are measured apart. With two replicas each axis
  has one sweep; with more, the replicas sweeping the same axis are pooled (their ranks' losses averaged
  per step: a less noisy curve). Nothing is averaged across replicas during the sweep (the job reduces the
  dense gradients within each replica).
- **Cheap logs.** Each rank writes its step loss into a preallocated tensor (no host sync per step); one
  all-gather at the end gives every rank every curve.
- **Commit.** Every rank reads the same curves with the same rule (fastai's classic, the loss smoothed over a
  window of :data:`SMOOTHING_DECADES` of the multiplier where fastai smooths over 50 steps, the smoothed
  minimum - or, with ``read`` bottom_centre, the centre of the curve's bottom between the minimum and the
  explosion - divided by the axis's divisor where fastai divides by 10:
  :func:`~recsys_hdet.hdet.range_test.rule.suggest_multiplier`), so all commit the same multipliers
  without another collective. An axis whose curve has no finite loss keeps multiplier 1 (its configured
  rates), said in the record. The divisor is per axis because the axes' edges are read apart: an axis swept
  with the other held low meets an edge that lies further above its best rate in the pass (where both
  train) for one axis than for the other (docs/results/hdet_history.md, the third form).

What happens to the replicas' weights after the sweep is the job's business (it restores the step-0
state: :mod:`recsys_hdet.hdet.range_test.job`). This module knows nothing of models: a step is a function
of a batch that returns the rank's loss, the rates are set through a function of multipliers, and the
curves are gathered through a function of a tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import torch

from recsys_hdet.hdet.range_test.check import check_curve
from recsys_hdet.hdet.range_test.rule import (READS, check_sweep, descent, early_noise, off_the_map, range_edge,
                                               read_curve, smoothed_curve, smoothing, suggest_multiplier,
                                               sweep_multiplier)


# The loss's smoothing window, in decades of the multiplier (the form's second rule; the first read with fastai's
# per-step 0.98, 3.5 decades on the default sweep). Its kill tests: docs/results/hdet_history.md.
SMOOTHING_DECADES = 1.0
OFF_MAP_POLICIES = ("keep", "commit")
KEEPS = frozenset({"never_descended", "range_edge_low"})  # the flags under which off_map=keep keeps the configured rates


@dataclass(frozen=True)
class ReplicaSweepPlan:
    """Which replica sweeps which axis, over which range, in how many steps, and how each axis's curve is read
    (its ``divisors``: the multiplier at the point ``read`` names over this is the suggestion)."""

    axes: Mapping[str, Sequence[str]]  # axis name -> its LR groups
    steps: int
    low: float
    high: float
    divisors: Mapping[str, float]  # axis name -> its divisor
    # An axis whose answer lies off the map (components.range_rule.off_the_map) is flagged; "keep" trains an axis
    # whose curve never descended at its configured rates (multiplier 1), "commit" commits the rule's answer anyway.
    off_map: str = "keep"
    read: str = "minimum"  # the point of each curve the divisor divides (rule.READS)

    def __post_init__(self) -> None:
        check_sweep("hdet.range_test", self.steps, self.low, self.high)
        if self.read not in READS:
            raise ValueError(f"hdet.range_test.read={self.read!r}: choose one of {', '.join(READS)}")
        if set(self.divisors) != set(self.axes) or not all(d >= 1 for d in self.divisors.values()):
            raise ValueError(f"hdet.range_test.divisors={dict(self.divisors)}: needs one divisor >= 1 per axis "
                             f"({', '.join(self.axes)})")
        if self.off_map not in OFF_MAP_POLICIES:
            raise ValueError(f"hdet.range_test.off_map={self.off_map!r}: choose one of {', '.join(OFF_MAP_POLICIES)}")

    def axis_of(self, replica: int) -> str:
        names = list(self.axes)
        return names[replica % len(names)]

    def multipliers(self, replica: int, step: int) -> Dict[str, float]:
        """Each LR group's multiplier of its max LR at sweep step ``step`` on ``replica``."""
        swept = self.axis_of(replica)
        rising = sweep_multiplier(step, self.low, self.high, self.steps)
        return {g: rising if axis == swept else self.low for axis, groups in self.axes.items() for g in groups}


def commit(plan: ReplicaSweepPlan, curves: torch.Tensor, replica_of_rank: Sequence[int]) -> Dict[str, Any]:
    """Each axis's suggestion from every rank's curve (``curves[rank, step]``: the rank's loss at each sweep
    step): the curve of an axis is the mean over the ranks of the replicas that swept it. Returns per axis
    its ``multiplier`` (1.0 with ``no_suggestion`` when the curve has no finite loss; 1.0 with ``kept_configured``
    when the curve never descended and ``plan.off_map`` is "keep"), ``off_map`` (why the answer lies off the map,
    empty when it does not), ``check`` (whether the answer is to be trusted on this model and why not:
    :func:`~recsys_hdet.hdet.range_test.check.check_curve`), the rule's
    ``suggested`` multiplier, the smoothed loss's ``descent``, ``range_edge``, the
    multiplier at which the rule cut the curve (``cut_at``, None if it never did), the loss's ``smoothing``
    (the moving average's per-step factor), the ``divisor`` it was read with, the ranks pooled and
    the curve itself (``loss``: one value per step)."""
    out: Dict[str, Any] = {}
    per_step = list(range(1, plan.steps + 1))  # the loss of step k counts as logged after k + 1 steps (lr_find's)
    multipliers = [sweep_multiplier(k, plan.low, plan.high, plan.steps) for k in range(plan.steps)]
    for axis in plan.axes:
        ranks = [r for r, replica in enumerate(replica_of_rank) if plan.axis_of(replica) == axis]
        if not ranks:
            raise ValueError(f"no replica sweeps the {axis} axis: the range test needs at least {len(plan.axes)} "
                             "replicas (trainer.nproc / trainer.sharding_group_size)")
        replicas = {rep: [r for r in ranks if replica_of_rank[r] == rep]
                    for rep in sorted({replica_of_rank[r] for r in ranks})}
        per_replica = {rep: curves[rs].double().mean(0) for rep, rs in replicas.items()}  # its ranks' data: one model
        curve = pooled_curve(list(per_replica.values()))
        beta = smoothing(plan.low, plan.high, plan.steps, SMOOTHING_DECADES)
        divisor = float(plan.divisors[axis])
        multiplier = suggest_multiplier(per_step, curve, plan.low, plan.high, plan.steps, beta, divisor, plan.read)
        best, cut = read_curve(curve, beta)
        fell, noise = descent(curve, beta), early_noise(curve, cut)
        flags = off_the_map(multiplier, cut, fell, noise, plan.low, plan.high, plan.steps, divisor)
        # A curve that never descended, or rose from its first steps (an answer at the range's bottom), says nothing
        # about a rate; an answer at the range's top (or from a curve that never exploded after falling) is a lower
        # bound, still better than the configured rate it was read from (measured: docs/hdet.md, off the map).
        kept = bool(KEEPS.intersection(flags)) and plan.off_map == "keep"
        # whether the answer is to be trusted on this model (check.py; never changes the commit)
        verdict = check_curve(curve, plan.low, plan.high, plan.steps, beta, divisor,
                              [[float(x) for x in c] for c in per_replica.values()] if len(per_replica) > 1 else (),
                              plan.read)
        out[axis] = {
            "multiplier": 1.0 if multiplier is None or kept else multiplier,
            "suggested": multiplier,  # the rule's answer, before the off-the-map policy
            "no_suggestion": multiplier is None,
            "off_map": flags,
            "kept_configured": kept,
            "check": verdict,
            "descent": fell,
            "early_noise": noise,
            "range_edge": None if multiplier is None else range_edge(multiplier, plan.low, plan.high, plan.steps,
                                                                     divisor=divisor),
            "cut_at": None if cut is None else sweep_multiplier(cut, plan.low, plan.high, plan.steps),
            "smoothing": beta,
            "read": plan.read,
            "divisor": divisor,
            "ranks": ranks,
            "multipliers": multipliers,  # the swept axis's multiplier at each step (the other axis: plan.low)
            "loss": _finite(curve),
            "smoothed": _finite(smoothed_curve(curve, beta)),
            "minimum_at": None if best is None else multipliers[best],
            "replicas": {str(rep): {"ranks": replicas[rep], "loss": _finite([float(x) for x in c])}
                         for rep, c in per_replica.items()},
        }
    return out


def _finite(values: Sequence[float]) -> List[Optional[float]]:
    return [float(x) if math.isfinite(x) else None for x in values]


def pooled_curve(per_replica: Sequence[torch.Tensor]) -> List[float]:
    """An axis's curve from the replicas that swept it, step by step: the lower median of their losses, a
    non-finite one counted as infinite. One replica: its curve. Several: a replica whose loss blew up does not end
    the curve while at least half of them are finite (its data or its seed, not the rate, may have done it); the
    curve ends where most of them blew up."""
    if len(per_replica) == 1:
        return [float(x) for x in per_replica[0]]
    out = []
    for values in zip(*([float(x) for x in c] for c in per_replica)):
        ranked = sorted(v if math.isfinite(v) else math.inf for v in values)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def sweep(plan: ReplicaSweepPlan, replica: int, batches: Iterator[Any], train_step: Callable[[Any], torch.Tensor],
          set_multipliers: Callable[[Mapping[str, float]], None],
          gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """This rank's sweep: ``plan.steps`` steps, each on the next batch at this replica's multipliers
    (``set_multipliers`` sets and pushes them before the step: a fused kernel takes a rate only when
    pushed), its loss (``train_step(batch)``, a 0-d tensor, not read on the host) kept on the device.
    Returns every rank's curve (``gather``: [world, steps]). Raises ValueError when the batches end first."""
    losses: List[torch.Tensor] = []
    for step in range(plan.steps):
        batch = next(batches, None)
        if batch is None:
            raise ValueError(f"hdet.range_test.steps={plan.steps}: the pass has only {step} steps on this rank")
        set_multipliers(plan.multipliers(replica, step))
        losses.append(train_step(batch).detach().double().reshape(()))
    return gather(torch.stack(losses))
