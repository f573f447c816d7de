"""The ``optim`` config group's schema (conf/optim/): each parameter group's peak learning rate, the dense and the
embedding optimizers, the schedule (one-cycle, each group's own decay where ``optim.schedule.groups`` gives one, or
the plain LR range test). Registered through
:class:`recsys_hdet.config_schema.TrainConfig`; its checks run in each class's ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from recsys_hdet.config_values import (CUDA_ONLY_EMBEDDING_OPTIMIZERS, AnnealStrategy, DenseOptimizer, EmbeddingOptimizer, Schedule, at_least, fraction, is_number, positive, require)
from recsys_hdet.components.lr_scheduler import own_decays
from recsys_hdet.constants import DENSE_GROUPS, PARAM_GROUPS


@dataclass
class LearningRates:
    """Peak (max) learning rate per parameter group: the schedule starts at max / div_factor, rises to max over
    pct_start of the pass, then anneals to max / div_factor / final_div_factor."""
    embedding: float = 0.05
    transformer: float = 0.002
    non_embedding: float = 0.002
    no_decay: float = 0.002

    def __post_init__(self) -> None:
        for group, lr in vars(self).items():
            positive(f"optim.lr.{group}", lr)

    def __getitem__(self, group: str) -> float:
        """``optim.lr[group]``: a group's max LR by name (as the saved config's node reads it)."""
        return getattr(self, group)


@dataclass
class DenseOptimizerConfig:
    """The optimizer of the dense groups (transformer, non_embedding, no_decay)."""
    # adam | adamw | prodigy (the groups' LRs are then multipliers of its estimated step size: 1.0) |
    # schedulefree_adamw (the dense groups train at their max LR, no decay schedule, with the optimizer's own
    # warm-up; plain runs only)
    type: DenseOptimizer = DenseOptimizer.adam
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1.0e-8
    weight_decay: float = 0.0            # never applied to the no_decay group
    fused: bool = True                   # torch's fused Adam kernel (CPU and CUDA); false: the per-tensor loop
                                         # (adam, adamw)
    d0: float = 1.0e-6                   # prodigy: the initial step-size estimate (its default)
    warmup_steps: Optional[int] = None   # schedulefree_adamw: its own warm-up in steps; null: the schedule's rise

    def __post_init__(self) -> None:
        require(len(self.betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in self.betas), "optim.dense.betas",
                self.betas, "must be [beta1, beta2], each in [0, 1)")
        positive("optim.dense.eps", self.eps)
        require(is_number(self.weight_decay) and self.weight_decay >= 0, "optim.dense.weight_decay",
                self.weight_decay, "must be a finite number >= 0")
        if self.type == DenseOptimizer.prodigy:
            positive("optim.dense.d0", self.d0)
        if self.warmup_steps is not None:
            at_least("optim.dense.warmup_steps", self.warmup_steps, 0)


@dataclass
class RangeTestConfig:
    """``optim.schedule.name=range_test``: the LR from max x ``low`` to max x ``high``, geometrically, over ``steps``
    steps, for ``groups`` (the others constant at their max LR); seven decades by default, so that fastai's
    suggestion (smoothed minimum / 10) can reach x1000 (:mod:`recsys_hdet.lr_find`)."""
    steps: int = 100
    low: float = 0.001
    high: float = 10000.0
    groups: List[str] = field(default_factory=lambda: ["embedding", "transformer", "non_embedding", "no_decay"])

    def __post_init__(self) -> None:
        at_least("optim.schedule.range_test.steps", self.steps, 2)
        positive("optim.schedule.range_test.low", self.low)
        require(is_number(self.high) and self.high > self.low, "optim.schedule.range_test.high", self.high,
                f"must be a number above optim.schedule.range_test.low={self.low}")
        groups = ("embedding", "transformer", "non_embedding", "no_decay")
        require(bool(self.groups) and all(g in groups for g in self.groups), "optim.schedule.range_test.groups",
                list(self.groups), "a non-empty list of " + ", ".join(groups))


@dataclass
class EmbeddingOptimizerConfig:
    """The embedding group's TorchRec fused optimizer (updates inside backward)."""
    type: EmbeddingOptimizer = EmbeddingOptimizer.rowwise_adagrad   # CPU fbgemm kernels: rowwise_adagrad | adagrad |
                                                                    # sgd; CUDA adds adam
    eps: float = 1.0e-8

    def __post_init__(self) -> None:
        positive("optim.embedding.eps", self.eps)
        if self.type in CUDA_ONLY_EMBEDDING_OPTIMIZERS:
            import torch

            require(torch.cuda.is_available(), "optim.embedding.type", str(self.type),
                    f"fbgemm's CPU kernels have no fused {self.type} and this machine has no CUDA device: choose "
                    "one of " + ", ".join(repr(str(k)) for k in EmbeddingOptimizer
                                          if k not in CUDA_ONLY_EMBEDDING_OPTIMIZERS))


