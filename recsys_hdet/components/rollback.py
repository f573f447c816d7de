"""Rollback instead of divergence: a window that diverges is undone, not the run.

At every divergence check that passes (each ``trainer.log_every`` steps), and where training
starts or resumes, each rank copies its model state into host memory: every local embedding shard
with its fused-optimizer state, the dense parameters and buffers, the dense optimizer's state
(:class:`~recsys_hdet.components.train_state.ModelState`). When a check fails (the interval's
average loss above ``trainer.diverge_loss``, or no finite loss), every rank restores that copy,
the replicas are averaged into one model (as at an HDET sync), every learning rate is multiplied
by ``trainer.rollback.lr_factor`` from then on (the plain schedules and HDET's bases alike: the LR
control's ``cut_learning_rates``), and training goes on with the next batch. The data position,
the schedule's position and the random generators move on: the bad window's rows are not
replayed. After ``trainer.rollback.max_rollbacks`` rollbacks the next failed check ends the run as
diverged (exit 3), as without rollback.

Why a copy in memory rather than the last periodic checkpoint: the copy is taken where the check
has just passed, so a rollback loses one log interval at most (a checkpoint, every
``periodic_checkpoint.every_steps``, ten intervals by default), and it costs one host copy of the
model per interval (``RunDir.SUMMARY``'s ``rollback.snapshot_seconds``) against a DCP read from disk
per rollback. The price is one more copy of the model in host memory (``snapshot_bytes``): for
tables too large for that, the periodic checkpoint is the place to restore from (not built).

Resume: a periodic checkpoint is written only where a check has just passed
(``every_steps`` a multiple of ``log_every``, checked with the config), so the state a resumed run
copies at its start is the copy the uninterrupted run held at that step: resume stays exact.
The count and the events ride in the checkpoint (:meth:`state_dict`), the LR cuts in the LR
control's own state.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Mapping, Optional

import torch

from recsys_hdet.components.replicas import ReplicaAverager
from recsys_hdet.components.train_state import ModelState


class Rollback:
    def __init__(self, model_state: ModelState, averager: ReplicaAverager, lr_control: Any, max_rollbacks: int,
                 lr_factor: float) -> None:
        self.model_state = model_state
        self.averager = averager
        self.lr_control = lr_control  # has cut_learning_rates(factor)
        self.max_rollbacks = int(max_rollbacks)
        self.lr_factor = float(lr_factor)
        self.events: List[Dict[str, Any]] = []
        self.good: Optional[Dict[str, Any]] = None  # the last state that passed a check, on the host
        self.good_step = -1
        self.snapshot_seconds = 0.0
        self.snapshot_bytes = 0
        self.why_not = ""  # why the last failed check could not be rolled back

    @property
    def enabled(self) -> bool:
        return self.max_rollbacks > 0

    @torch.no_grad()
    def snapshot(self, step: int) -> None:
        """Copies this rank's model state as the one to come back to (after a passing check)."""
        if not self.enabled:
            return
        start = time.perf_counter()
        state = self.model_state.state_dict()
        copy = lambda ts: [t.detach().to("cpu", copy=True) for t in ts]  # noqa: E731
        self.good = {"embedding": copy(state["embedding"]), "dense": copy(state["dense"]),
                     "dense_optimizer": state["dense_optimizer"]}
        self.good_step = step
        self.snapshot_seconds += time.perf_counter() - start
        self.snapshot_bytes = sum(t.numel() * t.element_size() for k in ("embedding", "dense") for t in self.good[k]) \
            + len(self.good["dense_optimizer"])

    def undo(self, step: int, reason: str) -> Optional[Dict[str, Any]]:
        """After a failed check at ``step``: restores the last good state, cuts the learning rates and
        returns the event to log; None when the run must stop as diverged, with :attr:`why_not` saying
        why. Collective (every rank calls it with the same decision)."""
        if not self.enabled:
            self.why_not = "rollback is off (trainer.rollback.max_rollbacks=0)"
            return None
        if len(self.events) >= self.max_rollbacks:
            self.why_not = f"after {len(self.events)} rollback(s), all that trainer.rollback.max_rollbacks allows"
            return None
        if self.good is None:  # every start and resume copies the state: a wiring error, said plainly
            self.why_not = "no state has passed a check yet: nothing to roll back to"
            return None
        self.model_state.load_state_dict(self.good)
        # One model again: each rank's copy was taken where the check passed, possibly mid-window
        # under HDET, when the replicas differ, or with one replica already non-finite (a check
        # passes while another replica is finite): that one is restored from the others.
        finite = self.averager.local_state_is_finite()
        try:
            self.averager.average_dense(include=finite)
            if self.averager.has_embedding_replicas:
                self.averager.average_embeddings(include=finite)
        except FloatingPointError:
            self.why_not = f"the state of step {self.good_step} is not finite on any replica: nothing to restore"
            return None
        self.lr_control.cut_learning_rates(self.lr_factor)
        event = {"step": step, "restored_step": self.good_step, "reason": reason, "lr_factor": self.lr_factor,
                 "lr_scale": self.lr_factor ** (len(self.events) + 1), "rollback": len(self.events) + 1,
                 "max_rollbacks": self.max_rollbacks}
        self.events.append(event)
        return event

    def summary(self) -> Dict[str, Any]:
        return {"count": len(self.events), "max_rollbacks": self.max_rollbacks, "lr_factor": self.lr_factor,
                "events": list(self.events), "snapshot_seconds": self.snapshot_seconds,
                "snapshot_bytes": self.snapshot_bytes, **({"not_rolled_back": self.why_not} if self.why_not else {})}

    def state_dict(self) -> Dict[str, Any]:
        return {"events": json.dumps(self.events)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.events = json.loads(state["events"])


def build_rollback(spec: Any, model_state: ModelState, averager: ReplicaAverager,
                   lr_control: Any) -> Rollback:
    """From ``trainer.rollback``: ``max_rollbacks`` (0: off) and ``lr_factor``."""
    return Rollback(model_state, averager, lr_control, int(spec.max_rollbacks), float(spec.lr_factor))
