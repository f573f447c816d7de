"""One-pass reader of day-partitioned Parquet into TorchRec batches.

Design:
- The stream is the days in order (the production setting: one pass, never repeated). A day is
  loaded whole (only the columns the model may see, plus labels), optionally shuffled within the
  day by a generator seeded from ``(seed, day)``, and cut into global batches of
  ``batch_size x world_size`` rows; rank ``r`` takes rows ``[r*B, (r+1)*B)`` of each global batch,
  so the ranks' slices are disjoint and every rank runs the same number of steps (collectives in
  the sharded model need that). A training rank reads the whole day file but permutes, gathers and
  normalizes only its own rows (and the reserved ones). The remainder of a day that does not fill a global batch is
  dropped in training; in evaluation it is padded, with a mask, so every row is scored.
- ``read="own_row_groups"`` (``data.read``; day files in layout 2): a training rank decodes only the
  row groups dealt to it (:func:`~recsys_hdet.components.dataset.deal_row_groups`: about
  ``1 / world_size`` of each day plus a few shared groups), shuffles its rows and runs the step
  count every rank can fill. Another stream order than ``whole_day``'s (the same for a seed, so
  resume is exact); a layout-1 data set is refused with the command that rewrites it.
- Features, labels, which rows a day contributes (exposure, holdout) and the dense normalization
  are the data set's (:mod:`recsys_hdet.components.dataset`); ``Batch.extras`` carries columns that are
  never model inputs (oracle probabilities, raw ids) for evaluation only when asked for.
- Position = (day index, batch index within the day); ``state_dict``/``load_state_dict`` restore it.
- ``reserve_rows``: the last rows of each day (in stream order) are never trained on; every rank
  can score them (:meth:`ParquetBatchStream.reserved_batches`, the same rows on every rank), e.g.
  as HDET's probe: a comparison of the replicas on identical data the pass does not train on.
- ``exposure``: with ``"standard"`` the random-exposure rows are dropped before shuffling and
  batching, so the day's row count, batches and reserved rows are those of its standard rows.
- ``holdout``: the rows held out of every day are never read by a training stream; a stream with
  ``part="holdout"`` reads only them.

Limits: a rank's share of a day must fit in memory (``whole_day`` decodes the whole day first);
multi-day files are not split.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import torch
from torchrec import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from data_tools.contract import RAND_COLUMN, label_column
from recsys_hdet.components.dataset import (DAY_READS, DatasetMeta, DenseNormalization, RankShare, RowHoldout,
                                            day_rows, deal_row_groups, kept_mask, part_mask, standard_rows)
from recsys_hdet.components.openmp import single_openmp_thread


@dataclass
class Batch(Pipelineable):
    """One rank's rows. A TorchRec ``Pipelineable``: the train pipeline moves it to the model's
    device (``to``, on its copy stream on CUDA, from pinned memory) and marks the streams that use it."""

    dense: torch.Tensor  # [B, num_dense] float32
    sparse: KeyedJaggedTensor  # keys = sparse feature names, B rows each
    labels: torch.Tensor  # [B, num_tasks] float32
    mask: torch.Tensor  # [B] bool, False on padding rows (evaluation only)
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)  # oracle/raw ids, eval only

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.sparse.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking),
                     self.mask.to(device, non_blocking=non_blocking),
                     {k: v.to(device, non_blocking=non_blocking) for k, v in self.extras.items()})

    def record_stream(self, stream: torch.Stream) -> None:
        for t in (self.dense, self.labels, self.mask, *self.extras.values()):
            t.record_stream(stream)
        self.sparse.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(),
                     self.mask.pin_memory(), {k: v.pin_memory() for k, v in self.extras.items()})


class _DayArrays:
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
        if share is not None:  # a rank's dealt row groups alone; the share's rows are already in stream order
            df, order = _read_share(meta, day, columns, share)
        else:
            df = pl.read_parquet(meta.day_path(day), columns=columns + ([RAND_COLUMN] if drop_random else []))
            if keep is not None:  # the holdout's part, by position in the file: before anything else
                if len(keep) != df.height:
                    raise ValueError(f"{meta.day_path(day)}: {df.height} rows, meta.json says {len(keep)}")
                df = df.filter(pl.Series(keep))
            if drop_random:
                df = df.filter(standard_rows).drop(RAND_COLUMN)
            # Columns to arrays in file order, then each array permuted at once (np.take on the
            # contiguous axis: cheaper than permuting the frame's rows in polars, 0.27 s per bench day).
            order = np.random.default_rng([seed, int(day)]).permutation(df.height) if shuffle else None
            if positions is not None:  # the file rows at those stream positions
                order = order[positions] if order is not None else positions
        take = (lambda x, axis=0: np.take(x, order, axis=axis)) if order is not None else \
            (lambda x, axis=0: np.array(x, order="C"))  # a writable copy (polars' arrays may be read-only)
        self.rows = len(order) if order is not None else df.height
        # [F, rows]: a batch's single-valued ids are one slice, already in the KJT's key-major order
        # (polars gives a column-major [rows, F] array: its transpose is contiguous)
        single = df.select(meta.single_features).to_numpy().astype(np.int64, copy=False)
        self.single_t = torch.from_numpy(take(single.T, axis=1))
        self.multi_lengths: List[torch.Tensor] = []
        self.multi_offsets: List[torch.Tensor] = []
        self.multi_values: List[torch.Tensor] = []
        for name in meta.multi_features:
            lengths = torch.from_numpy(df[name].list.len().fill_null(0).to_numpy().astype(np.int64))
            values = torch.from_numpy(df[name].explode().drop_nulls().to_numpy().astype(np.int64))
            if order is not None:
                rows = torch.from_numpy(order)
                values = _jagged_rows(values, _offsets(lengths), lengths, rows)
                lengths = lengths[rows]
            self.multi_lengths.append(lengths)
            self.multi_offsets.append(_offsets(lengths))
            self.multi_values.append(values)
        # [D, rows] (the transpose of polars' column-major array is contiguous): rows taken along the
        # contiguous axis first, then the elementwise normalization in float64, so the values are the
        # same whatever rows are taken and in what order (null, missing -> NaN -> 0)
        dense = take(df.select(meta.dense).to_numpy().T, axis=1).T.astype(np.float64)
        dense = normalization.apply(dense) if normalization is not None else np.nan_to_num(dense, nan=0.0)
        self.dense = torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32))
        self.labels = torch.from_numpy(take(df.select(label_cols).to_numpy().astype(np.float32, copy=False)))
        self.extras = {c: torch.from_numpy(take(df[c].to_numpy())) for c in extras}


def _read_share(meta: DatasetMeta, day: str, columns: List[str], share: RankShare) -> tuple[pl.DataFrame, np.ndarray]:
    """The share's row groups of the day file, and the share's rows as positions in what was read."""
    path = meta.day_path(day)
    starts = np.concatenate([[0], np.cumsum(meta.row_groups(day), dtype=np.int64)])
    table = pq.ParquetFile(path).read_row_groups(share.groups.tolist(), columns=columns)
    read_starts = np.concatenate([[0], np.cumsum(starts[share.groups + 1] - starts[share.groups])])
    group = np.searchsorted(starts, share.rows, side="right") - 1
    local = share.rows - starts[group] + read_starts[np.searchsorted(share.groups, group)]
    return pl.from_arrow(table), local.astype(np.int64, copy=False)


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


def _jagged_rows(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The values of a jagged array's ``rows``, concatenated in that order."""
    row_lengths = lengths[rows]
    # each row's slice: positions offsets[row] + [0, length)
    rel = torch.arange(int(row_lengths.sum())) - torch.repeat_interleave(row_lengths.cumsum(0) - row_lengths, row_lengths)
    return values[torch.repeat_interleave(offsets[rows], row_lengths) + rel]


