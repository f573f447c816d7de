"""Periodic checkpoints for resuming an unfinished run (:class:`CheckpointManager`), with
``torch.distributed.checkpoint`` (DCP).

They live in ``checkpoint/step-<N>/`` next to the final model (:mod:`recsys_hdet.components.model_checkpoint`)
while the run trains and are removed when it finishes. Every stateful piece of the job (model,
schedules, loader position, RNG, loop, rollback) is registered by name and saved together with a
manifest; a checkpoint is written into a temporary directory and renamed once every rank is done.
Replicated state (dense parameters on every rank, embedding shards in every sharding group) is
written once: DCP's default save planner deduplicates items with the same key and offsets.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from data_tools.fileio import publish_directory, write_manifest
from recsys_hdet.components.model_checkpoint import STEP_PREFIX
from recsys_hdet.run_dir import RunDir


MANIFEST = "manifest.json"


class Stateful(Protocol):
    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Dict[str, Any]) -> None: ...


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from (named, with the reason)."""


def step_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """Published ``step-<N>`` directories under ``directory``, oldest first (complete or not:
    see :func:`check_step_checkpoint`)."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit():
            found.append((int(name[len(STEP_PREFIX):]), os.path.join(directory, name)))
    return sorted(found)


def check_step_checkpoint(path: str, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """The manifest of a complete periodic checkpoint; CheckpointError naming what is wrong
    (no manifest, a missing shard file, a manifest written by another run directory)."""
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({e})") from None
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise CheckpointError(f"{path}: DCP's .metadata is missing")
    missing = [f for f in manifest.get("files", []) if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise CheckpointError(f"{path}: shard file(s) {missing} missing")
    sizes = manifest.get("sizes", {})
    wrong = [f for f, n in sizes.items() if os.path.getsize(os.path.join(path, f)) != n]
    if wrong:
        raise CheckpointError(f"{path}: shard file(s) {wrong} truncated or altered (size differs from the manifest)")
    if run_dir is not None and os.path.abspath(manifest.get("run_dir", "")) != os.path.abspath(run_dir):
        raise CheckpointError(f"{manifest_path}: written by the run in {manifest.get('run_dir')!r}, not this one "
                              f"({run_dir}); pass trainer.resume=PATH to resume from another run's checkpoint")
    return manifest


def latest_step_checkpoint(directory: str, run_dir: str, say=print) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The newest complete periodic checkpoint (path, manifest); an incomplete or corrupt newer
    one is named and skipped (``say``), so resume falls back to the previous complete one."""
    for _, path in reversed(step_checkpoints(directory)):
        try:
            return path, check_step_checkpoint(path, run_dir)
        except CheckpointError as e:
            say(f"resume: skipping {e}")
    return None


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return len(obj) if isinstance(obj, bytes) else 0


def _describe_failure(e: BaseException, rank: int) -> str:
    """One line per failed rank: DCP gathers the ranks' write exceptions into one CheckpointException."""
    if isinstance(e, CheckpointException):
        parts = []
        for r, failure in sorted(e.failures.items()):
            exc = failure[0] if isinstance(failure, tuple) else failure
            parts.append(f"rank {r}: {type(exc).__name__}: {exc}")
        return "; ".join(parts)
    return f"rank {rank}: {type(e).__name__}: {e}"


class _FullDiskWriter(dcp.FileSystemWriter):
    """A storage writer whose write fails as on a full disk (fault injection for tests)."""

    def write_data(self, plan, planner):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device (fault injected)")


