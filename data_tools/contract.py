"""The processed data set's contract (DATA_CONTRACT.md), owned here: the converter writes it, the
validator checks it, and the loader, evaluation, serving, the retraining job, the studies and the
benchmarks read it, all through these names.

- The directory: ``meta.json`` (:data:`META_FILE`; :func:`meta_path`, :func:`has_meta`,
  :func:`read_meta`, :func:`write_meta`) and one Parquet file per day, ``day=YYYYMMDD.parquet``
  (:func:`day_file`; readers go by ``meta.json``'s ``days.<day>.file``, never by the name).
- The versions: :data:`FORMAT_VERSION` (meta.json's ``format_version``), :data:`LAYOUT_VERSION`
  (meta.json's ``layout``: day files cut into row groups of ``row_group_rows`` rows, default
  :data:`ROW_GROUP_ROWS`; an absent ``layout`` is version 1).
- The columns beside the features: ``label_<task>`` (:func:`label_column`), ``oracle_<task>``
  (:func:`oracle_column`, synthetic data only), ``is_rand`` (:data:`RAND_COLUMN`: 1 for a
  random-exposure impression; the raw KuaiRand log's column of the same name), and each row's
  source ids and time (:data:`SOURCE_COLUMNS`). None of them is a model input.

The feature lists and the tasks are :mod:`data_tools.schema`'s; the id vocabularies' files
(``vocab/<feature>.parquet``) are :mod:`data_tools.vocab`'s. This module imports nothing of the
project but the leaf :mod:`data_tools.fileio`, so every other module can build on it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from data_tools.fileio import write_text_atomic

# 2: exact id vocabularies (was: hashed ids), dense values null where missing with indicators and
# per-day statistics, is_rand kept.
FORMAT_VERSION = 2
# meta.json "layout": how day files are cut into row groups. 1 (absent): as polars wrote them (a few
# large groups); 2: groups of layout.row_group_rows rows (the last one shorter), the unit that
# data.read=own_row_groups deals to the training ranks. The rows and their order are the same.
LAYOUT_VERSION = 2
ROW_GROUP_ROWS = 16_384

# ---- files -------------------------------------------------------------------------------------
META_FILE = "meta.json"


def meta_path(root: str) -> str:
    """The data set's ``meta.json`` (``root``: the processed data set's directory)."""
    return os.path.join(root, META_FILE)


def has_meta(root: str) -> bool:
    """Whether ``root`` holds a ``meta.json`` (a processed data set, not yet validated)."""
    return os.path.isfile(meta_path(root))


def read_meta(root: str) -> Dict[str, Any]:
    """``meta.json`` of the data set at ``root`` as written (OSError, ValueError: unreadable; the
    validator's checked reader is ``data_tools.validate._load_meta``)."""
    with open(meta_path(root)) as f:
        return json.load(f)


def write_meta(directory: str, meta: Dict[str, Any]) -> None:
    """Writes ``meta.json`` into ``directory`` as the converter does (a conversion's or an append's
    stage; a temporary name, then a rename)."""
    write_text_atomic(meta_path(directory), json.dumps(meta, indent=1))


def day_file(date: int | str) -> str:
    """The file name of day ``date`` (YYYYMMDD) as the converter writes it."""
    return f"day={date}.parquet"


# ---- columns that are not features ----------------------------------------------------------------
LABEL_PREFIX = "label_"  # label_<task>: Float32 in {0, 1}
ORACLE_PREFIX = "oracle_"  # oracle_<task>: Float32 in (0, 1), the generator's true probability (has_oracle)
RAND_COLUMN = "is_rand"  # Int8 0/1: 1 for a random-exposure impression (the unbiased sample)
RAW_ID_COLUMNS = ("user_id_raw", "video_id_raw")  # the source ids (Int64), for segmenting reports
SOURCE_COLUMNS = (*RAW_ID_COLUMNS, "date", "time_ms")  # a row's source ids and time (Int64)


def label_column(task: str) -> str:
    return f"{LABEL_PREFIX}{task}"


def oracle_column(task: str) -> str:
    return f"{ORACLE_PREFIX}{task}"
