"""The training job's state that is not a module's: what a resume must restore besides the
schedules, the HDET engine and the loader (which carry their own ``state_dict``).

- :class:`ModelState`: this rank's copy of the model (every local embedding shard with its fused
  optimizer state, every dense parameter and buffer) and the dense optimizer's state.
- :class:`RNGState`: every random generator that affects training on this rank (torch's CPU one and every
  CUDA device's, which drive dropout; numpy's; python's).
- :func:`snapshot` and :class:`Snapshot`: a copy of pieces like these that later training does not change, put
  back bit for bit (the range test on the replicas restores its step-0 state with it, HDET's anneal probe its
  state before the cooldown: one owner of "measure, then put everything back").
- :class:`LoopState`: the training loop's position and accumulators (step, the loss sums behind
  RunDir.METRICS and RunDir.SUMMARY, the training time so far).
- :class:`TrainClock`: the training time, without checkpoint stalls (not checkpointed: a resumed
  job starts it from ``LoopState.train_seconds``).

Each is a small object with ``state_dict``/``load_state_dict`` for
:class:`recsys_hdet.components.checkpoint.CheckpointManager`.
"""

from __future__ import annotations

import io
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping

import numpy as np
import torch

from recsys_hdet.components.replicas import dense_state_tensors, embedding_state_tensors, tbe_kernels


class ModelState:
    """This rank's model and dense-optimizer state. The tensors are views of the live storage
    (fbgemm kernels' weights and optimizer state, dense parameters), so DCP loads them in place;
    the dense optimizer's per-parameter state goes as one serialized blob because it does not
    exist before the first step (DCP loads only keys its template has)."""

    def __init__(self, model: torch.nn.Module, dense_optimizer: torch.optim.Optimizer) -> None:
        # fbgemm's step counter (``iter``) rides along: some of its optimizers read it (Adam-style bias correction,
        # the counter-based weight decay). Its kernels count in a host copy, ``iter_cpu``, which they re-read from
        # ``iter`` only while it is 0: load_state_dict sets it too.
        self.counted = [k for k in tbe_kernels(model) if isinstance(getattr(k, "iter", None), torch.Tensor)]
        self.embedding = embedding_state_tensors(model) + [k.iter for k in self.counted]
        self.dense = dense_state_tensors(model)
        self.optimizer = dense_optimizer

    def _params(self) -> List[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def state_dict(self) -> Dict[str, Any]:
        buf = io.BytesIO()
        torch.save([self.optimizer.state.get(p, {}) for p in self._params()], buf)
        return {"embedding": self.embedding, "dense": self.dense, "dense_optimizer": buf.getvalue()}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for kind in ("embedding", "dense"):
            live, saved = getattr(self, kind), state[kind]
            if len(live) != len(saved) or any(a.shape != b.shape for a, b in zip(live, saved)):
                raise ValueError(f"checkpoint's {kind} state has other shapes than this model's")
            for a, b in zip(live, saved):
                if a.data_ptr() != b.data_ptr():
                    a.copy_(b)
        for kernel in self.counted:  # the kernels' host counter follows the restored one
            if isinstance(getattr(kernel, "iter_cpu", None), torch.Tensor):
                kernel.iter_cpu.fill_(int(kernel.iter.item()))
        per_param = torch.load(io.BytesIO(state["dense_optimizer"]), weights_only=True)
        params = self._params()
        if len(per_param) != len(params):
            raise ValueError("checkpoint's dense optimizer state covers other parameters than this model's")
        # Assigned per parameter: Optimizer.load_state_dict would replace the param_group dicts
        # that the LR schedulers hold.
        self.optimizer.state.clear()
        for p, s in zip(params, per_param):
            if s:
                self.optimizer.state[p] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}


class RNGState:
    """torch's CPU generator, every CUDA device's (when there is one: a GPU run's dropout draws there), numpy's and
    python's."""

    def state_dict(self) -> Dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        if "cuda" in state:
            torch.cuda.set_rng_state_all(list(state["cuda"]))


