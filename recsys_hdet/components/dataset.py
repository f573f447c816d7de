"""A processed data set as training and evaluation see it, apart from reading it: its metadata
(:class:`DatasetMeta`, ``contract.META_FILE``), which days train and which are held out (:func:`split_days`),
which rows of a day a stream reads (the exposure and the :class:`RowHoldout` policy,
:func:`day_rows`), and how dense inputs are standardized (:class:`DenseNormalization`). The stream
that reads the rows is :mod:`recsys_hdet.components.dataloader`; the files, versions and column
names of the format are :mod:`data_tools.contract`'s.

- Features are the names listed in the data set's meta (``contract.META_FILE``) under ``sparse`` and ``dense``; labels are
  ``label_<task>``. Columns such as ``oracle_*`` and raw ids are never model inputs.
- ``exposure``: ``"all"`` reads every row; ``"standard"`` drops the random-exposure rows
  (``is_rand`` = 1, the video shown uniformly at random); a day file without the column is refused,
  naming it.
- ``holdout`` (:class:`RowHoldout`): a fixed random slice of every day's rows (drawn per day from a
  seed, by position in the day file) that training never reads; a stream with ``part="holdout"``
  reads only that slice (the retraining gate scores it). Chosen in file order, so it is the same
  whatever the layout, batch size or shuffling.
- Dense inputs are standardized by :class:`DenseNormalization`: the mean and standard deviation of
  each dense feature over the *training* days only (from the per-day statistics the converter stores
  in the data set's meta), so no held-out day leaks into the inputs; a missing value becomes 0, the training
  mean, and its ``<name>_missing`` indicator says so. The trainer saves the normalization in the
  checkpoint's meta (``model_checkpoint.META_FILE``); evaluation and warm starts reuse it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from data_tools import contract
from data_tools.contract import RAND_COLUMN
from recsys_hdet.config_values import TrainExposure


@dataclass
class DatasetMeta:
    root: str
    sparse: Dict[str, Dict]  # name -> {"vocab": int, "multi": bool}
    dense: List[str]
    tasks: List[str]
    days: Dict[str, Dict]  # "YYYYMMDD" -> {"file": str, "rows": int}
    has_oracle: bool
    source: Dict = field(default_factory=dict)  # provenance (generator config, string vocabularies)
    # how the day files are cut into row groups: version 1 (absent) any; 2 groups of row_group_rows
    layout: Dict = field(default_factory=lambda: {"version": 1})

    @classmethod
    def load(cls, root: str) -> "DatasetMeta":
        meta = contract.read_meta(root)
        return cls(
            root=root,
            sparse=meta["sparse"],
            dense=list(meta["dense"]),
            tasks=list(meta["tasks"]),
            days=dict(sorted(meta["days"].items())),
            has_oracle=bool(meta.get("has_oracle", False)),
            source=dict(meta.get("source") or {}),
            layout=dict(meta.get("layout") or {"version": 1}),
        )

    def require_row_groups(self) -> None:
        """ValueError naming the data set and the command that rewrites it, unless its day files are cut
        into small row groups (layout 2) that ranks can be dealt."""
        if int(self.layout.get("version", 1)) < contract.LAYOUT_VERSION:
            raise ValueError(
                f"data.read=own_row_groups deals each day's row groups to the ranks, but the data set at {self.root} "
                f"has layout version {self.layout.get('version', 1)} (day files in a few large row groups, written "
                f"before layout 2): rewrite it once with `python -m data_tools.relayout data.root={self.root}` (same rows, same "
                f"order; minutes per 10M rows), or train with data.read=whole_day")

    def row_groups(self, day: str) -> List[int]:
        """The row counts of the day file's row groups (from its footer)."""
        meta = pq.read_metadata(self.day_path(day))
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]

    def day_path(self, day: str) -> str:
        return os.path.join(self.root, self.days[day]["file"])

    @property
    def single_features(self) -> List[str]:
        return [n for n, s in self.sparse.items() if not s.get("multi", False)]

    @property
    def multi_features(self) -> List[str]:
        return [n for n, s in self.sparse.items() if s.get("multi", False)]


