"""Per-parameter-group base schedules.

:class:`OneCycle` is PyTorch's ``OneCycleLR`` as a pure function of the step (same phases, same
anneal functions, same float arithmetic, so its values equal ``OneCycleLR``'s exactly; a test
checks it step for step). A pure function is what HDET needs: the schedule's value at any step
and its floor can be read without stepping an optimizer.

:class:`DelayedDecay` is a group's own decay (``optim.schedule.groups.<group>``): the one-cycle's rise, then the
peak held until ``decay_start`` (a fraction of the pass), then the group's own anneal (cos or linear) to the
one-cycle's floor by the pass's end; Adam's beta1 mirrors it (``base_momentum`` while the LR is held, back to
``max_momentum`` over the anneal). A group with nothing of its own (:func:`own_decays`) gets :class:`OneCycle`
itself, so the shared schedule is bit for bit the one it always was.

Two more schedules for plain runs, chosen per group by :func:`build_schedules`:

- :class:`Constant`: the max LR at every step, momentum left alone. Schedule-Free AdamW's dense
  groups run on it (the method replaces the decay by iterate averaging and warms up by itself,
  ``optim.dense.warmup_steps``), while the embedding group keeps the plain run's one-cycle.
- :class:`RangeTest`: the LR range test (Smith 2017, arXiv 1506.01186; fastai's ``lr_find``):
  ``max_lr x low`` rising exponentially to ``max_lr x high`` over ``steps`` steps, for the groups
  ``optim.schedule.range_test.groups`` names (the others constant at their max LR). A short run
  (``trainer.stop_at_step``) on it logs the loss against the LR; ``recsys_hdet.lr_find``
  reads the suggestion off that curve (``hdet/range_test/rule.py``).

:class:`GroupLRScheduler` applies one schedule per named group of a
:class:`~recsys_hdet.components.optimizer.GroupedOptimizer`: ``lr`` in every group, and the
cycled momentum as ``betas[0]`` in groups that have betas (Adam), as ``OneCycleLR`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from recsys_hdet.components.range_schedule import check_sweep, sweep_multiplier
from recsys_hdet.constants import PARAM_GROUPS


def _annealing_cos(start: float, end: float, pct: float) -> float:
    cos_out = math.cos(math.pi * pct) + 1
    return end + (start - end) / 2.0 * cos_out


def _annealing_linear(start: float, end: float, pct: float) -> float:
    return (end - start) * pct + start


@dataclass(frozen=True)
class OneCycle:
    max_lr: float
    total_steps: int
    pct_start: float = 0.3
    anneal_strategy: str = "cos"
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    three_phase: bool = False
    base_momentum: float = 0.85
    max_momentum: float = 0.95

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"total_steps={self.total_steps}: must be >= 1 (is the training data empty?)")
        if not 0.0 <= self.pct_start <= 1.0:
            raise ValueError(f"optim.schedule.pct_start={self.pct_start}: must be in [0, 1]")
        if self.anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"optim.schedule.anneal_strategy={self.anneal_strategy!r}: 'cos' or 'linear'")

    @property
    def initial_lr(self) -> float:
        return self.max_lr / self.div_factor

    @property
    def min_lr(self) -> float:
        """The schedule's floor: where it ends."""
        return self.initial_lr / self.final_div_factor

    @cached_property
    def _phases(self) -> List[tuple]:
        t = self.total_steps
        up = float(self.pct_start * t) - 1
        if self.three_phase:
            return [
                (up, self.initial_lr, self.max_lr, self.max_momentum, self.base_momentum),
                (float(2 * self.pct_start * t) - 2, self.max_lr, self.initial_lr, self.base_momentum, self.max_momentum),
                (t - 1, self.initial_lr, self.min_lr, self.max_momentum, self.max_momentum),
            ]
        return [
            (up, self.initial_lr, self.max_lr, self.max_momentum, self.base_momentum),
            (t - 1, self.max_lr, self.min_lr, self.base_momentum, self.max_momentum),
        ]

    def describe(self) -> Dict[str, Any]:
        """The schedule as RunDir.SUMMARY's ``lr.schedule`` names it: whether it is the shared one-cycle, its peak and
        floor, where its rise ends (``pct_start``) and its anneal starts (``decay_start``, fractions of the pass), and
        the anneal's ``shape`` (cos, linear)."""
        return {"schedule": "one_cycle", "shared": True, "max_lr": self.max_lr, "min_lr": self.min_lr,
                "pct_start": self.pct_start, "decay_start": None if self.three_phase else self.pct_start,
                "shape": self.anneal_strategy, **({"three_phase": True} if self.three_phase else {})}

    def __call__(self, step: int) -> tuple[float, float]:
        """(lr, momentum) at ``step`` (0 = the first training step), as OneCycleLR computes them."""
        anneal = _annealing_cos if self.anneal_strategy == "cos" else _annealing_linear
        phases = self._phases
        start_step = 0.0
        for i, (end_step, lr0, lr1, m0, m1) in enumerate(phases):
            if step <= end_step or i == len(phases) - 1:
                pct = (step - start_step) / (end_step - start_step)
                return anneal(lr0, lr1, pct), anneal(m0, m1, pct)
            start_step = end_step
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class DelayedDecay(OneCycle):
    """A group's own decay: the one-cycle's rise (its ``pct_start`` and ``anneal_strategy``), the peak held until
    ``decay_start`` of the pass, then ``decay_strategy`` (cos or linear) from the peak to :attr:`min_lr` at the last
    step; the momentum at ``base_momentum`` while held, annealed back to ``max_momentum`` with the LR. At
    ``decay_start = pct_start`` with the one-cycle's anneal it computes :class:`OneCycle`'s values (the same float
    operations); :func:`build_one_cycle` gives that group :class:`OneCycle` itself."""

    decay_start: float = 0.3
    decay_strategy: str = "cos"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.three_phase:
            raise ValueError("optim.schedule.groups: a group's own decay replaces the two-phase one-cycle's anneal; "
                             "not with three_phase")
        if not self.pct_start <= self.decay_start < 1.0:
            raise ValueError(f"decay_start={self.decay_start}: must be in [pct_start={self.pct_start}, 1)")
        if self.decay_strategy not in ("cos", "linear"):
            raise ValueError(f"decay_strategy={self.decay_strategy!r}: 'cos' or 'linear'")

    def describe(self) -> Dict[str, Any]:
        return {**super().describe(), "shared": False, "decay_start": self.decay_start, "shape": self.decay_strategy}

    def __call__(self, step: int) -> tuple[float, float]:
        t = self.total_steps
        up = float(self.pct_start * t) - 1  # the one-cycle's rise, step for step
        if step <= up:
            return super().__call__(step)
        held = max(up, float(self.decay_start * t) - 1)
        if step <= held:
            return self.max_lr, self.base_momentum
        anneal = _annealing_cos if self.decay_strategy == "cos" else _annealing_linear
        pct = (step - held) / (t - 1 - held)
        return anneal(self.max_lr, self.min_lr, pct), anneal(self.base_momentum, self.max_momentum, pct)