def snapshot(state: Any) -> Dict[str, Any]:
    """A copy of ``state.state_dict()`` that later training does not change (tensors cloned; the rest, e.g.
    serialized bytes, is immutable)."""
    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, list):
            return [copy(v) for v in value]
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        return value
    return copy(state.state_dict())


class Snapshot:
    """The state of ``pieces`` (each with ``state_dict``/``load_state_dict``) now; :meth:`restore` puts it back bit
    for bit, after any training in between. A measurement that trains (a range test's sweep, a probe's cooldown)
    takes one before and restores after, the random generators included (:class:`RNGState` among the pieces)."""

    def __init__(self, *pieces: Any) -> None:
        self.saved = [(piece, snapshot(piece)) for piece in pieces]

    def restore(self) -> None:
        for piece, state in self.saved:
            piece.load_state_dict(state)


@dataclass
class LoopState:
    """The training loop's position and running sums (per rank)."""

    num_tasks: int
    step: int = 0
    window: torch.Tensor = field(default=None)  # per-task loss sums since the last log, + non-finite count
    window_steps: int = 0
    total: torch.Tensor = field(default=None)  # per-task loss sums over the pass (all-reduced)
    rolled_back_steps: int = 0  # rank-steps of rolled-back intervals: not in ``total``
    train_seconds: float = 0.0  # before this attempt (a resumed job adds its own)
    learned: bool = False  # an interval's mean training NE was below trainer.collapse.armed_below (arms the check)

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = torch.zeros(self.num_tasks + 1, dtype=torch.float64)
        if self.total is None:
            self.total = torch.zeros(self.num_tasks, dtype=torch.float64)

    def end_interval(self, interval: torch.Tensor, rolled_back: bool) -> None:
        """The interval just checked (its all-reduced per-task sums, non-finite count and rank-steps)
        counts in the pass's training loss, unless it was rolled back."""
        n = self.num_tasks
        if rolled_back:
            self.rolled_back_steps += int(interval[n + 1])
        else:
            self.total += interval[:n]

    def add_step_losses(self, per_task: torch.Tensor) -> None:
        """One step's per-task losses into the interval's sums (a non-finite step is counted apart)."""
        finite = bool(torch.isfinite(per_task).all())
        self.window[: self.num_tasks] += per_task if finite else 0.0
        self.window[self.num_tasks] += 0.0 if finite else 1.0

    def state_dict(self) -> Dict[str, Any]:
        return {"step": self.step, "window": self.window, "window_steps": self.window_steps, "total": self.total,
                "train_seconds": self.train_seconds, "rolled_back_steps": self.rolled_back_steps,
                "learned": self.learned}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = int(state["step"])
        self.window.copy_(state["window"])
        self.total.copy_(state["total"])
        self.window_steps = int(state["window_steps"])
        self.train_seconds = float(state["train_seconds"])
        self.rolled_back_steps = int(state["rolled_back_steps"])
        self.learned = bool(state.get("learned", False))  # absent in checkpoints from before the collapse check


class TrainClock:
    """Training time of one attempt (plus ``before``, the time of the attempts a resumed job
    follows), without the stalls the loop pauses it for (checkpoint writes); and each logging
    interval's time, for its throughput."""

    def __init__(self, before: float = 0.0) -> None:
        self.before = before
        self.start = self.mark = time.monotonic()
        self.paused_total = 0.0

    def interval(self) -> float:
        """Seconds since the last call (or the start), paused time left out."""
        now = time.monotonic()
        seconds, self.mark = now - self.mark, now
        return seconds

    def seconds(self) -> float:
        return self.before + time.monotonic() - self.start - self.paused_total

    @contextmanager
    def paused(self) -> Iterator[None]:
        tick = time.monotonic()
        try:
            yield
        finally:
            stall = time.monotonic() - tick
            self.paused_total += stall
            self.mark += stall