@dataclass(frozen=True)
class RowHoldout:
    """A fixed slice of every day's rows never trained on: row i of day d (file order) is held out
    when the generator seeded by ``(seed, d)`` draws ``u_i < fraction``. Independent of the layout,
    batch size, shuffling and of the other days, so a day's slice never changes as days arrive."""

    fraction: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"data.holdout.fraction={self.fraction}: must be in (0, 1) (0 turns the holdout off)")

    def mask(self, day: str, rows: int) -> np.ndarray:
        """True for the held-out rows of ``day`` (``rows``: the day file's row count)."""
        return np.random.default_rng([int(self.seed), int(day), 0x401D]).random(rows) < self.fraction

    @classmethod
    def from_config(cls, data_cfg) -> Optional["RowHoldout"]:
        """``data.holdout`` of a run's config: None when its fraction is 0."""
        h = data_cfg.holdout
        if not float(h.fraction):
            return None
        return cls(float(h.fraction), int(h.seed))


STREAM_PARTS = ("train", "holdout")  # which rows a stream reads when a RowHoldout is set


@dataclass(frozen=True)
class DenseNormalization:
    """Per dense feature: ``(x - mean) / std`` with the statistics of ``days``; missing -> 0."""

    features: List[str]
    mean: List[float]
    std: List[float]
    days: List[str]

    @classmethod
    def from_days(cls, meta: "DatasetMeta", days: Sequence[str]) -> "DenseNormalization":
        mean, std = [], []
        for name in meta.dense:
            stats = [meta.days[d]["dense_stats"][name] for d in days]
            n = sum(s["count"] for s in stats)
            m = sum(s["sum"] for s in stats) / n if n else 0.0
            var = sum(s["sumsq"] for s in stats) / n - m * m if n else 0.0
            sd = var ** 0.5 if var > 1e-12 else 1.0  # a constant feature is centred, not scaled
            mean.append(m)
            std.append(sd)
        return cls(list(meta.dense), mean, std, [str(d) for d in days])

    def apply(self, x: np.ndarray) -> np.ndarray:
        out = x - np.asarray(self.mean, dtype=np.float64)
        out /= np.asarray(self.std, dtype=np.float64)
        np.copyto(out, 0.0, where=np.isnan(out))  # missing -> the mean; +-inf stay inf as float32 (as before)
        return out.astype(np.float32)

    def apply_column(self, i: int, x: np.ndarray) -> None:
        """:meth:`apply` of feature ``i``, in place on its values in float64 (the loader's column by column
        form): the same operations element for element, so the same bits once cast to float32."""
        np.subtract(x, np.float64(self.mean[i]), out=x)
        np.divide(x, np.float64(self.std[i]), out=x)
        np.copyto(x, 0.0, where=np.isnan(x))

    def to_dict(self) -> Dict:
        return {"features": self.features, "mean": self.mean, "std": self.std, "days": self.days}

    @classmethod
    def from_checkpoint(cls, directory: str) -> Optional["DenseNormalization"]:
        """The normalization a checkpoint's model was trained with (its meta file), or None."""
        from recsys_hdet.components.model_checkpoint import read_meta

        try:
            d = read_meta(directory).get("dense_normalization")
        except (OSError, ValueError):
            return None
        return cls(list(d["features"]), list(d["mean"]), list(d["std"]), list(d["days"])) if d else None

    def check(self, meta: "DatasetMeta") -> None:
        if self.features != list(meta.dense):
            raise ValueError(f"dense normalization for features {self.features}, but the data set at {meta.root} "
                             f"has {list(meta.dense)}")


def model_inputs(meta: "DatasetMeta") -> Dict:
    """What a model built for this data set takes: embedding table sizes and dense features (a
    checkpoint records it, so a warm start can tell whether it fits)."""
    return {"sparse": {n: int(s["vocab"]) for n, s in meta.sparse.items()}, "dense": list(meta.dense)}


# A row is standard exposure unless is_rand = 1 (a null carries no random-exposure information).
standard_rows = pl.col(RAND_COLUMN).fill_null(0) != 1