@dataclass(frozen=True)
class Constant:
    """The max LR at every step; ``momentum`` None: the scheduler leaves the group's betas alone."""

    max_lr: float

    @property
    def min_lr(self) -> float:
        return self.max_lr

    def describe(self) -> Dict[str, Any]:
        return {"schedule": "constant", "max_lr": self.max_lr}

    def __call__(self, step: int) -> tuple[float, Optional[float]]:
        return self.max_lr, None


@dataclass(frozen=True)
class RangeTest:
    """``max_lr x low`` at step 0 to ``max_lr x high`` at step ``steps - 1``, geometrically; held there after."""

    max_lr: float
    steps: int
    low: float
    high: float

    def __post_init__(self) -> None:
        check_sweep("optim.schedule.range_test", self.steps, self.low, self.high)

    @property
    def min_lr(self) -> float:
        return self.max_lr * self.low

    def describe(self) -> Dict[str, Any]:
        return {"schedule": "range_test", "max_lr": self.max_lr, "steps": self.steps, "low": self.low,
                "high": self.high}

    def multiplier(self, step: int) -> float:
        return sweep_multiplier(step, self.low, self.high, self.steps)

    def __call__(self, step: int) -> tuple[float, Optional[float]]:
        return self.max_lr * self.multiplier(step), None


def build_schedules(optim_cfg: Any, groups: Iterable[str], total_steps: int,
                    max_lrs: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
    """Each group's schedule for a plain run, from ``optim``: the one-cycle (``optim.schedule.name=one_cycle``), with
    the group's own decay where ``optim.schedule.groups`` gives one (:func:`build_one_cycle`), except the dense groups
    under Schedule-Free AdamW (:class:`Constant`); or, with ``optim.schedule.name=range_test``, :class:`RangeTest` for
    the groups it names, the others constant. ``max_lrs``: the groups whose max LR is not ``optim.lr``'s (a range
    test's or HDET's committed ones)."""
    schedule = optim_cfg.schedule
    dense_type = str(optim_cfg.dense.type)
    out: Dict[str, Any] = {}
    for g in groups:
        max_lr = float((max_lrs or {}).get(g, getattr(optim_cfg.lr, g)))
        if str(schedule.name) == "range_test":
            rt = schedule.range_test
            out[g] = (RangeTest(max_lr, int(rt.steps), float(rt.low), float(rt.high))
                      if g in list(rt.groups) else Constant(max_lr))
        elif g != "embedding" and dense_type == "schedulefree_adamw":
            out[g] = Constant(max_lr)
        else:
            out[g] = build_one_cycle(schedule, max_lr, total_steps, g)
    return out


def build_one_cycle(schedule_cfg: Any, max_lr: float, total_steps: int, group: Optional[str] = None) -> OneCycle:
    """The one-cycle of ``optim.schedule`` (the typed ``ScheduleConfig``, or a run's saved config node) at
    ``max_lr`` over ``total_steps``: the one builder every caller uses (the trainer, the LR control, studies). With
    ``group``: that group's schedule, :class:`DelayedDecay` where ``optim.schedule.groups`` gives it its own decay
    (:func:`own_decays`), else the shared :class:`OneCycle`."""
    shape = one_cycle_shape(schedule_cfg)
    own = own_decays(schedule_cfg).get(group) if group is not None else None
    if own is None:
        return OneCycle(max_lr=float(max_lr), total_steps=int(total_steps), **shape)
    return DelayedDecay(max_lr=float(max_lr), total_steps=int(total_steps), **shape, decay_start=own[0],
                        decay_strategy=own[1])


def _get(node: Any, key: str) -> Any:
    """``node[key]`` of a typed config section, an OmegaConf node or a dict; None where it has no such key."""
    return node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)


