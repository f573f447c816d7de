"""``HDETOneCycleLR``: a drop-in for ``torch.optim.lr_scheduler.OneCycleLR`` with HDET.

Same constructor arguments as OneCycleLR (``max_lr`` per param group, ``total_steps``,
``pct_start``, ``anneal_strategy``, ``cycle_momentum``, ``base_momentum``, ``max_momentum``,
``div_factor``, ``final_div_factor``, ``three_phase``) plus the HDET ones (:class:`HDETConfig`).
``step(loss)`` replaces ``step()``. One learning-rate hyperparameter per *named* param group
(``group["name"]``, else its index); every param_group with that name gets the same value.

- The base of each group is OneCycle's value at the step; with ``alpha = 0`` the learning rates
  equal OneCycleLR's exactly, step for step (tested).
- Momentum cycling keeps following OneCycle's schedule for the whole run, controller or not.
- ``replica_axes`` says, per group name, which ranks form one replica (default: every rank is a
  replica); an embedding group in the 2-D layout uses the sharding groups.
- ``on_change`` runs after values are written (e.g. to push them into fused kernels).
- ``extra_hparams``: other scalar hyperparameters explored in the same engine (same syncs, one
  gather of window losses for all, each with its own permutation).
- ``signal``: what this replica reports at a sync in place of its window training loss
  (:mod:`recsys_hdet.hdet.controller.signals`).
- ``hdet.space="log"``: the learning rates spread geometrically and are controlled in log space
  relative to the schedule (``ceiling_multiple`` then does not apply; ``range_decades`` does).
Any other base schedule works the same way: pass ``schedules={name: callable(step) -> lr}`` and
``floors`` instead of the OneCycle arguments.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch.distributed as dist

from recsys_hdet.components.lr_scheduler import OneCycle
from recsys_hdet.hdet.controller.config import HDETConfig
from recsys_hdet.hdet.controller.engine import HDETEngine
from recsys_hdet.hdet.hparams import ReplicaAxis, ScalarHParam
from recsys_hdet.hdet.controller.signals import ReplicaSignal


def _group_name(group: Mapping[str, Any], index: int) -> str:
    return str(group.get("name", index))


class HDETOneCycleLR:
    def __init__(
        self,
        optimizer: Any,
        max_lr: Union[float, Sequence[float], Mapping[str, float]],
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        *,
        hdet: Optional[HDETConfig] = None,  # None: the defaults (the paper's form)
        ceiling_multiple: float = 2.0,
        replica_axes: Optional[Mapping[str, ReplicaAxis]] = None,
        converge: Optional[Callable[[List[int]], None]] = None,
        state_is_finite: Callable[[], bool] = lambda: True,
        on_change: Callable[[], None] = lambda: None,
        process_group: Optional[dist.ProcessGroup] = None,
        log_prefix: str = "lr/",
        extra_hparams: Sequence[ScalarHParam] = (),
        signal: Optional[ReplicaSignal] = None,
    ) -> None:
        hdet = hdet if hdet is not None else HDETConfig()
        self.optimizer = optimizer
        self.on_change = on_change
        self.log_prefix = log_prefix
        self.cycle_momentum = cycle_momentum
        self.groups: Dict[str, List[Dict[str, Any]]] = {}
        for i, g in enumerate(optimizer.param_groups):
            self.groups.setdefault(_group_name(g, i), []).append(g)
        names = list(self.groups)
        if isinstance(max_lr, Mapping):
            max_lrs = {n: float(max_lr[n]) for n in names}
        elif isinstance(max_lr, (list, tuple)):
            if len(max_lr) != len(names):
                raise ValueError(f"max_lr has {len(max_lr)} values for {len(names)} named param groups {names}")
            max_lrs = dict(zip(names, map(float, max_lr)))
        else:
            max_lrs = {n: float(max_lr) for n in names}
        self.schedules = {
            n: OneCycle(max_lrs[n], total_steps, pct_start, anneal_strategy, div_factor, final_div_factor,
                        three_phase, base_momentum, max_momentum)
            for n in names
        }
        world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        axes = dict(replica_axes or {})
        hparams = [
            ScalarHParam(
                name=log_prefix + n,
                axis=axes.get(n, ReplicaAxis.per_rank(world)),
                schedule=lambda step, s=self.schedules[n]: s(step)[0],
                floor=self.schedules[n].min_lr,
                ceiling=ceiling_multiple * max_lrs[n],
                apply=lambda value, n=n: self._set_lr(n, value),
                space="log" if hdet.space == "log" else "multiplicative",
            )
            for n in names
        ]
        self.last_step = 0
        self._write_momentum()
        self.engine = HDETEngine([*hparams, *extra_hparams], hdet, rank, total_steps, converge or (lambda excluded: None),
                                 state_is_finite, process_group, signal)
        self.on_change()

    def _set_lr(self, name: str, value: float) -> None:
        for g in self.groups[name]:
            g["lr"] = value

    def _write_momentum(self) -> None:
        if not self.cycle_momentum:
            return
        for name, schedule in self.schedules.items():
            momentum = schedule(min(self.last_step, schedule.total_steps - 1))[1]
            for g in self.groups[name]:
                if "betas" in g:
                    g["betas"] = (momentum, *g["betas"][1:])
                elif "momentum" in g:
                    g["momentum"] = momentum

    def step(self, loss: float) -> Optional[Dict[str, Any]]:
        """After the optimizer step: records ``loss``, syncs every T steps, sets the next step's values.

        Returns the sync record (for hdet.jsonl) at a sync, else None.
        """
        self.last_step += 1
        self._write_momentum()
        record = self.engine.step(loss)
        self.on_change()
        return record

    def start_at(self, step: int) -> None:
        """Continues another run's pass from ``step`` (trainer.branch_from): the schedules' position
        and the engine's step; the first window runs from there to the next multiple of T."""
        self.last_step = int(step)
        self._write_momentum()
        self.engine.start_at(step)
        self.on_change()

    def cut_learning_rates(self, factor: float) -> None:
        """A rollback: every group's learning rate times ``factor`` from now on (the base schedule and
        the controller's base alike), and the rolled-back window's losses forgotten."""
        self.engine.discard_window()
        self.engine.scale([self.log_prefix + n for n in self.schedules], factor)
        self.on_change()

    def is_spread(self, group: str) -> bool:
        """Whether param group ``group``'s learning rate differs between its replicas."""
        return self.engine.is_spread(self.log_prefix + group)

    def replica_offsets(self) -> Dict[str, float]:
        """This rank's spread offset u in [-1, 1] per param group name, for the current window."""
        return {n: self.engine.my_offset(self.log_prefix + n) for n in self.schedules}

    def held_max_lrs(self) -> Optional[Dict[str, float]]:
        """Once explore-then-commit has committed and nothing is left to control (no replica spread, no
        hyperparameter besides the learning rates): each group's max LR as a plain one-cycle at the held
        values has it (the schedule's max LR times the rollback scale and the controlled factor). None
        until then (and always without exploration rounds)."""
        engine = self.engine
        if not engine.committed or len(engine.hparams) != len(self.schedules) or \
                any(engine.is_spread(h.name) for h in engine.hparams):
            return None
        states = {n: engine.state[self.log_prefix + n] for n in self.schedules}
        return {n: s.max_lr * states[n].scale * math.exp(states[n].log_offset) for n, s in self.schedules.items()}

    def get_last_lr(self) -> List[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> Dict[str, Any]:
        return {"last_step": self.last_step, "engine": self.engine.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.engine.load_state_dict(state["engine"])
        self._write_momentum()
        self.on_change()
