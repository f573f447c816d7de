"""What each replica reports at a sync: the signal the controller compares (lower is better).

The engine (:class:`recsys_hdet.hdet.controller.engine.HDETEngine`) calls a signal twice: :meth:`after_step`
after every optimizer step (with the step's place in the window) and :meth:`measure` at the sync,
before the replicas are averaged. A signal knows nothing of models: it reaches the replica through
the callables it is built with (score the probe rows, copy the state, take one training step),
which the job provides (``recsys_hdet.hdet.controller.integration``) and a test can provide for a toy
objective.

Why more than the last iterate (docs/method.md, "what the controller must overcome"):
scored right after a window, a replica with a higher learning rate carries more of the gradient
noise in its weights (its oscillation across the valley), so a lower LR looks better over one
window even where a higher one ends the pass better (short-horizon bias; Wu et al. 2018). Two
ways to take the oscillation out before comparing, both measured on the harness's scorecard
(docs/results/lr_truth/lr_truth.md):

- :class:`AveragedIterateProbe`: the replica is scored at the average of its iterates over the
  last part of the window (iterate averaging stands in for the LR decay: Sandler et al. 2023);
- :class:`AnnealThenProbe`: the replica copies its state, takes a few steps with its learning
  rates falling linearly to zero, is scored, and is put back bit for bit (a short cooldown makes
  intermediate checkpoints comparable: Hägele et al. 2024). It costs ``steps`` extra training
  steps and one copy of the replica's state per sync.

A third way compares what a learning rate left behind over several windows instead of one:
:class:`DiscountedCredit` scores every replica near the replicas' averaged iterate, moved along each
group's discounted sum of past displacements by the replica's own spread offset, so that the
engine's fit reads MARTHE's hypergradient per group (Donini et al. 2020). It needs the replicas'
average (a collective) and the replica's offsets, which the job provides.

The baselines: :class:`WindowLoss` (the window's mean training or serving loss, the paper's) and
:class:`LastIterateProbe` (the probe rows scored at the last iterate).
"""

from __future__ import annotations

import io
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence

import torch

from recsys_hdet.components.train_state import RNGState, Snapshot
from recsys_hdet.hdet.controller.config import HDETSignal


class ReplicaSignal(Protocol):
    """This replica's loss signal at a sync (the engine gathers it from every rank)."""

    def after_step(self, position: int, window_length: int) -> None:
        """After the ``position``-th optimizer step (1-based) of a window of ``window_length`` steps."""

    def measure(self, window_loss: float) -> float:
        """At the sync, before averaging; ``window_loss``: the window's mean training loss."""

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class WindowLoss:
    """The window's mean training loss (or whatever loss the loop passes to the engine's step)."""

    def after_step(self, position: int, window_length: int) -> None:
        pass

    def measure(self, window_loss: float) -> float:
        return float(window_loss)

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class LastIterateProbe(WindowLoss):
    """``probe()``: the replica's loss on the probe rows, as it is at the sync."""

    def __init__(self, probe: Callable[[], float]) -> None:
        self.probe = probe

    def measure(self, window_loss: float) -> float:
        return float(self.probe())


