"""The config's value checks and choices, shared by every schema: :class:`ConfigError` (a value that
cannot run, naming the key, the value and what is allowed), the checks the schemas' ``__post_init__``
make, and the ``StrEnum`` choices (members compare, hash and print as their strings, so code reading a
config treats them as the strings the YAML files hold).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, Dict


def plain(node: Any) -> Any:
    """A config section (a typed dataclass of the schema, or an OmegaConf node) as plain Python values:
    dicts and lists, enums as their names, interpolations resolved (what a record or a log holds)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        node = OmegaConf.create(node)
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    """A nested dict as ``{"parent.key": value}`` (lists and other values are leaves)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: Dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and what is allowed."""


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config {key}={value!r}: {expected}")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def positive(key: str, value: Any) -> None:
    require(is_number(value) and value > 0, key, value, "must be a finite number > 0")


def at_least(key: str, value: Any, low: int) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= low, key, value,
            f"must be an integer >= {low}")


def fraction(key: str, value: Any, low_open: bool = False, high_open: bool = True) -> None:
    lo_ok = (value > 0) if low_open else (value >= 0)
    hi_ok = (value < 1) if high_open else (value <= 1)
    require(is_number(value) and lo_ok and hi_ok, key, value,
            f"must be in {'(' if low_open else '['}0, 1{')' if high_open else ']'}")


# ----------------------------------------------------------------------------------------------
# Choices


class TrainExposure(StrEnum):
    all = "all"              # train on every impression
    standard = "standard"    # drop the random-exposure impressions (is_rand = 1)


class DayRead(StrEnum):
    whole_day = "whole_day"            # every rank decodes the whole day file and keeps its rows (any layout)
    own_row_groups = "own_row_groups"  # a training rank reads only the row groups dealt to it (layout 2)


class DenseOptimizer(StrEnum):
    adam = "adam"
    adamw = "adamw"
    prodigy = "prodigy"
    schedulefree_adamw = "schedulefree_adamw"


class EmbeddingOptimizer(StrEnum):
    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"
    adam = "adam"            # fbgemm has it on CUDA only


CUDA_ONLY_EMBEDDING_OPTIMIZERS = (EmbeddingOptimizer.adam,)


class Schedule(StrEnum):
    one_cycle = "one_cycle"
    range_test = "range_test"   # the LR range test (a short run that sweeps the LR; plain runs only)


class AnnealStrategy(StrEnum):
    cos = "cos"
    linear = "linear"


class DenseGradients(StrEnum):
    allreduce = "allreduce"   # DDP: every step's dense gradient averaged over the world
    local = "local"           # none between HDET syncs (local SGD); the syncs average the replicas


class TrainPipeline(StrEnum):
    sparse_dist = "sparse_dist"   # TorchRec's TrainPipelineSparseDist (input all-to-all a batch ahead)
    base = "base"                 # TorchRec's TrainPipelineBase


class ShardingType(StrEnum):
    table_wise = "table_wise"
    column_wise = "column_wise"
    row_wise = "row_wise"
    table_row_wise = "table_row_wise"
    table_column_wise = "table_column_wise"
    data_parallel = "data_parallel"
