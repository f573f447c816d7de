"""Fault injection, for tests of what the job does when a worker goes wrong.

Not a user knob: set the environment variable ``RECSYS_HDET_FAULTS`` to a comma-separated list of
``KIND@step=S[:rank=R][:steps=N]`` (every rank when ``rank`` is left out). After the optimizer step of
training step ``S`` (1-based) on rank ``R``:

- ``nan_state``: writes NaN into the rank's first replicated dense parameter, as an update that
  blew up would (the state is non-finite; the losses that follow are too).
- ``zero_dense``: zeroes every replicated dense parameter: every logit becomes one constant, the
  gradients below the heads vanish, and the model can only learn the base rate (a collapse).
- ``kill``: the rank kills itself with SIGKILL (an OOM kill, a preempted host), once per run
  directory: a marker file there keeps a restarted job that passes step S again from dying again.
- ``checkpoint_fails``: the periodic checkpoint written at step S fails on that rank with "No
  space left on device" (a full disk), before it is published.

And before training step S (its forward, so the fused embedding update in backward sees it too):

- ``lr_spike``: every parameter group's learning rate times 1000 for steps S .. S + N - 1
  (``steps``, default 1), as a misset schedule would do: what the trainer's rollback must undo.
  The schedule writes its own rates back after each step.

Unset (the normal case), :func:`faults_from_env` returns an empty plan and the trainer's check is
one dictionary lookup per step.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

ENV = "RECSYS_HDET_FAULTS"
KINDS = ("nan_state", "zero_dense", "kill", "checkpoint_fails", "lr_spike")
LR_SPIKE = 1000.0


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: Optional[int]  # None: every rank
    steps: int = 1  # how many consecutive steps it lasts (lr_spike)


def parse_faults(spec: str) -> List[Fault]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, where = item.partition("@")
        fields = dict(part.split("=", 1) for part in where.split(":") if "=" in part)
        if kind not in KINDS or "step" not in fields or set(fields) - {"step", "rank", "steps"}:
            raise ValueError(f"{ENV}={spec!r}: cannot read {item!r}; expected KIND@step=S[:rank=R][:steps=N], "
                             f"KIND in {KINDS}")
        faults.append(Fault(kind, int(fields["step"]), int(fields["rank"]) if "rank" in fields else None,
                            int(fields.get("steps", 1))))
    return faults


class FaultPlan:
    """The faults for one rank, by step."""

    def __init__(self, faults: List[Fault], rank: int, run_dir: Optional[str] = None) -> None:
        self.rank, self.run_dir = rank, run_dir
        self.by_step: Dict[int, List[str]] = {}
        for f in faults:
            if f.rank is None or f.rank == rank:
                for step in range(f.step, f.step + f.steps):
                    self.by_step.setdefault(step, []).append(f.kind)

    def before_step(self, step: int, optimizer) -> None:
        """Before training step ``step`` (1-based): ``lr_spike`` multiplies every group's LR and pushes it."""
        if "lr_spike" in self.by_step.get(step, ()):
            for pg in optimizer.param_groups:
                pg["lr"] *= LR_SPIKE
            optimizer.apply_hparams()

    def after_optimizer_step(self, step: int, dense_tensors: List[torch.Tensor]) -> None:
        for kind in self.by_step.get(step, ()):
            if kind == "nan_state":
                with torch.no_grad():
                    dense_tensors[0].view(-1)[0] = float("nan")
            elif kind == "zero_dense":
                with torch.no_grad():
                    for t in dense_tensors:
                        if t.is_floating_point():
                            t.zero_()
            elif kind == "kill":
                marker = os.path.join(self.run_dir or ".", f".fault-kill-step{step}-rank{self.rank}")
                if not os.path.exists(marker):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)

    def checkpoint_fails(self, step: int) -> bool:
        """Whether this rank's write of the checkpoint at ``step`` fails (as on a full disk)."""
        return "checkpoint_fails" in self.by_step.get(step, ())


def faults_from_env(rank: int, run_dir: Optional[str] = None) -> FaultPlan:
    return FaultPlan(parse_faults(os.environ.get(ENV, "")), rank, run_dir)
