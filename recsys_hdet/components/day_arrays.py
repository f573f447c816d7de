"""A day's rows as contiguous tensors in stream order (:class:`DayArrays`): decoded from its Parquet file (the
whole day, or a rank's dealt row groups), the holdout's and the exposure's rows dropped, shuffled by
``(seed, day)``, the multi-valued features as jagged arrays, the dense inputs normalized. The loader
(:mod:`recsys_hdet.components.dataloader`) cuts batches from them.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from data_tools import contract
from data_tools.contract import RAND_COLUMN, label_column
from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, RankShare, standard_rows


class DayArrays:
    """A day's rows as contiguous tensors, in stream order; with ``positions`` (ascending positions
    in the day's stream order) only those rows, in that order, ``rows`` then counting them.

    A training rank keeps only its own batches' rows and the reserved tail (every rank scores
    those): the permutation, the jagged gathers and the dense normalization then touch a
    ``1 / world_size`` share of the day. The rows it keeps are the ones it would have sliced from
    the whole day, bit for bit (the normalization is elementwise). With ``share`` (``own_row_groups``)
    only the share's row groups are decoded and its rows, already in stream order, are kept."""

    def __init__(self, meta: DatasetMeta, day: str, seed: int, shuffle: bool, extras: Sequence[str],
                 drop_random: bool = False, normalization: Optional[DenseNormalization] = None,
                 keep: Optional[np.ndarray] = None, positions: Optional[np.ndarray] = None,
                 share: Optional[RankShare] = None) -> None:
        label_cols = [label_column(t) for t in meta.tasks]
        columns = meta.single_features + meta.multi_features + meta.dense + label_cols + list(extras)
        # order: the rows the stream reads, as positions in what was decoded, in stream order (None: all, as read)
        if share is not None:  # a rank's dealt row groups alone; the share's rows are already in stream order
            df, order = read_share(meta, day, columns, share)
        else:
            df = pl.read_parquet(meta.day_path(day), columns=columns + ([RAND_COLUMN] if drop_random else []))
            read = keep  # the holdout's part, by position in the file
            if keep is not None and len(keep) != df.height:
                raise ValueError(f"{meta.day_path(day)}: {df.height} rows, {contract.META_FILE} says {len(keep)}")
            if drop_random:
                standard = df.select(standard_rows).to_series().to_numpy()
                read = standard if read is None else read & standard
            kept = np.flatnonzero(read) if read is not None else None  # file positions of the rows read
            # The day's stream is the kept rows shuffled by (seed, day); positions pick some of it. The
            # columns are never filtered or permuted as frames: each is gathered once, in stream order.
            rows = len(kept) if kept is not None else df.height
            order = np.random.default_rng([seed, int(day)]).permutation(rows) if shuffle else None
            if positions is not None:
                order = order[positions] if order is not None else positions
            if kept is not None:
                order = kept[order] if order is not None else kept

        def rows_of(name: str) -> np.ndarray:
            """The column's values in stream order: a new, writable array (polars' arrays may be read-only)."""
            x = df[name].to_numpy()
            return np.take(x, order) if order is not None else np.array(x)

        self.rows = n = len(order) if order is not None else df.height
        # [F, rows]: a batch's single-valued ids are one slice, already in the KJT's key-major order
        single = np.empty((len(meta.single_features), n), dtype=np.int64)
        for f, name in enumerate(meta.single_features):
            single[f] = rows_of(name)
        self.single_t = torch.from_numpy(single)
        # per multi-valued feature: its rows' lengths (int32, as a KJT holds them), their offsets in its
        # values (a batch's values are one slice) and the values
        self.multi_lengths: List[torch.Tensor] = []
        self.multi_offsets: List[np.ndarray] = []
        self.multi_values: List[torch.Tensor] = []
        for name in meta.multi_features:
            lengths, values = list_column(df[name])
            if order is not None:
                values = jagged_rows(values, jagged_offsets(lengths), order)
                lengths = lengths[order]
            self.multi_lengths.append(torch.from_numpy(lengths.astype(np.int32)))
            self.multi_offsets.append(jagged_offsets(lengths))
            self.multi_values.append(torch.from_numpy(values))
        # [rows, D] float32: each feature's rows taken first, then normalized elementwise in float64
        # (DenseNormalization.apply, one column at a time), so the values are the same whatever rows are
        # taken and in what order (null, missing -> NaN -> 0)
        dense = np.empty((n, len(meta.dense)), dtype=np.float32)
        x = np.empty(n, dtype=np.float64)
        for i, name in enumerate(meta.dense):
            x[:] = rows_of(name)
            if normalization is not None:
                normalization.apply_column(i, x)
            else:
                np.nan_to_num(x, copy=False, nan=0.0)
            dense[:, i] = x
        self.dense = torch.from_numpy(dense)
        labels = np.empty((n, len(label_cols)), dtype=np.float32)
        for t, name in enumerate(label_cols):
            labels[:, t] = rows_of(name)
        self.labels = torch.from_numpy(labels)
        self.extras = {c: torch.from_numpy(rows_of(c)) for c in extras}


def read_share(meta: DatasetMeta, day: str, columns: List[str], share: RankShare) -> tuple[pl.DataFrame, np.ndarray]:
    """The share's row groups of the day file, and the share's rows as positions in what was read."""
    file = pq.ParquetFile(meta.day_path(day))
    group_rows = np.array([file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)])
    starts = np.concatenate([[0], np.cumsum(group_rows, dtype=np.int64)])
    table = file.read_row_groups(share.groups.tolist(), columns=columns)
    # a row of group g read as the k-th group: at read_starts[k] + (row - starts[g])
    shift = np.zeros(len(group_rows), dtype=np.int64)
    read_rows = group_rows[share.groups]
    shift[share.groups] = np.cumsum(read_rows) - read_rows - starts[share.groups]
    size = int(group_rows[0]) if len(group_rows) else 0
    if size and group_rows[-1] <= size and np.array_equal(starts[:-1], np.arange(len(group_rows)) * size):
        group = share.rows // size  # groups of one size but the last (layout 2): no search
    else:
        group = np.searchsorted(starts, share.rows, side="right") - 1
    return pl.from_arrow(table), (share.rows + shift[group]).astype(np.int64, copy=False)


def list_column(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A list column's lengths (a null list: 0) and its non-null values, concatenated (int64 arrays; from
    its Arrow offsets: what ``list.len().fill_null(0)`` and ``explode().drop_nulls()`` give, without a frame)."""
    lists = column.to_arrow()
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = lists.flatten().drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, values


def jagged_offsets(lengths: np.ndarray) -> np.ndarray:
    """Where each row's values start in a jagged array's values, and the end: ``len(lengths) + 1`` int64s."""
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths, dtype=np.int64)])


def jagged_rows(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The values of a jagged array's ``rows`` (``offsets``: :func:`jagged_offsets`), concatenated in that order."""
    row_lengths = offsets[rows + 1] - offsets[rows]
    ends = np.cumsum(row_lengths)
    # each row's slice: positions offsets[row] + [0, length), shifted to its place in the result
    shift = np.repeat(offsets[rows] - (ends - row_lengths), row_lengths)
    return values[shift + np.arange(len(shift))]