@dataclass
class GroupDecay:
    """One parameter group's own decay (``optim.schedule.groups.<group>``); a null field is the shared one-cycle's.
    The rise stays the shared one-cycle's (``pct_start``, ``anneal_strategy``, ``div_factor``); the group then holds
    its peak until ``decay_start`` and anneals to the shared floor (max / div_factor / final_div_factor) by the
    pass's end. A warm-stable-decay (WSD) tail is a late ``decay_start`` (e.g. 0.8 with ``linear``)."""
    # the fraction of the pass where the group's anneal starts, in [pct_start, 1); null: pct_start (the one-cycle)
    decay_start: Optional[float] = None
    # cos | linear: the anneal's shape from decay_start to the end; null: optim.schedule.anneal_strategy
    anneal_strategy: Optional[AnnealStrategy] = None

    def setting(self) -> dict:
        """What is set, as plain values (an error message's)."""
        return {k: v if k == "decay_start" else str(v)
                for k, v in (("decay_start", self.decay_start), ("anneal_strategy", self.anneal_strategy)) if v is not None}


@dataclass
class GroupSchedules:
    """``optim.schedule.groups``: a group's own decay (:class:`GroupDecay`); the groups left unset (null fields) train on
    the shared one-cycle, bit for bit. Plain runs and ``hdet=enabled`` (whose committed max LRs are the peaks)."""
    embedding: GroupDecay = field(default_factory=GroupDecay)
    transformer: GroupDecay = field(default_factory=GroupDecay)
    non_embedding: GroupDecay = field(default_factory=GroupDecay)
    no_decay: GroupDecay = field(default_factory=GroupDecay)

    def __getitem__(self, group: str) -> GroupDecay:
        return getattr(self, group)


@dataclass
class ScheduleConfig:
    # one_cycle: torch.optim.lr_scheduler.OneCycleLR, per group; range_test: the LR range test (plain runs; end it
    # with trainer.stop_at_step; see range_test)
    name: Schedule = Schedule.one_cycle
    pct_start: float = 0.3
    anneal_strategy: AnnealStrategy = AnnealStrategy.cos
    div_factor: float = 25.0
    final_div_factor: float = 10000.0
    three_phase: bool = False
    cycle_momentum: bool = True          # cycles Adam's beta1 between base_momentum and max_momentum
    base_momentum: float = 0.85
    max_momentum: float = 0.95
    range_test: RangeTestConfig = field(default_factory=RangeTestConfig)
    # a group's own decay (decay_start, anneal_strategy), e.g. {embedding: {decay_start: 0.7}}; unset: the one-cycle
    groups: GroupSchedules = field(default_factory=GroupSchedules)

    def __post_init__(self) -> None:
        fraction("optim.schedule.pct_start", self.pct_start, low_open=True)
        positive("optim.schedule.div_factor", self.div_factor)
        positive("optim.schedule.final_div_factor", self.final_div_factor)
        for g in PARAM_GROUPS:
            start = self.groups[g].decay_start
            if start is not None:
                require(is_number(start) and self.pct_start <= start < 1, f"optim.schedule.groups.{g}.decay_start",
                        start, f"must be a fraction of the pass in [optim.schedule.pct_start={self.pct_start}, 1): the "
                        "rise is shared, the anneal starts at its peak or later")
        own = own_decays(self)
        if own:
            first = next(iter(own))
            key, value = f"optim.schedule.groups.{first}", self.groups[first].setting()
            require(self.name == Schedule.one_cycle, key, value, f"a group's own decay shapes the one-cycle; "
                    f"optim.schedule.name={self.name} would not read it: leave optim.schedule.groups unset")
            require(not self.three_phase, key, value, "a group's own decay replaces the two-phase one-cycle's anneal; "
                    "not with optim.schedule.three_phase=true")


@dataclass
class OptimConfig:
    lr: LearningRates = field(default_factory=LearningRates)
    dense: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    embedding: EmbeddingOptimizerConfig = field(default_factory=EmbeddingOptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        if self.dense.type == DenseOptimizer.schedulefree_adamw:
            dense = [g for g in own_decays(self.schedule) if g in DENSE_GROUPS]
            first = dense[0] if dense else ""
            require(not dense, f"optim.schedule.groups.{first}", self.schedule.groups[first].setting() if dense else None,
                    "Schedule-Free AdamW trains the dense groups at a constant LR with no decay to shape: a dense "
                    "group's own decay is not read (the embedding group's is)")