class TailAverage:
    """The running average (float64) of live ``tensors`` over the last ``fraction`` of each window's
    steps: ``average`` is None before the window's first averaged step. Part of a signal's state (a
    checkpoint inside a window resumes it exactly). One copy of ``tensors``; one in-place update of
    it per step in the averaged part of the window."""

    def __init__(self, tensors: Sequence[torch.Tensor], fraction: float) -> None:
        self.tensors = list(tensors)
        self.fraction = float(fraction)
        self.average: Optional[List[torch.Tensor]] = None
        self.count = 0

    @torch.no_grad()
    def after_step(self, position: int, window_length: int) -> None:
        first = window_length - max(1, round(self.fraction * window_length)) + 1  # first averaged step
        if position < first:
            return
        if self.average is None or position == first:
            self.average = [t.detach().to(torch.float64, copy=True) for t in self.tensors]
            self.count = 1
            return
        self.count += 1
        for a, t in zip(self.average, self.tensors):
            a.add_(t.detach().to(torch.float64) - a, alpha=1.0 / self.count)

    def reset(self) -> None:
        self.average, self.count = None, 0

    def state_dict(self) -> Dict[str, Any]:
        buf = io.BytesIO()
        torch.save(self.average, buf)
        return {"count": self.count, "average": buf.getvalue()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = int(state.get("count", 0))
        self.average = torch.load(io.BytesIO(state["average"]), weights_only=True) if "average" in state else None


class AveragedIterateProbe(WindowLoss):
    """``probe()`` at the average of ``tensors`` over the last ``fraction`` of the window's steps.

    ``tensors``: live views of the replica's state to average (the dense parameters; the embedding
    rows too if listed). At the sync they are swapped with their average (:class:`TailAverage`),
    probed and swapped back, so training goes on from the last iterate as before.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], probe: Callable[[], float], fraction: float = 0.5) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"hdet.averaged_probe.fraction={fraction}: must be in (0, 1]")
        self.tensors = list(tensors)
        self.probe = probe
        self.tail = TailAverage(self.tensors, fraction)

    def after_step(self, position: int, window_length: int) -> None:
        self.tail.after_step(position, window_length)

    @torch.no_grad()
    def measure(self, window_loss: float) -> float:
        if self.tail.average is None:  # a window shorter than one averaged step: the last iterate
            return float(self.probe())
        last = [t.detach().clone() for t in self.tensors]
        try:
            for t, a in zip(self.tensors, self.tail.average):
                t.copy_(a)
            return float(self.probe())
        finally:
            for t, saved in zip(self.tensors, last):
                t.copy_(saved)
            self.tail.reset()

    def state_dict(self) -> Dict[str, Any]:
        return self.tail.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tail.load_state_dict(state)


class AnnealThenProbe(WindowLoss):
    """Copies the replica's state, takes ``steps`` training steps with the learning rates scaled by
    ``(steps - i) / (steps + 1)`` (step i = 0..steps-1: linearly towards zero), probes, and puts the
    state and the random generators back.

    ``state``: the replica's state as views of the live storage (``state_dict()`` /
    ``load_state_dict()``: :class:`recsys_hdet.components.train_state.ModelState`: weights,
    embedding and dense optimizer state); ``cooldown_step(lr_scale, i)``: one training step on the
    i-th cooldown batch with every learning rate times ``lr_scale`` (it sets and restores them).
    Restoring is exact: the copy is bitwise and the generators' states are put back, so training
    after the sync is what it would have been without the measurement.
    """

    def __init__(self, state: Any, cooldown_step: Callable[[float, int], None], probe: Callable[[], float],
                 steps: int) -> None:
        if steps < 1:
            raise ValueError(f"hdet.anneal_probe.steps={steps}: must be an integer >= 1")
        self.state = state
        self.cooldown_step = cooldown_step
        self.probe = probe
        self.steps = int(steps)

    def measure(self, window_loss: float) -> float:
        saved = Snapshot(self.state, RNGState())
        try:
            for i in range(self.steps):
                self.cooldown_step((self.steps - i) / (self.steps + 1), i)
            return float(self.probe())
        finally:
            saved.restore()


class DiscountedCredit(WindowLoss):
    """MARTHE's discounted hypergradient (Donini et al. 2020, arXiv 1910.08525), measured with the
    replicas' spread instead of a backward pass: the replica is scored at ``P + width * sum_G u_G Z_G``.

    Per learning-rate group G (``groups[G]``: the tensors that G's learning rate moves), at each sync:

    - ``P``: the window's point, the replicas' average of their iterates averaged over the last
      ``fraction`` of the window (``average(G, tensors)`` writes the replicas' average in place, a
      collective, and says whether this replica's own tensors were finite);
    - the tangent ``Z_G <- mu Z_G + (P - previous P)``: d(weights) / d(ln lr_G) accumulated over past
      windows with discount ``mu``. An update is proportional to its learning rate, so one window's
      derivative is its displacement; MARTHE's Jacobian of the dynamics is taken as the identity.
      The first window's displacement starts from the replicas' average after its first step;
    - the replica is scored at ``P + width * sum_G u_G Z_G``, ``u_G`` its spread offset in [-1, 1]
      this window (``offsets()``) and ``width`` the log-spread ln(1 + alpha), then its own weights are
      put back bit for bit.

    The engine's joint fit of the ranks' losses on their offsets then reads, per group, the slope
    ``width * g . Z_G`` (g: the probe loss's gradient at P): the loss change per ln lr_G had G's
    learning rate been higher over the discounted past, the hypergradient. ``mu = 0`` with
    ``fraction`` one step is one window's last-iterate displacement: the greedy hypergradient
    (Baydin et al. 2018). Why it can see what the last-iterate probe cannot (docs/method.md): every
    replica is scored near the same model on the same rows, so a replica's own gradient noise does
    not count against its learning rate; across windows the oscillation in a steep direction cancels
    in the sum of displacements while progress along a flat one accumulates (``mu``); and the iterate
    average takes most of the oscillation out of P, where the gradient is read (at the last iterate
    the gradient's steep part correlates with the last displacement: a bias toward lower rates).

    Cost per sync: one extra average of the groups' tensors and one probe; memory: four copies of
    them (the running iterate average in float64, the previous P, the tangent, own weights while
    probing). Limits: ignores how a change early in the horizon changes later gradients (the
    identity Jacobian); a rollback's jump counts as a displacement. The running average, previous P
    and tangent are state (a checkpoint resumes them).
    """

    def __init__(self, groups: Mapping[str, Sequence[torch.Tensor]], average: Callable[[str, List[torch.Tensor]], bool],
                 offsets: Callable[[], Mapping[str, float]], probe: Callable[[], float], mu: float, width: float,
                 fraction: float = 0.5) -> None:
        if not 0 <= mu < 1:
            raise ValueError(f"hdet.discounted_credit.mu={mu}: must be in [0, 1)")
        if not 0 < fraction <= 1:
            raise ValueError(f"hdet.discounted_credit.fraction={fraction}: must be in (0, 1]")
        self.groups = {g: list(ts) for g, ts in groups.items()}
        self.average = average
        self.offsets = offsets
        self.probe = probe
        self.mu, self.width = float(mu), float(width)
        self.tail = TailAverage([t for ts in self.groups.values() for t in ts], fraction)  # the groups' in order
        self.previous: Optional[Dict[str, List[torch.Tensor]]] = None  # the previous window's P
        self.previous_is_own = False  # taken after the first step, before any average: averaged at the sync
        self.tangent: Optional[Dict[str, List[torch.Tensor]]] = None

    @torch.no_grad()
    def after_step(self, position: int, window_length: int) -> None:
        if self.previous is None and position == 1:
            self.previous = {g: [t.detach().clone() for t in ts] for g, ts in self.groups.items()}
            self.previous_is_own = True
        self.tail.after_step(position, window_length)

    @torch.no_grad()
    def measure(self, window_loss: float) -> float:
        offsets = self.offsets()
        own = {g: [t.detach().clone() for t in ts] for g, ts in self.groups.items()}
        finite, averaged = True, True
        iterates = iter(self.tail.average or [])  # the groups' tensors in order; none: the last iterate
        try:
            for g, ts in self.groups.items():  # the same order on every rank: collectives
                for t, a in zip(ts, iterates):
                    t.copy_(a)
                try:
                    finite &= self.average(g, ts)
                    if self.previous is not None and self.previous_is_own:
                        self.average(g, self.previous[g])
                except FloatingPointError:  # no finite replica: nothing to measure from
                    finite = averaged = False
            if averaged:
                self._advance()
                for g, ts in self.groups.items():
                    u = float(offsets.get(g, 0.0))
                    for t, z in zip(ts, self.tangent[g] if u else []):
                        t.add_(z, alpha=self.width * u)
            loss = float(self.probe())  # scored even when non-finite: a sharded forward is collective
        finally:
            for g, ts in self.groups.items():
                for t, saved in zip(ts, own[g]):
                    t.copy_(saved)
            self.tail.reset()
        return loss if finite else float("inf")

    def _advance(self) -> None:
        """Z <- mu Z + (P - previous P); previous P <- P (the groups' tensors hold P now)."""
        current = {g: [t.detach().clone() for t in ts] for g, ts in self.groups.items()}
        previous = self.previous if self.previous is not None else current
        if self.tangent is None:
            self.tangent = {g: [torch.zeros_like(t) for t in ts] for g, ts in current.items()}
        for g in current:
            for z, now, before in zip(self.tangent[g], current[g], previous[g]):
                z.mul_(self.mu).add_(now - before)
        self.previous, self.previous_is_own = current, False

    def state_dict(self) -> Dict[str, Any]:
        buf = io.BytesIO()
        torch.save({"previous": self.previous, "tangent": self.tangent}, buf)
        return {"tensors": buf.getvalue(), "tail": self.tail.state_dict(), "previous_is_own": self.previous_is_own}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "tensors" not in state:
            return
        saved = torch.load(io.BytesIO(state["tensors"]), weights_only=True)
        self.previous, self.tangent = saved["previous"], saved["tangent"]
        self.tail.load_state_dict(state.get("tail") or {})
        self.previous_is_own = bool(state.get("previous_is_own", False))


SIGNALS = tuple(str(s) for s in HDETSignal)  # hdet.signal's choices: the config's enum
