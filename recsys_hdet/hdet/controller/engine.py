"""Hyperparameter-Divergent Ensemble Training: the engine (``docs/method.md``).

The engine knows nothing of models. It sees:
- a list of :class:`ScalarHParam`: a name, the replicas it is spread over (a :class:`ReplicaAxis`),
  a base schedule ``step -> value``, bounds, and ``apply(value)`` which puts this replica's value
  where it takes effect (an optimizer's param_groups, a module attribute);
- the training loss of every step (:meth:`HDETEngine.step`);
- a ``converge(excluded_ranks)`` callback that averages the replicated state over the ranks
  not excluded (see ``recsys_hdet.components.replicas``);
- one process group over which the window losses are gathered, once per sync for all hparams.

Method: spread (each replica's value ``base * rho_pi(r)`` in linear space, ``base * (1 + alpha) ** u_pi(r)``
in log space, ``base + w u_pi(r)`` for additive hparams; one permutation per hparam redrawn at every sync
from a generator seeded identically on every rank, never the global RNG), converge every T steps, and
at each sync the controller (the paper's softmax, the scale-free scores "zscore", "rank", "regression",
the moves "effect" and "aimd": :mod:`recsys_hdet.hdet.controller.statistics`; or explore-then-commit's rounds:
:mod:`recsys_hdet.hdet.controller.rounds`), with the non-finite guard (a non-finite rank is excluded from the
average and the controller, and restored by the average). Every formula: ``docs/method.md`` ("The
engine, section by section"). Signals (what each rank reports at a sync: the window's training loss, or
a score on the same probe rows so that differences come from the parameters): :mod:`~.signals`.
Limits: in linear space values are constant within a window once the controller runs, as in the paper;
in log space they follow the schedule within the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from recsys_hdet.hdet.controller.config import FIT_SCORES, SLOPE_SCORES, HDETConfig
from recsys_hdet.hdet.hparams import ScalarHParam
from recsys_hdet.hdet.controller.rounds import best_replica, round_width, window_bounds
from recsys_hdet.hdet.controller.statistics import (additive_drift, aimd_move, decay_gamma, effect_move, joint_effects, joint_preferences,
                                        new_joint_fit, preference, replica_losses, rprop_move, spread_multipliers,
                                        spread_offsets)
from recsys_hdet.hdet.controller.signals import ReplicaSignal, WindowLoss


@dataclass
class _HParamState:
    base: float
    velocity: float = 0.0
    permutation: List[int] = field(default_factory=list)
    controlled: bool = False  # True once the controller owns the base
    log_offset: float = 0.0  # log space: ln(base / schedule)
    scale: float = 1.0  # the schedule's multiplier after rollbacks (see HDETEngine.scale)
    rprop_sign: int = 0  # score="rprop": the direction of the last move (0: none yet)
    rprop_step: float = 0.0  # score="rprop": its step in ln units (0: not started; the spread's width then)


class HDETEngine:
    """Call :meth:`step` once per training step, after the optimizer step, with that step's loss.

    ``step`` returns the sync record (product.md's hdet.jsonl object) at a sync, else None.
    """

    def __init__(self, hparams: Sequence[ScalarHParam], config: HDETConfig, rank: int, total_steps: int,
                 converge: Callable[[List[int]], None], state_is_finite: Callable[[], bool] = lambda: True,
                 group: Optional[dist.ProcessGroup] = None, signal: Optional[ReplicaSignal] = None) -> None:
        names = [h.name for h in hparams]
        if len(set(names)) != len(names):
            raise ValueError(f"hparam names must be unique: {names}")
        self.hparams, self.config, self.rank, self.total_steps = list(hparams), config, rank, total_steps
        self.converge, self.state_is_finite, self.group = converge, state_is_finite, group
        self.signal = signal if signal is not None else WindowLoss()
        self.world_size = len(self.hparams[0].axis.replica_of_rank) if self.hparams else 1
        self.widths = {h.name: config.alpha if h.spread is None else h.spread for h in self.hparams}
        # Per replica slot: its offset u in [-1, 1], and the multiplier (multiplicative, log) or
        # the additive offset (additive) that it stands for.
        self.offsets = {h.name: spread_offsets(h.axis.num_replicas) for h in self.hparams}
        self.spreads = {
            h.name: self.widths[h.name] * self.offsets[h.name] if h.space == "additive"
            else spread_multipliers(h.axis.num_replicas, self.widths[h.name], "log" if h.space == "log" else "linear")
            for h in self.hparams
        }
        self.by_name = {h.name: h for h in self.hparams}
        # A consistent signal travels travel_decades over the controlled syncs, but never over fewer
        # than the momentum's memory (1 / (1 - beta) syncs): a shorter run has not seen enough syncs for
        # its momentum to say anything consistent, and would otherwise jump up to a decade per sync
        # (measured: a 3-sync tiny run moved a base 63x in one sync and ended at NE 2.7).
        horizon = max(self.controlled_syncs(), 1.0 / (1.0 - config.beta))  # beta in [0, 1): >= 1
        self.log_step = config.log_step if config.log_step is not None else (
            config.travel_decades * math.log(10.0) / horizon)
        self.log_range = tuple(d * math.log(10.0) for d in config.range_decades)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step_count = 0
        self.loss_level = float("nan")  # the mean finite signal loss at the last sync (score="effect")
        self.window_loss_sum = 0.0
        self.window_steps = 0
        self.state: Dict[str, _HParamState] = {h.name: _HParamState(base=h.schedule(0)) for h in self.hparams}
        # Explore-then-commit: the log-space hparams spread at the start explore in rounds (_set_round_widths).
        # The learning rates (log space, spread by alpha: ``spread`` None) over more than one replica.
        self.explored = [h.name for h in self.hparams if config.explore_rounds and h.space == "log" and h.spread is None
                         and h.axis.num_replicas > 1]
        self._set_round_widths()
        # score="regression": the pooled normal equations of the joint fit (see _joint_preferences).
        self.fit = new_joint_fit(len(self.hparams))
        self.fit_was_reset = False  # hdet.fit_reset_at: the fit started over once
        self.any_excluded = False  # a rank was left out at the last sync (score aimd cuts then)
        self._draw_permutations()
        self._apply()

    # -- explore-then-commit ---------------------------------------------------------------------
    @property
    def exploration_steps(self) -> int:
        """The steps the exploration rounds take (0: no exploration)."""
        return min(self.config.explore_rounds * self.config.explore_steps, self.total_steps) if self.explored else 0

    @property
    def committed(self) -> bool:
        """Whether the exploration rounds are over (the explored hparams' spread is 0 from here on)."""
        return bool(self.explored) and self.step_count >= self.exploration_steps

    def _set_round_widths(self) -> None:
        """The explored hparams' spread for the window the next step trains in: round k's, or 0 once
        committed (a function of the step count alone, so a resumed engine sets it alike)."""
        for name in self.explored:
            width = 0.0 if self.committed else round_width(self.config, self.step_count // self.config.explore_steps)
            self.widths[name] = width
            self.spreads[name] = spread_multipliers(self.by_name[name].axis.num_replicas, width, "log")

    def _window(self) -> Tuple[int, int]:
        """(start, end) of the window the current step trains in; the sync is at its end."""
        return window_bounds(self.step_count, self.total_steps, self.config, self.exploration_steps)

    def _commit_round(self, h: ScalarHParam, s: _HParamState, losses: torch.Tensor, ok: torch.Tensor) -> Dict[str, Any]:
        """At an exploration round's end: the base moves to the value of the replica with the lowest
        signal loss (the controlled factor takes that replica's multiplier). Returns what the sync record
        says of it."""
        best = best_replica(losses, ok)
        if best is None:
            return {"best_multiplier": None}
        rho = float(self.spreads[h.name][s.permutation[best]])
        s.log_offset = min(max(s.log_offset + math.log(rho), self.log_range[0]), self.log_range[1])
        s.velocity, s.controlled = math.log(rho), True
        return {"best_multiplier": rho}

    def controlled_syncs(self) -> int:
        """Syncs whose controller update still has steps to act on: at or after controller_start,
        before the last step."""
        T, start = self.config.sync_every, self.config.controller_start
        return sum(1 for t in range(T, self.total_steps, T) if t >= start)

    # -- what each replica trains with -----------------------------------------------------------
    def is_spread(self, name: str) -> bool:
        """Whether ``name``'s replicas train with different values (a spread over several replicas)."""
        return self.widths[name] > 0 and self.by_name[name].axis.num_replicas > 1

    def signal_possible(self, h: ScalarHParam) -> bool:
        return self.config.autolr and self.is_spread(h.name)

    def values(self, name: str) -> List[float]:
        """The value of every replica of ``name`` now (replica order)."""
        h, s, spread = self.by_name[name], self.state[name], self.spreads[name]
        slots = [float(spread[s.permutation[r]]) for r in range(len(s.permutation))]
        if h.space != "additive":
            return [s.base * rho for rho in slots]
        return [min(max(s.base + offset, h.floor), h.ceiling) for offset in slots]

    def my_value(self, h: ScalarHParam) -> float:
        return self.values(h.name)[h.axis.replica_of_rank[self.rank]]

    def my_offset(self, name: str) -> float:
        """This rank's replica's spread offset u in [-1, 1] for ``name`` in the current window (its value
        is ``base * (1 + alpha) ** u`` in log space): what a signal that probes along a direction
        scaled by the replica's offset needs (:class:`~recsys_hdet.hdet.controller.signals.DiscountedCredit`)."""
        h = self.by_name[name]
        return float(self.offsets[name][self.state[name].permutation[h.axis.replica_of_rank[self.rank]]])

    def _draw_permutations(self) -> None:
        # Fixed order of draws from a generator seeded the same everywhere: identical on all ranks.
        for h in self.hparams:
            self.state[h.name].permutation = torch.randperm(h.axis.num_replicas, generator=self.generator).tolist()

    def _schedule_now(self, h: ScalarHParam) -> float:
        return h.schedule(min(self.step_count, self.total_steps - 1)) * self.state[h.name].scale

    def scale(self, names: Sequence[str], factor: float) -> None:
        """Multiplies the named hparams' values by ``factor`` from now on (the trainer's rollback cuts
        the learning rates so): the schedule they follow, and a controlled linear base. Multiplicative
        and log-space hparams only."""
        for name in names:
            h, s = self.by_name[name], self.state[name]
            if h.space == "additive":
                raise ValueError(f"hparam {name}: an additive hparam cannot be scaled")
            s.scale *= factor
            if s.controlled and h.space != "log":
                s.base = min(max(s.base * factor, h.floor), h.ceiling)
        self._apply()

    def start_at(self, step: int) -> None:
        """Takes over a pass at ``step`` (after ``step`` steps trained elsewhere): values from there on."""
        self.step_count = int(step)
        self.discard_window()
        self._set_round_widths()
        self._apply()

    def discard_window(self) -> None:
        """Forgets the current window's training losses (a rolled-back window's are not the replicas')."""
        self.window_loss_sum, self.window_steps = 0.0, 0

    def _apply(self) -> None:
        for h in self.hparams:
            s = self.state[h.name]
            if h.space == "log":
                # The schedule's shape, times the controlled factor (1 until the controller moves it).
                s.base = self._schedule_now(h) * math.exp(s.log_offset)
            elif not s.controlled:
                s.base = self._schedule_now(h)
            h.apply(self.my_value(h))

    # -- the training-loop hook -------------------------------------------------------------------
    def step(self, loss: float) -> Optional[Dict[str, Any]]:
        self.step_count += 1
        self.window_loss_sum += float(loss)
        self.window_steps += 1
        window_start, window_end = self._window()
        self.signal.after_step(self.step_count - window_start, window_end - window_start)
        record = None
        if self.step_count == window_end:
            record = self._sync()
            self._set_round_widths()
        self._apply()
        return record

    def _sync(self) -> Dict[str, Any]:
        # 1. One gather of every rank's signal (window training loss, or a loss measured now, before
        #    averaging), its window training loss, and whether its state is finite.
        train_window = self.window_loss_sum / max(self.window_steps, 1)
        signal = self.signal.measure(train_window)
        mine = torch.tensor([signal, 1.0 if self.state_is_finite() else 0.0, train_window], dtype=torch.float64)
        gathered = [mine]
        if self.world_size > 1:
            gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
            dist.all_gather(gathered, mine, group=self.group)
        table = torch.stack(gathered)
        rank_loss = table[:, 0]
        rank_ok = torch.isfinite(rank_loss) & (table[:, 1] > 0)
        excluded_ranks = [r for r in range(self.world_size) if not bool(rank_ok[r])]
        # 2. Converge over the healthy ranks; an excluded rank is restored from their average.
        #    With none healthy there is nothing to restore from: the record says so (every rank
        #    excluded) and the caller stops the run as diverged.
        if len(excluded_ranks) == self.world_size:
            return {"step": self.step_count, "losses": [None] * self.world_size, "hparams": {},
                    "excluded": excluded_ranks}
        self.converge(excluded_ranks)
        # 3. Controller per hparam, then fresh permutations.
        syncs_left = max(math.ceil((self.total_steps - self.step_count) / self.config.sync_every), 0)
        finite_or_none = lambda xs: [float(x) if math.isfinite(x) else None for x in xs]
        # "losses" are per rank (the finest replicas): what the controller scored; null if non-finite.
        record: Dict[str, Any] = {"step": self.step_count, "losses": finite_or_none(rank_loss.tolist()),
                                  "hparams": {}, "excluded": excluded_ranks}
        if type(self.signal) is not WindowLoss:
            record["train_losses"] = finite_or_none(table[:, 2].tolist())
        if self.config.fit_reset_at is not None and not self.fit_was_reset and \
                self.step_count >= self.config.fit_reset_at * self.total_steps:
            self.fit, self.fit_was_reset = new_joint_fit(len(self.hparams)), True  # the pooled fit starts over
        joint = self._joint_preferences(rank_loss, rank_ok) if self.config.score in FIT_SCORES \
            else {}
        self.any_excluded = bool(excluded_ranks)
        finite_losses = rank_loss[torch.isfinite(rank_loss) & rank_ok]
        self.loss_level = float(finite_losses.abs().mean()) if len(finite_losses) else float("nan")
        exploring = self.step_count <= self.exploration_steps
        for h in self.hparams:
            losses, ok = replica_losses(h.axis.replica_of_rank, h.axis.num_replicas, rank_loss, rank_ok)
            values = self.values(h.name)
            s = self.state[h.name]
            window_base = s.base
            explored = {}
            if h.name in self.explored:
                if exploring:  # a round's end; after the last round the explored hparams are never moved
                    explored = {"explore_round": (self.step_count - 1) // self.config.explore_steps,
                                **self._commit_round(h, s, losses, ok)}
            elif self.signal_possible(h) and self.step_count >= self.config.controller_start:
                s.controlled = True
                self._control(h, s, losses, ok, values, syncs_left, joint.get(h.name))
            elif h.space != "log":
                s.base = self._schedule_now(h)
            # base and values: what the window just scored trained with (its last step);
            # next_base: the base from here on (the controller's update, or the schedule).
            entry = {"base": window_base, "values": values, "velocity": s.velocity, "next_base": s.base}
            if h.space == "log":
                entry["next_base"] = self._schedule_now(h) * math.exp(s.log_offset)
                entry["log_offset"] = s.log_offset
            record["hparams"][h.name] = {**entry, **explored}
        self._draw_permutations()
        self.window_loss_sum, self.window_steps = 0.0, 0
        return record

    def _joint_preferences(self, rank_loss: torch.Tensor, rank_ok: torch.Tensor) -> Dict[str, float]:
        """score="regression": for every hparam with a signal, the partial correlation of -loss with its
        offset, from ONE least-squares fit of the ranks' losses on all hparams' offsets at once
        (:func:`joint_preferences`), pooled over syncs in ``self.fit``."""
        names = [h.name for h in self.hparams]
        usable = [i for i, h in enumerate(self.hparams) if self.signal_possible(h)]
        # Each rank's offset for each hparam: the offset of the replica it belongs to this window.
        X = torch.stack([self.offsets[h.name][torch.tensor(self.state[h.name].permutation)]
                         [torch.tensor(h.axis.replica_of_rank)] for h in self.hparams], dim=1)
        if self.config.score in SLOPE_SCORES:
            effects = joint_effects(self.fit, X, rank_loss, rank_ok, usable, self.config.beta, self.config.fit_weighting)
            return {names[i]: e for i, e in effects.items()}
        prefs = joint_preferences(self.fit, X, rank_loss, rank_ok, usable, self.config.beta, self.config.fit_weighting)
        return {names[i]: g for i, g in prefs.items()}

    def _control(self, h, s: _HParamState, losses, ok, values, syncs_left: int,
                 joint: Optional[float] = None) -> None:
        cfg = self.config
        u = self.offsets[h.name][torch.tensor(s.permutation)]  # each replica's offset this window
        if cfg.score in SLOPE_SCORES:  # moves by the pooled fit's slope
            s.velocity = self._fit_move(h, s, joint)
            s.log_offset = min(max(s.log_offset + s.velocity, self.log_range[0]), self.log_range[1])
            return
        g = joint if cfg.score == "regression" else preference(losses, ok, u, cfg.score, cfg.sigma)
        if g is None:
            g = 0.0
        if h.space == "log":
            # Momentum and step in log units: the same relative move anywhere on the schedule; the
            # regression score is pooled over syncs already, so its signal is the velocity.
            s.velocity = g if cfg.score == "regression" else cfg.beta * s.velocity + (1 - cfg.beta) * g
            s.log_offset = min(max(s.log_offset + self.log_step * s.velocity, self.log_range[0]), self.log_range[1])
            return
        if cfg.score == "softmax":  # the paper's Delta, on the values the replicas trained with
            v = torch.tensor(values, dtype=torch.float64)[ok]
            L = losses[ok]
            delta = float((torch.softmax((L.mean() - L) / cfg.sigma, dim=0) * v).sum() - v.mean()) if len(L) >= 2 else 0.0
        else:  # g in offset units, back to value units
            delta = g * self.widths[h.name] * (s.base if h.space == "multiplicative" else 1.0)
        s.velocity = cfg.beta * s.velocity + (1 - cfg.beta) * delta
        if h.space == "multiplicative":
            decayed = s.base * (1 - decay_gamma(h.schedule, self.config, self.step_count, self.total_steps, h.floor,
                                                s.base, syncs_left))
        else:
            decayed = s.base + additive_drift(h.schedule, self.config, self.step_count, self.total_steps, h.floor,
                                              s.base, syncs_left)
        s.base = min(max(decayed + cfg.lam * s.velocity, h.floor), h.ceiling)

    def _fit_move(self, h: ScalarHParam, s: _HParamState, effect: Optional[Tuple[float, float, float]]) -> float:
        """This sync's move of ln(base / schedule) by the pooled fit's ``(slope, se, dof)``
        (:func:`effect_move`, :func:`aimd_move`, :func:`rprop_move`). The effect score's trust region is by
        default the spread itself, ln(1 + alpha): no further than the replicas measured; Rprop's first step too."""
        cfg, width = self.config, math.log(1.0 + self.widths[h.name])
        if cfg.score == "aimd":
            return aimd_move(effect, self.any_excluded, cfg.min_t, cfg.aimd_up, cfg.aimd_down)
        if cfg.score == "rprop":
            move, s.rprop_sign, s.rprop_step = rprop_move(effect, s.rprop_sign, s.rprop_step or width, cfg.rprop_up,
                                                          cfg.rprop_down, cfg.rprop_max_step)
            return move
        if effect is None:
            return 0.0
        trust = width if cfg.trust_region is None else cfg.trust_region
        return effect_move(effect, width, self.loss_level, cfg.effect_scale, cfg.min_t, trust)

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "step_count": self.step_count,
            "window_loss_sum": self.window_loss_sum,
            "window_steps": self.window_steps,
            "generator": self.generator.get_state(),
            "fit": {"xx": self.fit["xx"].tolist(), "xy": self.fit["xy"].tolist(), "yy": self.fit["yy"],
                    "dof": self.fit["dof"]},
            "fit_was_reset": self.fit_was_reset,
            "hparams": {
                n: {"base": s.base, "velocity": s.velocity, "permutation": list(s.permutation),
                    "controlled": s.controlled, "log_offset": s.log_offset, "scale": s.scale,
                    "rprop_sign": s.rprop_sign, "rprop_step": s.rprop_step}
                for n, s in self.state.items()
            },
            "signal": self.signal.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self.window_loss_sum = float(state["window_loss_sum"])
        self.window_steps = int(state["window_steps"])
        self.generator.set_state(state["generator"])
        if "fit" in state:  # absent in checkpoints from before score="regression"
            fit = state["fit"]
            self.fit = {"xx": torch.tensor(fit["xx"], dtype=torch.float64).reshape(self.fit["xx"].shape),
                        "xy": torch.tensor(fit["xy"], dtype=torch.float64), "yy": float(fit["yy"]),
                        "dof": float(fit["dof"])}
        self.fit_was_reset = bool(state.get("fit_was_reset", False))
        self.signal.load_state_dict(state.get("signal") or {})  # absent before signals had state
        for n, s in state["hparams"].items():
            self.state[n] = _HParamState(float(s["base"]), float(s["velocity"]), list(s["permutation"]),
                                         bool(s["controlled"]), float(s.get("log_offset", 0.0)),
                                         float(s.get("scale", 1.0)), int(s.get("rprop_sign", 0)),
                                         float(s.get("rprop_step", 0.0)))
        self._set_round_widths()
        self._apply()