def own_decays(schedule_cfg: Any) -> Dict[str, Tuple[float, str]]:
    """{group: (decay_start, anneal_strategy)} for every group of ``optim.schedule.groups`` whose decay is not the
    shared one-cycle's: a null field reads as the one-cycle's (``pct_start``, ``anneal_strategy``), and a group whose
    settings equal those is the one-cycle. Empty when nothing is set, or ``schedule_cfg`` predates the key."""
    groups = _get(schedule_cfg, "groups")
    if not groups:
        return {}
    pct, anneal = float(_get(schedule_cfg, "pct_start")), str(_get(schedule_cfg, "anneal_strategy"))
    out: Dict[str, Tuple[float, str]] = {}
    for group in PARAM_GROUPS:
        node = _get(groups, group)
        start, strategy = (_get(node, "decay_start"), _get(node, "anneal_strategy")) if node else (None, None)
        decay = (pct if start is None else float(start), anneal if strategy is None else str(strategy))
        if decay != (pct, anneal):
            out[group] = decay
    return out


def one_cycle_shape(schedule_cfg: Any) -> Dict[str, Any]:
    """The one-cycle's shape from ``optim.schedule`` (all but the max LR and the pass length, and the groups' own
    decays), as :class:`OneCycle` and HDET's one-cycle (``hdet.scheduler.HDETOneCycleLR``) take it."""
    return dict(pct_start=float(schedule_cfg.pct_start), anneal_strategy=str(schedule_cfg.anneal_strategy),
                div_factor=float(schedule_cfg.div_factor), final_div_factor=float(schedule_cfg.final_div_factor),
                three_phase=bool(schedule_cfg.three_phase), base_momentum=float(schedule_cfg.base_momentum),
                max_momentum=float(schedule_cfg.max_momentum))


def describe_schedules(schedules: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """RunDir.SUMMARY's ``lr.schedule``: each group's schedule as the pass trained it (its ``describe()``)."""
    return {g: s.describe() for g, s in schedules.items()}


class GroupLRScheduler:
    """Writes each group's scheduled ``lr`` (and momentum) before every step.

    ``groups`` maps a group name to its param_group dicts. Call :meth:`step` after the optimizer
    step, as with any PyTorch scheduler; then push the values to the kernels (the optimizer's
    ``apply_hparams``).
    """

    def __init__(
        self,
        groups: Mapping[str, List[Dict[str, Any]]],
        schedules: Mapping[str, OneCycle],
        cycle_momentum: bool = True,
    ) -> None:
        self.groups = groups
        self.schedules = dict(schedules)
        self.cycle_momentum = cycle_momentum
        self.last_step = 0
        self.scale = {name: 1.0 for name in self.schedules}  # each schedule's multiplier after rollbacks
        self._apply()

    def _apply(self) -> None:
        for name, schedule in self.schedules.items():
            lr, momentum = schedule(self.last_step)
            for pg in self.groups.get(name, []):
                pg["lr"] = lr * self.scale[name]
                if self.cycle_momentum and momentum is not None and "betas" in pg:
                    pg["betas"] = (momentum, *pg["betas"][1:])

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def current_lrs(self) -> Dict[str, float]:
        return {name: schedule(self.last_step)[0] * self.scale[name] for name, schedule in self.schedules.items()}

    def start_at(self, step: int) -> None:
        """Continues another run's pass from ``step`` (trainer.branch_from)."""
        self.last_step = int(step)
        self._apply()

    def cut_learning_rates(self, factor: float) -> None:
        """A rollback: every group's learning rate times ``factor`` from now on."""
        self.scale = {name: s * factor for name, s in self.scale.items()}
        self._apply()

    def state_dict(self) -> Dict[str, Any]:
        return {"last_step": self.last_step, "scale": dict(self.scale)}

    def load_state_dict(self, state: Mapping[str, Any], *, apply: Optional[bool] = True) -> None:
        self.last_step = int(state["last_step"])
        self.scale.update({name: float(v) for name, v in (state.get("scale") or {}).items()})
        if apply:
            self._apply()
