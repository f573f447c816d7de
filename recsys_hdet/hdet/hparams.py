"""What the HDET engine explores: a :class:`ScalarHParam` (a name, the replicas it is spread over, its
base schedule, bounds and the function that puts a replica's value where it takes effect) and the
:class:`ReplicaAxis` that says which replica each rank belongs to. The engine knows a hyperparameter
only through these: an optimizer's LR group, a module attribute and a loss setting are all the same to
it (:mod:`recsys_hdet.hdet.controller.explored` builds the job's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class ReplicaAxis:
    """Which replica each world rank belongs to, for one hparam (e.g. ranks, or sharding groups)."""

    replica_of_rank: tuple  # length world_size; values in [0, num_replicas)

    @property
    def num_replicas(self) -> int:
        return max(self.replica_of_rank) + 1

    @classmethod
    def per_rank(cls, world_size: int) -> "ReplicaAxis":
        return cls(tuple(range(world_size)))

    @classmethod
    def per_block(cls, world_size: int, block: int) -> "ReplicaAxis":
        """Contiguous blocks of ``block`` ranks form one replica (the sharding groups)."""
        return cls(tuple(r // block for r in range(world_size)))


@dataclass
class ScalarHParam:
    name: str
    axis: ReplicaAxis
    schedule: Callable[[int], float]  # the base value at a step (0-based)
    floor: float  # lower bound of the controlled base; the schedule's end
    ceiling: float  # upper bound of the controlled base
    apply: Callable[[float], None]  # puts this replica's value where it takes effect
    # How values spread around the base: "multiplicative" (value = base * (1 + alpha u), the
    # paper's linear form, for scale-like values: LR, weight decay, temperature), "log" (value =
    # base * (1 + alpha) ** u, controlled in log space relative to the schedule; floor and ceiling
    # are then unused: the config's range_decades bounds it) or "additive" (value = base + offset,
    # clamped to [floor, ceiling], for bounded values: dropout, label smoothing).
    space: str = "multiplicative"
    # Half-width of the spread: alpha for multiplicative (None: the config's alpha), the largest
    # offset for additive (required there).
    spread: Optional[float] = None

    def __post_init__(self) -> None:
        if self.space not in ("multiplicative", "log", "additive"):
            raise ValueError(f"hparam {self.name}: space={self.space!r}: 'multiplicative', 'log' or 'additive'")
        if self.space == "additive" and self.spread is None:
            raise ValueError(f"hparam {self.name}: an additive hparam needs its spread (largest offset)")
        if self.spread is not None and (self.spread < 0 or not math.isfinite(self.spread)):
            raise ValueError(f"hparam {self.name}: spread={self.spread}: must be a finite number >= 0")
        if not self.floor <= self.ceiling:
            raise ValueError(f"hparam {self.name}: floor {self.floor} above ceiling {self.ceiling}")
