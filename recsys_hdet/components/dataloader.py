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
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from torchrec import KeyedJaggedTensor

from recsys_hdet.components.batch import Batch
from recsys_hdet.components.day_arrays import DayArrays, jagged_rows
from recsys_hdet.components.dataset import (DatasetMeta, DenseNormalization, RankShare, RowHoldout,
                                            day_rows, deal_row_groups, kept_mask, part_mask)
from recsys_hdet.components.openmp import single_openmp_thread
from recsys_hdet.config_values import DayRead


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
        read: str = DayRead.whole_day,
    ) -> None:
        self.meta = meta
        if read not in tuple(DayRead):
            raise ValueError(f"read={read!r}: one of {[str(r) for r in DayRead]}")
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
        self._recent_days: Dict[int, DayArrays] = {}  # the last days read (for their reserved rows)
        self.days = list(days)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle_within_day
        self.pad_last = pad_last
        self.extras = list(extras)
        self._keys = meta.single_features + meta.multi_features  # a KJT's keys, in its values' order
        self._ones_cache = torch.ones(0, dtype=torch.int32)
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

    def _read_day(self, day_index: int) -> "DayArrays":
        day = self.days[day_index]
        if self.deals_row_groups:
            return DayArrays(self.meta, day, self.seed, self.shuffle, self.extras,
                              normalization=self.normalization, share=self._share(day))
        keep = part_mask(self.holdout, self.part, day, int(self.meta.days[day]["rows"]))
        return DayArrays(self.meta, day, self.seed, self.shuffle, self.extras,
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

    def _remember(self, day_index: int, arrays: "DayArrays") -> "DayArrays":
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

    def _make_batch(self, a: DayArrays, index: int) -> Batch:
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

    def _slice(self, a: DayArrays, start: int, stop: int) -> Batch:
        """Rows [start, stop) of the day in stream order, without a gather: each array's slice, the
        single-valued ids of every feature one [F, rows] slice, a multi-valued feature's values the slice
        between its precomputed offsets."""
        values = torch.cat([a.single_t[:, start:stop].reshape(-1),
                            *(v[int(o[start]):int(o[stop])] for v, o in zip(a.multi_values, a.multi_offsets))])
        lengths = torch.cat([self._ones(a.single_t.shape[0] * (stop - start)),
                             *(lens[start:stop] for lens in a.multi_lengths)])
        return self._batch(a, values, lengths, slice(start, stop), torch.ones(stop - start, dtype=torch.bool))

    def _gather(self, a: DayArrays, idx: torch.Tensor, mask: torch.Tensor) -> Batch:
        rows = idx.numpy()
        values = torch.cat([a.single_t[:, idx].reshape(-1),
                            *(torch.from_numpy(jagged_rows(v.numpy(), o, rows))
                              for v, o in zip(a.multi_values, a.multi_offsets))])
        lengths = torch.cat([self._ones(a.single_t.shape[0] * len(idx)), *(lens[idx] for lens in a.multi_lengths)])
        return self._batch(a, values, lengths, idx, mask)

    def _ones(self, n: int) -> torch.Tensor:
        """n lengths of 1 (int32): the single-valued features' (read only; a batch's lengths are a new tensor)."""
        ones = self._ones_cache
        if ones.numel() != n:
            ones = self._ones_cache = torch.ones(n, dtype=torch.int32)
        return ones

    def _batch(self, a: DayArrays, values: torch.Tensor, lengths: torch.Tensor, rows, mask) -> Batch:
        sparse = KeyedJaggedTensor(keys=list(self._keys), values=values, lengths=lengths)
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


