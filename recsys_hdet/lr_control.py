"""LR control: what sets every parameter group's learning rate (and other scheduled scalars) step by step.

The one module that names both the plain schedule (components/) and HDET (hdet/): it sits above
both, so that neither needs the other (the import contracts in pyproject.toml).

One interface (:class:`LRControl`), two implementations built by :func:`build_lr_control` from the
config:

- :class:`ScheduledLR`: the plain run, each group on its one-cycle schedule;
- HDET (``hdet.enabled``): :class:`recsys_hdet.hdet.controller.integration.HDETControl`, the replicas each on
  their own learning rates around a shared base that a controller moves at every sync.

The training loop calls :meth:`LRControl.step` after every optimizer step, with the step's
per-task losses (and the served ones, computed in the step when the control
``wants_serving_loss``); the control sets the next step's values and pushes them to the
optimizers' kernels. The loop never branches on which control it holds: what differs (how the
embedding replicas are averaged, whether a non-finite replica is tolerated, the logs, the summary)
is asked of the control.

The control is checkpointed (``state_dict``) and is what a rollback cuts (``cut_learning_rates``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Protocol

import torch

from recsys_hdet.components.checkpoint import check_step_checkpoint
from recsys_hdet.components.job_handles import JobHandles
from recsys_hdet.components.lr_scheduler import GroupLRScheduler, build_schedules, describe_schedules
from recsys_hdet.hdet.form import hdet_form


# The manifest key (periodic checkpoints) and meta key (the final model) of the LR control's commitment.
COMMITMENT = "lr_commitment"


def recorded_commitment(checkpoint: Optional[str]) -> Optional[Dict[str, Any]]:
    """What the periodic checkpoint a resumed or branched run loads had committed (LRControl.commitment), with
    ``from_checkpoint``; None for a fresh run or a checkpoint that recorded none."""
    if not checkpoint:
        return None
    recorded = check_step_checkpoint(str(checkpoint)).get(COMMITMENT)
    return {**recorded, "from_checkpoint": str(checkpoint)} if recorded else None


def run_cost(pass_steps: int, pass_seconds: float, commitment: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """RunDir.SUMMARY's ``cost``: the pass's steps and seconds, the commitment's (under its form's name) and the total."""
    parts = {"pass": {"steps": pass_steps, "seconds": pass_seconds}}
    if commitment:
        parts[commitment["form"]] = {"steps": int(commitment["cost"]["steps"]),
                                     "seconds": float(commitment["cost"]["seconds"])}
    return {**parts, "total": {"steps": sum(p["steps"] for p in parts.values()),
                               "seconds": sum(p["seconds"] for p in parts.values())}}


class LRControl(Protocol):
    #: Under HDET a non-finite replica is excluded and restored at the next sync, so an interval
    #: fails its check only when no replica had a finite loss; a plain run fails on any.
    tolerates_non_finite_replicas: bool
    #: How often the loop averages the embedding replicas (0: the control does it itself, or there
    #: are none to average).
    embedding_sync_every: int

    #: Whether step() needs the served loss (eval mode, before the step) of each batch.
    wants_serving_loss: bool

    #: What a form committed before the pass (None: nothing): ``form``, ``committed`` (each group's max LR),
    #: ``cost`` (``steps``, ``seconds`` it took) and the form's record under its name. Written into every
    #: checkpoint's manifest and the final model's meta, so that a resumed or branched run reuses it instead of
    #: committing again (:func:`build_lr_control`'s ``commitment``).
    commitment: Optional[Dict[str, Any]]

    def step(self, step: int, per_task: torch.Tensor, served: Optional[torch.Tensor]) -> Optional[Dict[str, Any]]:
        """After the optimizer step of training step ``step`` (0-based): returns what to log (an
        HDET sync record), having logged it, or None."""

    def failed_check(self) -> str:
        """Why the last step must end the interval as failed ('' when it need not)."""

    def log_event(self, event: Mapping[str, Any]) -> None: ...

    def open_logs(self, start_step: int, tensorboard: Any) -> None: ...

    def close(self) -> None: ...

    def start_at(self, step: int) -> None: ...

    def cut_learning_rates(self, factor: float) -> None: ...

    def summary(self, train_seconds: float) -> Dict[str, Any]: ...

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ScheduledLR:
    """The plain run: every group follows its own schedule (``optim.schedule``: one-cycle, or see
    :func:`~recsys_hdet.components.lr_scheduler.build_schedules`)."""

    tolerates_non_finite_replicas = False
    wants_serving_loss = False

    def __init__(self, optimizer: Any, schedules: Mapping[str, Any], cycle_momentum: bool, total_steps: int,
                 embedding_sync_every: int, record: Optional[Mapping[str, Any]] = None,
                 commitment: Optional[Dict[str, Any]] = None) -> None:
        self.optimizer = optimizer
        self.record = dict(record or {})  # what RunDir.SUMMARY says of how the max LRs were chosen
        self.commitment = commitment
        self.scheduler = GroupLRScheduler(optimizer.groups, schedules, cycle_momentum)
        self.total_steps = total_steps
        self.embedding_sync_every = embedding_sync_every
        optimizer.apply_hparams()

    def step(self, step: int, per_task: torch.Tensor, served: Optional[torch.Tensor]) -> None:
        if step + 1 < self.total_steps:  # the schedule has total_steps values, the last one is kept
            self.scheduler.step()
            self.optimizer.apply_hparams()
        return None

    def failed_check(self) -> str:
        return ""

    def log_event(self, event: Mapping[str, Any]) -> None:
        pass

    def open_logs(self, start_step: int, tensorboard: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def start_at(self, step: int) -> None:
        self.scheduler.start_at(step)
        self.optimizer.apply_hparams()

    def cut_learning_rates(self, factor: float) -> None:
        self.scheduler.cut_learning_rates(factor)
        self.optimizer.apply_hparams()

    def summary(self, train_seconds: float) -> Dict[str, Any]:
        """The record of how the max LRs were chosen, and under ``lr.schedule`` each group's schedule as the pass
        trained it (its shape, where its anneal starts: :func:`~recsys_hdet.components.lr_scheduler.describe_schedules`)."""
        out = dict(self.record)
        out["lr"] = {**out.get("lr", {}), "schedule": describe_schedules(self.scheduler.schedules)}
        return out

    def state_dict(self) -> Dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


def build_lr_control(cfg: Any, handles: JobHandles, *, total_steps: int, plain_embedding_sync_every: int,
                     commitment: Optional[Mapping[str, Any]] = None) -> LRControl:
    """The config's LR control: HDET's when ``hdet.enabled`` (it acts on the job through ``handles``:
    :func:`recsys_hdet.hdet.controller.integration.build_hdet_control`), else the per-group schedules. ``commitment``: what
    the checkpoint a resumed or branched run loads had committed (:attr:`LRControl.commitment`): reused, never
    committed again."""
    optimizer = handles.optimizer
    groups: List[str] = list(optimizer.groups)

    def plain(max_lrs: Mapping[str, float], record: Optional[Mapping[str, Any]] = None,
              committed: Optional[Dict[str, Any]] = None) -> ScheduledLR:
        """The plain run's control with each group's max LR from ``max_lrs`` (the config's elsewhere)."""
        return ScheduledLR(optimizer, build_schedules(cfg.optim, groups, total_steps, max_lrs),
                           bool(cfg.optim.schedule.cycle_momentum), total_steps, plain_embedding_sync_every, record,
                           committed)

    form = hdet_form(cfg.hdet)
    if form == "range_test":
        from recsys_hdet.hdet.range_test.job import replica_range_test, reuse_commitment

        # The range test on the replicas: the sweep runs now, from the step-0 state it then puts back; the pass
        # is the plain run at the committed max LRs. A resumed or branched run trains at the rates its checkpoint
        # committed (a second sweep could commit others: the same curves need the same floats).
        done = reuse_commitment(cfg, commitment, handles.log) if commitment else None
        done = done or replica_range_test(cfg, handles)
        return plain(done["committed"], {"hdet": {"form": "range_test", "range_test": done["range_test"]},
                                         "lr": {"controlled_max_lr": done["committed"]}}, done)
    if form == "controller":
        from recsys_hdet.hdet.controller.integration import build_hdet_control

        # After explore-then-commit's last round HDET hands the pass to the plain control at the held LRs.
        return build_hdet_control(cfg, handles, total_steps=total_steps,
                                  plain_embedding_sync_every=plain_embedding_sync_every, plain_after_commit=plain)
    return plain({})