class CheckpointManager:
    """Saves and restores every stateful piece of a training job, so that a killed job continues
    exactly where its last checkpoint left it.

    Design:
    - Pieces register by name (:meth:`register`): anything with ``state_dict``/``load_state_dict``
      (the model's local state and the dense optimizer's, the LR scheduler or HDET engine, the
      loader's position, the RNGs, the loop's accumulators).
    - One DCP save per checkpoint, every rank writing its *own* state under the key ``rank<r>``.
      Under HDET the replicas differ between syncs (that is the method), and a 2-D layout's
      embedding replicas differ between averages: saving per rank is what makes a resume exact at
      any step. The price is one copy of the embedding tables per sharding group, and a resume
      needs the same layout (checked from the manifest; the final model in ``checkpoint/`` is the
      layout-free artifact for evaluation and warm starts).
    - Atomic: written into ``.step-<N>.tmp``, published by rank 0 with one rename after every rank
      finished writing and the manifest (step, world size, the shard files and their sizes, the
      run directory, the resolved config) is on disk. A reader never sees half a checkpoint; the
      oldest ones beyond ``keep_last`` are deleted only after a newer one is published.
    - A failed write (e.g. a full disk) is reported and training goes on; the last good
      checkpoint is never touched by it.

    - ``async_save``: the job stalls only while DCP copies the state into memory; the write runs in
      a thread and the checkpoint is published at the next checkpoint or the pass's end (a job
      killed meanwhile resumes from the one before). BENCHMARKS.md has both stalls measured.

    Limits: resume needs the same world size and sharding group size.
    """

    def __init__(self, directory: str, run_dir: str, every_steps: int, keep_last: int, rank: int, world: int,
                 say=print, async_save: bool = False, keep_steps: Tuple[int, ...] = ()) -> None:
        self.directory, self.run_dir = directory, run_dir
        self.every_steps, self.keep_last = int(every_steps), max(1, int(keep_last))
        # Checkpoints written at these steps too, never rotated out nor removed after the pass (a
        # study branches other runs from them: trainer.branch_from).
        self.keep_steps = frozenset(int(s) for s in keep_steps)
        self.rank, self.world = rank, world
        self.say = say
        self.pieces: Dict[str, Stateful] = {}
        self.seconds = 0.0  # time spent saving (rank 0's view), for the benchmark harness
        self.saved = 0
        self.last_bytes = 0  # the last published checkpoint's files
        self.async_save = bool(async_save) and every_steps > 0
        self._pending = None  # (step, tmp dir, manifest, DCP future or None, error) not yet published
        # DCP's background write runs its own collectives: on their own group, never interleaved
        # with the training loop's on the default one.
        self._async_group = dist.new_group(backend="gloo") if self.async_save else None
        self.state_bytes = 0  # the tensors it holds, over every rank (what "MB of model state" means)

    def register(self, name: str, piece: Stateful) -> None:
        self.pieces[name] = piece

    def due(self, step: int, total_steps: int) -> bool:
        """A periodic checkpoint after ``step``: every ``every_steps``, never at the pass's end (the
        final model is saved then)."""
        periodic = self.every_steps > 0 and step % self.every_steps == 0
        return (periodic or step in self.keep_steps) and step < total_steps

    def _local_state(self) -> Dict[str, Any]:
        return {f"rank{self.rank}": {name: piece.state_dict() for name, piece in self.pieces.items()}}

    def save(self, step: int, manifest: Mapping[str, Any], fail_write=None) -> None:
        """Writes checkpoint ``step-<step>`` (collective: every rank calls it). A failure is
        reported, leaves the previous checkpoints alone, and raises nothing, so training goes on.

        Synchronous: written and published before it returns. With ``async_save``, only the
        state's copy into memory happens now (DCP's ``async_save``, writing in a thread on its
        own gloo group); the checkpoint is published by the next ``save`` or by :meth:`finish`,
        once every rank's write is done."""
        import time

        start = time.perf_counter()
        self._publish_pending()  # the previous async write, if any
        tmp = os.path.join(self.directory, f".{STEP_PREFIX}{step}.tmp")
        if self.rank == 0:
            os.makedirs(self.directory, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        state = self._local_state()
        if not self.state_bytes:
            local = torch.tensor([float(_tensor_bytes(state))], dtype=torch.float64)
            dist.all_reduce(local)
            self.state_bytes = int(local.item())
        # ``fail_write(step)``: a test's fault injection; the failure then happens where a full
        # disk's would, inside DCP's write, which reports it to every rank.
        writer = _FullDiskWriter(tmp) if fail_write is not None and fail_write(step) else dcp.FileSystemWriter(tmp)
        error, future = "", None
        try:
            if self.async_save:
                future = dcp.async_save(state, storage_writer=writer, process_group=self._async_group)
            else:
                dcp.save(state, storage_writer=writer)
        # DCP's CheckpointException (one rank's write failed, raised on every rank) is a BaseException.
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - any write failure: report, keep the last good one
            error = _describe_failure(e, self.rank)
        self._pending = (step, tmp, dict(manifest), future, error)
        if not self.async_save:
            self._publish_pending()
        self.seconds += time.perf_counter() - start

    def finish(self) -> None:
        """Publishes the last async checkpoint (collective; a no-op when saving synchronously)."""
        self._publish_pending()

    def _publish_pending(self) -> None:
        if self._pending is None:
            return
        step, tmp, manifest, future, error = self._pending
        self._pending = None
        if future is not None and not error:
            try:
                future.result()
            except (Exception, CheckpointException) as e:  # noqa: BLE001
                error = _describe_failure(e, self.rank)
        # Every rank learns whether every rank wrote its part (DCP may not get to its own collective).
        errors: List[str] = [""] * self.world
        dist.all_gather_object(errors, error)
        failed = sorted({e for e in errors if e})  # DCP reports one rank's failure on every rank
        if self.rank == 0:
            if failed:
                shutil.rmtree(tmp, ignore_errors=True)
                self.say(f"checkpoint at step {step} FAILED and was discarded ({'; '.join(failed)}); training goes "
                         f"on, the last good checkpoint is kept")
            else:
                final = os.path.join(self.directory, f"{STEP_PREFIX}{step}")
                files = sorted(f for f in os.listdir(tmp) if not f.startswith("."))
                body = {**manifest, "step": step, "world_size": self.world, "run_dir": os.path.abspath(self.run_dir),
                        "files": files, "sizes": {f: os.path.getsize(os.path.join(tmp, f)) for f in files}}
                write_manifest(tmp, MANIFEST, body)
                publish_directory(tmp, final, replace=True)
                self.last_bytes = sum(body["sizes"].values())
                rotated = [(s, p) for s, p in step_checkpoints(self.directory) if s not in self.keep_steps]
                for _, old in rotated[:-self.keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        self.saved += not failed

    def load(self, path: str, pieces: Optional[Tuple[str, ...]] = None) -> None:
        """Restores every registered piece (or the named ``pieces``) from ``path`` (collective)."""
        names = list(self.pieces) if pieces is None else list(pieces)
        state = {f"rank{self.rank}": {name: self.pieces[name].state_dict() for name in names}}
        dcp.load(state, checkpoint_id=path)
        for name in names:
            self.pieces[name].load_state_dict(state[f"rank{self.rank}"][name])

    def remove_all(self) -> None:
        """After the pass: periodic checkpoints are for resuming an unfinished run only."""
        if self.rank == 0:
            for step, path in step_checkpoints(self.directory):
                if step not in self.keep_steps:
                    shutil.rmtree(path, ignore_errors=True)
            for name in os.listdir(self.directory) if os.path.isdir(self.directory) else []:
                if name.startswith(f".{STEP_PREFIX}"):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def build_checkpoints(trainer: Any, run_dir: str, total_steps: int, rank: int, world: int, say: Any,
                      pieces: Mapping[str, Stateful]) -> CheckpointManager:
    """The job's periodic checkpoints (``trainer.periodic_checkpoint``) in ``run_dir/checkpoint``, with
    ``pieces`` registered by name (the order is the manifest's). ``keep_at`` fractions of the pass are
    rounded to a divergence check (a multiple of ``trainer.log_every``), where rollback's copy is taken too."""
    spec, log_every = trainer.periodic_checkpoint, int(trainer.log_every)
    keep_steps = [round(float(f) * total_steps / log_every) * log_every for f in spec.keep_at]
    manager = CheckpointManager(RunDir(run_dir).path(RunDir.CHECKPOINT), run_dir, int(spec.every_steps), int(spec.keep_last),
                                rank, world, say=say, async_save=bool(spec.async_save),
                                keep_steps=tuple(s for s in keep_steps if 0 < s < total_steps))
    for name, piece in pieces.items():
        manager.register(name, piece)
    return manager
