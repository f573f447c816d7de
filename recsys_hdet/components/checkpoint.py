"""Model checkpoints with ``torch.distributed.checkpoint`` (DCP).

DCP stores each rank's shards once, with global metadata, so a checkpoint written under one
parallel layout loads under another (different world size or sharding group size): that is
what makes the final model usable both for evaluation and as a warm start. The checkpoint is
written into ``checkpoint.tmp/`` and renamed to ``checkpoint/`` by rank 0 after every rank is
done, so a crash never leaves a directory that looks complete.

Saved: the model's state (``model``) and a small ``meta.json`` (steps, examples, experiment).

Periodic checkpoints for resuming an unfinished run (:class:`CheckpointManager`) live next to it
in ``checkpoint/step-<N>/`` while the run trains and are removed when it finishes.
Replicated state (dense parameters on every rank, embedding shards in every sharding group) is
written once: DCP's default save planner deduplicates items with the same key and offsets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn

STEP_PREFIX = "step-"  # checkpoint/step-<N>: a periodic checkpoint (CheckpointManager)


def save_model(model: nn.Module, directory: str, meta: Mapping[str, Any]) -> None:
    tmp = directory + ".tmp"
    if dist.get_rank() == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)
    dist.barrier()
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(dict(meta), f, indent=2)
        if os.path.exists(directory):
            # Periodic checkpoints of the run (checkpoint/step-<N>) move along: they are removed
            # only once summary.json is written.
            for name in os.listdir(directory):
                if name.startswith(STEP_PREFIX):
                    os.replace(os.path.join(directory, name), os.path.join(tmp, name))
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    dist.barrier()


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the model it is loaded into (named: the feature or key and
    both sizes)."""


_TABLE_KEY = re.compile(r"(?:^|\.)embedding_bags\.([^.]+)\.weight$")  # an EBC table's weight


def _table_feature(key: str) -> Optional[str]:
    """The feature an embedding table's state-dict key belongs to (tables are named ``t_<feature>``,
    see recsys_hdet.models.ranker); None for any other key."""
    m = _TABLE_KEY.search(key)
    if m is None:
        return None
    table = m.group(1)
    return table[2:] if table.startswith("t_") else table


def grown_tables(model_state: Mapping[str, Any], saved: Mapping[str, Any], directory: str = "checkpoint",
                 prefix: str = "model.") -> Dict[str, Tuple[torch.Size, torch.Size]]:
    """Compares a model's state dict with a checkpoint's DCP metadata (``saved``:
    ``Metadata.state_dict_metadata``, keys flattened as ``prefix + key``).

    Returns ``{flattened key: (saved size, model size)}`` for the embedding tables that GROW (the
    checkpoint's table has fewer rows than the model's, same embedding dimension): empty when
    every shape matches. Raises :class:`CheckpointMismatch` naming the feature (or key) and both
    sizes for anything else: a table that shrinks or changes its dimension, a feature added or
    removed, any other tensor whose shape differs (e.g. the dense inputs changed)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problems: List[str] = []
    grown: Dict[str, Tuple[torch.Size, torch.Size]] = {}
    for key, value in model_state.items():
        fqn = prefix + key
        feature = _table_feature(key)
        md = saved.get(fqn)
        if md is None:
            problems.append(f"feature {feature!r} is not in the checkpoint (a table was added: {key})" if feature
                            else f"{key} is not in the checkpoint")
            continue
        if not isinstance(value, torch.Tensor) or not isinstance(md, TensorStorageMetadata):
            continue  # non-tensor state: loaded (and checked) by DCP as before
        old, new = torch.Size(md.size), torch.Size(value.size())
        if old == new:
            continue
        if feature is None:
            hint = " (the dense inputs differ)" if key.startswith("dense_proj.") else ""
            problems.append(f"{key}: shape {list(old)} in the checkpoint, {list(new)} in the model{hint}")
        elif len(old) != 2 or len(new) != 2 or old[1] != new[1]:
            problems.append(f"feature {feature!r}: embedding dim {list(old)[1:]} in the checkpoint, {list(new)[1:]} in "
                            f"the model (table {list(old)} vs {list(new)})")
        elif old[0] > new[0]:
            problems.append(f"feature {feature!r}: the table shrinks from {old[0]} rows in the checkpoint to "
                            f"{new[0]} in the model (a warm start can only grow a table)")
        else:
            grown[fqn] = (old, new)
    have = {prefix + k for k in model_state}
    for fqn in saved:
        feature = _table_feature(fqn[len(prefix):]) if fqn.startswith(prefix) else None
        if feature and fqn not in have:
            problems.append(f"feature {feature!r} is in the checkpoint but not in the model (a table was removed)")
    if problems:
        raise CheckpointMismatch(f"{directory}: the checkpoint does not fit the model: " + "; ".join(problems))
    return grown


class _GrowingLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default load planner, reading a grown table's saved rows into the first rows of the
    model's larger table.

    DCP plans a load as the overlap, in global coordinates, of every local chunk (a shard's rows x
    columns at its offsets) with every saved chunk; only its check that the saved and the current
    global sizes are equal stands in the way. For each grown key the planner sees the checkpoint's
    metadata with the *model's* global size and the *saved* chunks: the overlaps are then exactly
    the saved rows [0, old rows) of each local shard's columns, and the rows after them are read
    from nowhere, so they keep what the state dict held (the model's fresh initialization)."""

    def __init__(self, grown: Mapping[str, Tuple[torch.Size, torch.Size]]) -> None:
        super().__init__()
        self._grown = dict(grown)

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        import dataclasses

        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        if metadata is not None:
            entries = dict(metadata.state_dict_metadata)
            for fqn, (_, new) in self._grown.items():
                md = entries[fqn]
                entries[fqn] = TensorStorageMetadata(properties=md.properties, size=new, chunks=md.chunks)
            metadata = dataclasses.replace(metadata, state_dict_metadata=entries)
        super().set_up_planner(state_dict, metadata, is_coordinator)


