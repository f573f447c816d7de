"""The request a serving system sends ``raw_model.pt2`` for a raw KuaiRand-schema log's rows, built from the
raw files: the log's impressions with the user's and the video's feature rows joined as a feature store holds
them (docs/serving.md, "Raw requests", lists the inputs). tests/test_serving_raw.py scores such requests
against ``predict``; ``benchmarks/gpu_check.py --save-raw-inputs`` saves one as a plain torch file, so that
a machine with torch alone can run the raw program on it.

Needs polars (the machine that has the files); the request is plain tensors. Limit: the feature files are
read and joined whole, each call: a tool for tests and benchmarks, not a serving path.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Tuple, Union

import numpy as np
import polars as pl
import torch

Table = Union[str, os.PathLike, pl.DataFrame]


def _strings(table: Table) -> pl.DataFrame:
    """A CSV read with every column a string, as the converter reads it; a DataFrame as given (read so)."""
    return table if isinstance(table, pl.DataFrame) else pl.read_csv(table, infer_schema=False)


def raw_request(log: Table, users: Table, videos: Table,
                manifest: Mapping[str, Any]) -> Tuple[Dict[str, torch.Tensor], pl.DataFrame]:
    """The request for the log's rows, in the log's order, from the raw files (paths, or DataFrames of strings
    as ``pl.read_csv(path, infer_schema=False)`` gives): ids as int64 (-1: none), string categoricals as the
    manifest's codes, values float64 (NaN: empty), dates YYYYMMDD (0: none), each row's raw tags. A log row
    whose user or video has no feature row gets that row's missing values. Returns the tensors and the rows'
    keys (``user_id_raw``, ``video_id_raw``, ``time_ms``)."""
    df = _strings(log).with_columns(pl.col("user_id", "video_id").cast(pl.Int64))
    df = df.join(_strings(users).with_columns(pl.col("user_id").cast(pl.Int64)), on="user_id", how="left",
                 maintain_order="left") \
        .join(_strings(videos).with_columns(pl.col("video_id").cast(pl.Int64)), on="video_id", how="left",
              maintain_order="left")
    columns = {c: pl.col(c).cast(pl.Int64) for c in ("user_id", "video_id", "tab", "date", "hourmin")}
    columns.update({c: pl.col(c).cast(pl.Float64).cast(pl.Int64).fill_null(-1) for c in ("author_id", "music_id")})
    columns.update({c: pl.col(c).replace_strict(values, list(range(1, len(values) + 1)), default=0,
                                                return_dtype=pl.Int64).fill_null(0)
                    for c, values in manifest["string_vocabs"].items()})
    columns.update({c: pl.col(c).cast(pl.Float64).fill_null(float("nan")) for c, spec in
                    manifest["raw_program"]["inputs"].items() if spec["dtype"] == "float64"})
    columns["upload_dt"] = pl.col("upload_dt").str.replace_all("-", "").cast(pl.Int64).fill_null(0)
    table = df.select(**columns, tags=pl.col("tag").str.split(",").list.eval(pl.element().cast(pl.Int64))
                      .fill_null(pl.lit([], dtype=pl.List(pl.Int64))), time_ms=pl.col("time_ms").cast(pl.Int64))
    request = {c: torch.from_numpy(table[c].to_numpy()) for c in columns}
    lengths = table["tags"].list.len().to_numpy().astype(np.int64)
    request["tag_offsets"] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    request["tag_values"] = torch.from_numpy(table["tags"].explode().drop_nulls().to_numpy().astype(np.int64))
    return request, table.select(user_id_raw="user_id", video_id_raw="video_id", time_ms="time_ms")