class ParquetBatchStream:
    """Iterates this rank's batches over ``days`` once. See the module docstring for the layout."""

    def __init__(
        self,
        meta: DatasetMeta,
        days: Sequence[str],
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle_within_day: bool = True,
        pad_last: bool = False,
        extras: Sequence[str] = (),
        reserve_rows: int = 0,
        exposure: str = "all",
        normalization: Optional[DenseNormalization] = None,
        holdout: Optional[RowHoldout] = None,
        part: str = "train",
        read: str = "whole_day",
    ) -> None:
        self.meta = meta
        if read not in DAY_READS:
            raise ValueError(f"read={read!r}: one of {DAY_READS}")
        # own_row_groups: a training stream reads only the row groups dealt to its rank (evaluation,
        # with its padded batches, reads whole days either way)
        self.deals_row_groups = read == "own_row_groups" and not pad_last
        if self.deals_row_groups:
            meta.require_row_groups()
        self._deal_batches: Dict[str, int] = {}
        if normalization is not None:
            normalization.check(meta)
        self.normalization = normalization  # None: raw values, missing -> 0 (tests and tools only)
        self.exposure = exposure
        self.holdout = holdout
        self.part = part
        # validates exposure and part (and the column "standard" needs)
        self._rows = day_rows(meta, days, exposure, holdout, part)
        self.reserve_rows = reserve_rows
        self._recent_days: Dict[int, _DayArrays] = {}  # the last days read (for their reserved rows)
        self.days = list(days)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle_within_day
        self.pad_last = pad_last
        self.extras = list(extras)
        self._day_index = 0
        self._batch_index = 0

    # -- sizes -------------------------------------------------------------------------------
    def rows_in_day(self, day: str) -> int:
        """The day's rows this stream reads (its standard-exposure rows under ``exposure="standard"``)."""
        if day not in self._rows:
            self._rows.update(day_rows(self.meta, [day], self.exposure, self.holdout, self.part))
        return self._rows[day]

    def batches_in_day(self, day: str) -> int:
        if self.deals_row_groups:
            if day not in self._deal_batches:
                self._deal_batches[day] = self._share(day, rows=False).batches
            return self._deal_batches[day]
        rows = self.rows_in_day(day) - self.reserve_rows
        global_batch = self.batch_size * self.world_size
        return -(-rows // global_batch) if self.pad_last else rows // global_batch

    def __len__(self) -> int:
        return sum(self.batches_in_day(d) for d in self.days)

    @property
    def examples_per_step(self) -> int:
        return self.batch_size * self.world_size

    # -- position ----------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, int]:
        """The position of the batches produced so far (a train pipeline reads ahead of the ones
        trained on: checkpoint :meth:`position_after` the steps taken instead)."""
        return {"day_index": self._day_index, "batch_index": self._batch_index}

    def position_after(self, batches: int) -> Dict[str, int]:
        """The position (as :meth:`state_dict`) right after the first ``batches`` batches of the pass
        were produced: where a job that trained on them goes on from."""
        before = 0
        for day_index, day in enumerate(self.days):
            n = self.batches_in_day(day)
            if batches <= before + n and (batches > before or day_index == 0):
                return {"day_index": day_index, "batch_index": batches - before}
            before += n
        return {"day_index": len(self.days), "batch_index": 0}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self._day_index = int(state["day_index"])
        self._batch_index = int(state["batch_index"])

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """The batches from the current position on. The next day with batches to read is read and
        shuffled in a background thread while this one's batches are produced, so a step never waits
        for a day file (polars and numpy release the GIL for most of it); the arrays, and so the
        batches, are the same as read in line."""
        # the reader's torch ops run on its own thread alone (components/openmp.py: a second OpenMP
        # team would slow every parallel region of the training thread)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="day-reader", initializer=single_openmp_thread) as reader:
            ahead: Dict[int, Future] = {}
            while self._day_index < len(self.days):
                day_index, n_batches = self._day_index, self.batches_in_day(self.days[self._day_index])
                if self._batch_index < n_batches:
                    future = ahead.pop(day_index, None) or reader.submit(self._read_day, day_index)
                    following = next((i for i in range(day_index + 1, len(self.days))
                                      if self.batches_in_day(self.days[i]) > 0), None)
                    if following is not None:
                        ahead[following] = reader.submit(self._read_day, following)
                    arrays = self._remember(day_index, future.result())
                    while self._batch_index < n_batches:
                        batch = self._make_batch(arrays, self._batch_index)
                        self._batch_index += 1
                        yield batch
                self._day_index += 1
                self._batch_index = 0

    def _read_day(self, day_index: int) -> "_DayArrays":
        day = self.days[day_index]
        if self.deals_row_groups:
            return _DayArrays(self.meta, day, self.seed, self.shuffle, self.extras,
                              normalization=self.normalization, share=self._share(day))
        keep = part_mask(self.holdout, self.part, day, int(self.meta.days[day]["rows"]))
        return _DayArrays(self.meta, day, self.seed, self.shuffle, self.extras,
                          drop_random=self.exposure == "standard", normalization=self.normalization, keep=keep,
                          positions=self._rank_positions(day))

    def _share(self, day: str, rows: bool = True) -> RankShare:
        """This rank's row groups and rows of ``day`` under ``own_row_groups`` (:func:`deal_row_groups`)."""
        return deal_row_groups(kept_mask(self.meta, day, self.exposure, self.holdout, self.part),
                               self.meta.row_groups(day), self.rank, self.world_size, self.batch_size,
                               self.reserve_rows, self.seed, day, self.shuffle, rows=rows)

    @property
    def _reads_own_rows(self) -> bool:
        """A training rank reads only its rows of a day: its row groups (``own_row_groups``), or, of
        several ranks, its positions in the whole day's stream (:meth:`_rank_positions`)."""
        return self.deals_row_groups or (self.world_size > 1 and not self.pad_last)

    def _rank_positions(self, day: str) -> Optional[np.ndarray]:
        """The stream positions this rank reads of ``day`` when it reads only its own (several ranks,
        training: no padded last batch): its rows of each global batch, then the reserved tail.
        None: the whole day (one rank, or evaluation's padded batches)."""
        if not self._reads_own_rows:
            return None
        B, n = self.batch_size, self.batches_in_day(day)
        firsts = np.arange(n, dtype=np.int64) * (B * self.world_size) + self.rank * B
        own = (firsts[:, None] + np.arange(B, dtype=np.int64)).reshape(-1)
        rows = self.rows_in_day(day)
        return np.concatenate([own, np.arange(rows - self.reserve_rows, rows, dtype=np.int64)])

    def _remember(self, day_index: int, arrays: "_DayArrays") -> "_DayArrays":
        if self.reserve_rows:
            # The days a train pipeline may still be training on (it reads up to two batches ahead).
            self._recent_days[day_index] = arrays
            for old in sorted(self._recent_days)[:-3]:
                del self._recent_days[old]
        return arrays

    def reserved_batches(self, batch_size: int, trained_steps: int, skip_rows: int = 0) -> List[Batch]:
        """The reserved rows (identical on every rank) of the day of the last batch trained on, after
        ``trained_steps`` steps of the pass, from the ``skip_rows``-th on, in batches of ``batch_size``."""
        if self.reserve_rows == 0 or trained_steps < 1:
            raise RuntimeError("reserved_batches: no rows are reserved, or no batch was trained on yet")
        day_index = self.position_after(trained_steps)["day_index"]
        a = self._recent_days.get(day_index)
        if a is None:
            a = self._remember(day_index, self._read_day(day_index))
        first = a.rows - self.reserve_rows + skip_rows
        return [self._slice(a, start, min(start + batch_size, a.rows)) for start in range(first, a.rows, batch_size)]

    def _make_batch(self, a: _DayArrays, index: int) -> Batch:
        B = self.batch_size
        # the arrays hold this rank's batches one after another when it read only its own rows
        start = index * B if self._reads_own_rows else index * B * self.world_size + self.rank * B
        stop = min(start + B, a.rows)
        start = min(start, a.rows)
        if stop - start == B:  # a whole batch: slices of the day's arrays (they are in stream order)
            return self._slice(a, start, stop)
        idx = torch.arange(start, stop)
        pad = B - len(idx)
        mask = torch.ones(B, dtype=torch.bool)
        # Padding repeats row 0 of the day (any valid row works) and is masked out.
        idx = torch.cat([idx, torch.zeros(pad, dtype=torch.int64)])
        mask[B - pad :] = False
        return self._gather(a, idx, mask)

    def _slice(self, a: _DayArrays, start: int, stop: int) -> Batch:
        """Rows [start, stop) of the day in stream order, without a gather."""
        values = [a.single_t[:, start:stop].reshape(-1)]
        lengths = [torch.ones(a.single_t.shape[0] * (stop - start), dtype=torch.int32)]
        for offsets, vals, lens in zip(a.multi_offsets, a.multi_values, a.multi_lengths):
            values.append(vals[int(offsets[start]) : int(offsets[stop])])
            lengths.append(lens[start:stop].to(torch.int32))
        return self._batch(a, values, lengths, slice(start, stop), torch.ones(stop - start, dtype=torch.bool))

    def _gather(self, a: _DayArrays, idx: torch.Tensor, mask: torch.Tensor) -> Batch:
        values = [a.single_t[:, idx].reshape(-1)]
        lengths = [torch.ones(a.single_t.shape[0] * len(idx), dtype=torch.int32)]
        for offsets, vals, lens in zip(a.multi_offsets, a.multi_values, a.multi_lengths):
            values.append(_jagged_rows(vals, offsets, lens, idx))
            lengths.append(lens[idx].to(torch.int32))
        return self._batch(a, values, lengths, idx, mask)

    def _batch(self, a: _DayArrays, values: List[torch.Tensor], lengths: List[torch.Tensor], rows, mask) -> Batch:
        sparse = KeyedJaggedTensor(
            keys=self.meta.single_features + self.meta.multi_features,
            values=torch.cat(values),
            lengths=torch.cat(lengths),
        )
        # dense, labels and extras: copies (a batch never shares memory with the day's arrays)
        return Batch(
            dense=a.dense[rows].clone() if isinstance(rows, slice) else a.dense[rows],
            sparse=sparse,
            labels=a.labels[rows].clone() if isinstance(rows, slice) else a.labels[rows],
            mask=mask,
            extras={k: v[rows].clone() if isinstance(rows, slice) else v[rows] for k, v in a.extras.items()},
        )


class TrainedPosition:
    """The checkpointed position of a training stream: right after the batches trained on
    (``trained_steps()``), wherever a train pipeline reading ahead has got to."""

    def __init__(self, stream: ParquetBatchStream, trained_steps) -> None:
        self.stream = stream
        self.trained_steps = trained_steps

    def state_dict(self) -> Dict[str, int]:
        return self.stream.position_after(self.trained_steps())

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.stream.load_state_dict(state)


