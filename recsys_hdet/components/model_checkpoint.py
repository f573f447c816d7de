"""The model checkpoint with ``torch.distributed.checkpoint`` (DCP): the final model a run keeps, what
evaluation scores and a warm start loads.

DCP stores each rank's shards once, with global metadata, so a checkpoint written under one
parallel layout loads under another (different world size or sharding group size): that is
what makes the final model usable both for evaluation and as a warm start. The checkpoint is
written into ``checkpoint.tmp/`` and renamed to ``checkpoint/`` by rank 0 after every rank is
done, so a crash never leaves a directory that looks complete.

Saved: the model's state (``model``) and a small meta file (:data:`META_FILE`: steps, examples, experiment). A warm
start into a model whose tables grew (a vocabulary that gained ids) loads the saved rows into the
first rows of each grown table (:func:`grown_tables`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from data_tools import contract

STEP_PREFIX = "step-"  # checkpoint/step-<N>: a periodic checkpoint (CheckpointManager)
META_FILE = contract.META_FILE  # the checkpoint's own meta (steps, model inputs, normalization), named as a data set's


def read_meta(directory: str) -> Dict[str, Any]:
    """The meta file :func:`save_model` wrote into the checkpoint ``directory`` (OSError, ValueError:
    unreadable)."""
    with open(os.path.join(directory, META_FILE)) as f:
        return json.load(f)


def save_model(model: nn.Module, directory: str, meta: Mapping[str, Any]) -> None:
    tmp = directory + ".tmp"
    if dist.get_rank() == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)
    dist.barrier()
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(tmp, META_FILE), "w") as f:
            json.dump(dict(meta), f, indent=2)
        if os.path.exists(directory):
            # Periodic checkpoints of the run (checkpoint/step-<N>) move along: they are removed
            # only once RunDir.SUMMARY is written.
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
    meta file.

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
    return read_meta(directory)