def require_rand_column(meta: DatasetMeta, days: Sequence[str]) -> None:
    """ValueError naming the data root, the column and the first day file without ``is_rand``."""
    for day in days:
        if RAND_COLUMN not in pl.read_parquet_schema(meta.day_path(day)):
            raise ValueError(
                f"data.train_exposure=standard drops the random-exposure rows ({RAND_COLUMN} = 1), but the data set "
                f"at {meta.root} has no {RAND_COLUMN!r} column ({meta.days[day]['file']} lacks it; it was processed "
                f"before random exposure was recorded): re-convert it with data_tools.convert, or train with "
                f"data.train_exposure=all"
            )


def day_rows(meta: DatasetMeta, days: Sequence[str], exposure: str = "all", holdout: Optional[RowHoldout] = None,
             part: str = "train") -> Dict[str, int]:
    """Rows per day the stream reads: every row (``"all"``, from the data set's meta), or the standard-exposure
    ones (``"standard"``: counted from the files' ``is_rand`` column, the only column read); with a
    ``holdout``, only the rows of ``part`` ("train": not held out, "holdout": held out)."""
    if exposure not in tuple(TrainExposure):
        raise ValueError(f"exposure={exposure!r}: one of {[str(e) for e in TrainExposure]}")
    if part not in STREAM_PARTS:
        raise ValueError(f"part={part!r}: one of {STREAM_PARTS}")
    if exposure == "standard":
        require_rand_column(meta, days)
    return {d: int(meta.days[d]["rows"]) if exposure == "all" and holdout is None
            else int(kept_mask(meta, d, exposure, holdout, part).sum()) for d in days}


def kept_mask(meta: DatasetMeta, day: str, exposure: str = "all", holdout: Optional[RowHoldout] = None,
              part: str = "train") -> np.ndarray:
    """Which rows of the day file a stream reads (:func:`day_rows` counts them), by file position."""
    rows = int(meta.days[day]["rows"])
    keep = part_mask(holdout, part, day, rows)
    keep = np.ones(rows, dtype=bool) if keep is None else keep
    if exposure == "standard":
        keep &= pl.read_parquet(meta.day_path(day), columns=[RAND_COLUMN]).select(standard_rows).to_series().to_numpy()
    return keep


def part_mask(holdout: Optional[RowHoldout], part: str, day: str, rows: int) -> Optional[np.ndarray]:
    """Rows of the day file the stream's ``part`` keeps (None: every row)."""
    if holdout is None:
        return None
    held = holdout.mask(day, rows)
    return held if part == "holdout" else ~held


def split_days(
    meta: DatasetMeta, eval_days: int, train_days: Optional[int] = None, skip_days: int = 0,
    until: Optional[str] = None, holdout: bool = False,
) -> tuple[List[str], List[str]]:
    """The held-out days are the last ``eval_days``; training days are the ones before them, after
    skipping the first ``skip_days`` (e.g. days a warm-start checkpoint was trained on), at most
    ``train_days`` of them. ``until`` (a day): the data set as it was that day; later days are
    ignored (a backfill trains as if they had not arrived). ``holdout`` (rows are held out, see
    :class:`RowHoldout`): the evaluated days are scored on their held-out slice only, so they are
    training days too (their other rows): training days run from ``skip_days`` to the last day."""
    days = list(meta.days)
    if until is not None:
        if str(until) not in meta.days:
            raise ValueError(f"data.until={until}: not a day of the data set at {meta.root} (days {days[0]}.."
                             f"{days[-1]})")
        days = days[: days.index(str(until)) + 1]
    needed = max(eval_days, skip_days + 1) if holdout else eval_days + skip_days + 1
    if eval_days < 1 or needed > len(days):
        raise ValueError(
            f"data.eval_days={eval_days}, data.skip_days={skip_days}: the data set at {meta.root} has "
            f"{len(days)} days{f' up to {until}' if until else ''}; need at least one training day and one "
            f"held-out day"
        )
    train = days[skip_days:] if holdout else days[skip_days : len(days) - eval_days]
    if train_days is not None:
        train = train[:train_days]
    return train, days[len(days) - eval_days :]


def split_for(meta: DatasetMeta, data_cfg) -> tuple[List[str], List[str]]:
    """:func:`split_days` with a run's ``data`` config."""
    return split_days(meta, int(data_cfg.eval_days), data_cfg.train_days, int(data_cfg.skip_days),
                      data_cfg.until, RowHoldout.from_config(data_cfg) is not None)


