"""Model checkpoints with ``torch.distributed.checkpoint`` (DCP).

DCP stores each rank's shards once, with global metadata, so a checkpoint written under one
parallel layout loads under another (different world size or sharding group size): that is
what makes the final model usable both for evaluation and as a warm start. The checkpoint is
written into ``checkpoint.tmp/`` and renamed to ``checkpoint/`` by rank 0 after every rank is
done, so a crash never leaves a directory that looks complete.

Saved: the model's state (``model``) and a small ``meta.json`` (steps, examples, experiment).
Replicated state (dense parameters on every rank, embedding shards in every sharding group) is
written once: DCP's default save planner deduplicates items with the same key and offsets.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Mapping

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn


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
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    dist.barrier()


def load_model(model: nn.Module, directory: str) -> Dict[str, Any]:
    """Loads a checkpoint written by :func:`save_model` into ``model`` (any layout)."""
    if not os.path.isfile(os.path.join(directory, ".metadata")):
        raise FileNotFoundError(f"{directory}: not a checkpoint written by recsys_hdet (no .metadata)")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=directory)
    model.load_state_dict(state["model"])
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)