def load_model(model: nn.Module, directory: str, say=None) -> Dict[str, Any]:
    """Loads a checkpoint written by :func:`save_model` into ``model`` (any layout); returns its
    meta.json.

    When every shape matches: a plain ``dcp.load``. When some embedding tables of the model have
    MORE rows than the checkpoint's (same feature, same dimension: the data set's vocabularies grew
    since, new ids got rows appended), each such table's first rows are the checkpoint's, bit for
    bit, and the rows after them keep the model's fresh initialization (see
    :class:`_GrowingLoadPlanner`); every other tensor loads as usual. Sharded tables (table-wise,
    column-wise, data-parallel, one or several sharding groups) are read shard by shard through
    DCP's resharding: memory as in a plain load (DCP reads, one at a time, each saved chunk that
    overlaps a local shard), no full copy of an old table per rank. The check reads the
    checkpoint's ``.metadata`` once more than a plain load does. A table that shrinks or changes
    dimension, a feature added or removed, or any other shape change (e.g. the dense inputs) raises
    :class:`CheckpointMismatch` naming the feature or key and both sizes, before anything is read.
    ``say``: called with one line naming the grown tables (default: print on rank 0)."""
    if not os.path.isfile(os.path.join(directory, ".metadata")):
        raise FileNotFoundError(f"{directory}: not a checkpoint written by recsys_hdet (no .metadata)")
    state = {"model": model.state_dict()}
    saved = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    grown = grown_tables(state["model"], saved, directory)
    if not grown:
        dcp.load(state, checkpoint_id=directory)
    else:
        if say is None:
            say = (lambda line: print(line, flush=True)) if not dist.is_initialized() or dist.get_rank() == 0 \
                else (lambda line: None)
        tables = ", ".join(f"{_table_feature(k)} {o[0]} -> {n[0]} rows" for k, (o, n) in sorted(grown.items()))
        say(f"{directory}: embedding tables grow ({tables}): the checkpoint's rows load into their first rows, "
            "the new rows keep their fresh initialization")
        dcp.load(state, checkpoint_id=directory, planner=_GrowingLoadPlanner(grown))
    model.load_state_dict(state["model"])
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# Periodic, resumable checkpoints

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
                with open(os.path.join(tmp, MANIFEST), "w") as f:
                    json.dump(body, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
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