# -- rank-local reads (data.read=own_row_groups) -----------------------------------------------
# Row groups of a day file are the unit a rank reads. Seeds are tagged so the deal never reuses the
# whole-day permutation's stream of numbers.
_DEAL_TAG = 0xDEA1


@dataclass(frozen=True)
class RankShare:
    """One rank's part of a day under ``own_row_groups``: the row groups it reads (ascending: its dealt
    groups and the shared ones), the day file's rows it produces in stream order (its ``batches`` x
    batch_size training rows, then the reserved rows every rank scores; None when only the step count
    was asked for), and ``rows_per_rank``: each rank's training rows before they are cut to whole
    batches (the smallest sets the day's step count)."""

    groups: np.ndarray
    rows: Optional[np.ndarray]
    batches: int
    rows_per_rank: List[int]


def deal_row_groups(kept: np.ndarray, group_rows: Sequence[int], rank: int, world_size: int, batch_size: int,
                    reserve_rows: int, seed: int, day: str, shuffle: bool = True, rows: bool = True) -> RankShare:
    """Deal a day's row groups to ``world_size`` ranks so each reads about ``1 / world_size`` of the file.

    ``kept``: which of the file's rows the stream reads (exposure and holdout), ``group_rows``: the
    file's row-group sizes. The groups, in an order drawn from ``(seed, day)``, are split into a tail
    that holds the ``reserve_rows`` reserved rows, ``world_size`` equal-count runs dealt round-robin
    (group ``j`` to rank ``j % world_size``) and the few left over; the tail and the left-over groups
    are *shared*: every rank reads them, the reserved rows are the last of their rows (shuffled, the
    same on every rank), and their other rows are dealt row by row. A rank's training rows are
    shuffled by ``(seed, day, world_size, rank)`` and cut to the step count every rank can fill.
    Deterministic in its arguments, so a resumed job reads the same rows. ``rows=False``: the step
    count alone, from group-level arithmetic (no row is listed).
    """
    starts = np.concatenate([[0], np.cumsum(np.asarray(group_rows, dtype=np.int64))])
    if starts[-1] != len(kept):
        raise ValueError(f"day {day}: row groups hold {starts[-1]} rows, the mask {len(kept)}")
    m = len(group_rows)
    kept_before = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])
    counts = kept_before[starts[1:]] - kept_before[starts[:-1]]
    rng = np.random.default_rng([int(seed), int(day), _DEAL_TAG])
    order = rng.permutation(m) if shuffle else np.arange(m)
    # the tail: the fewest last groups of the order that hold the reserved rows (all of them if none do)
    tail = 0 if reserve_rows <= 0 else min(m, int(np.searchsorted(np.cumsum(counts[order][::-1]), reserve_rows)) + 1)
    dealt_groups = (m - tail) // world_size * world_size
    dealt, shared = order[:dealt_groups], order[dealt_groups:]
    leftover_rows = max(0, int(counts[shared].sum()) - reserve_rows)
    rows_per_rank = [int(counts[dealt[r::world_size]].sum()) + len(range(r, leftover_rows, world_size))
                     for r in range(world_size)]
    batches = min(rows_per_rank) // batch_size
    groups = np.sort(np.concatenate([dealt[rank::world_size], shared]))
    if not rows:
        return RankShare(groups=groups, rows=None, batches=batches, rows_per_rank=rows_per_rank)

    def rows_of(gs: np.ndarray) -> np.ndarray:
        parts = [np.flatnonzero(kept[starts[g]:starts[g + 1]]) + starts[g] for g in gs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    shared_rows = rows_of(shared)
    if shuffle:
        shared_rows = shared_rows[rng.permutation(len(shared_rows))]
    leftover, reserved = shared_rows[:leftover_rows], shared_rows[leftover_rows:]
    own = np.concatenate([rows_of(dealt[rank::world_size]), leftover[rank::world_size]])
    if shuffle:
        own = own[np.random.default_rng([int(seed), int(day), _DEAL_TAG, world_size, rank]).permutation(len(own))]
    return RankShare(groups=groups, rows=np.concatenate([own[: batches * batch_size], reserved]).astype(np.int64),
                     batches=batches, rows_per_rank=rows_per_rank)
