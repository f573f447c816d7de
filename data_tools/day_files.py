"""The processed day files (DATA_CONTRACT.md) and the typed copy of the raw log they are cut from.

The log files are copied once, typed, into one Parquet file whose rows keep their place in the log
(:func:`write_typed_log`). A day's rows are joined with the user and video tables and the id
vocabularies, encoded and sorted by ``time_ms``, ties in log order (:func:`day_query_of`), and written
in row groups of ``row_group_rows`` rows: whole, or, a day longer than ``chunk_rows``, sorted a time
range at a time (:func:`_time_ranges`) and concatenated in order, so that memory follows
``chunk_rows``, not the day's rows. Each day gets its entry for the meta file: rows, random-exposure rows
and the dense features' count, sum and sum of squares (:func:`write_days`).
"""

from __future__ import annotations

import datetime as dt
import glob
import os
from typing import Callable

import numpy as np
import polars as pl

from data_tools import contract as C
from data_tools import schema as S
from data_tools import vocab as V
from data_tools.feature_tables import USER_STRINGS, VIDEO_STRINGS
from data_tools.resume import _Progress
from data_tools.validate_raw import parse_expr, scan_raw_csv

# A processed row's place in the raw log (files in order, then lines): a day is sorted by time_ms with ties
# in log order, whether sorted whole or a time range at a time.
LOG_ORDER = "_log_row"
# Rows a day is sorted in at once: a longer day is sorted a time range at a time (memory ~ these rows).
DEFAULT_CHUNK_ROWS = 1_000_000


def write_typed_log(tmp: str, files, oracle_cols: list, write: bool) -> tuple[str, list]:
    """The log files in one typed pass into ``tmp/_log.parquet`` (when ``write``: a resumed conversion's is
    there already), each row numbered by its place in the log (``LOG_ORDER``). Returns its path and the
    log files that have no is_rand column."""
    parts = []
    without_rand = []  # log files with no is_rand column: their rows carry no random-exposure information
    for f in files:
        has_rand = C.RAND_COLUMN in scan_raw_csv(f).collect_schema().names()
        if not has_rand:
            without_rand.append(os.path.abspath(f))
        parts.append(scan_raw_csv(f).select(
            *[parse_expr(c, pl.Int64, lenient_int=False) for c in S.LOG_REQUIRED],
            (parse_expr(C.RAND_COLUMN, pl.Int64, lenient_int=False) if has_rand else pl.lit(0, pl.Int64))
            .cast(pl.Int8).alias(C.RAND_COLUMN),
            *[parse_expr(c, pl.Float64).cast(pl.Float32).alias(c) for c in oracle_cols],
        ))
    lpath = os.path.join(tmp, "_log.parquet")
    if write:  # LOG_ORDER: the row's place in the log, so that a day's sort is the same in chunks
        (pl.concat(parts) if len(parts) > 1 else parts[0]).with_row_index(LOG_ORDER).sink_parquet(lpath)
    return lpath, without_rand


def _time_ranges(lpath: str, date: int, chunk_rows: int, bins: int = 1 << 16) -> list[tuple[int, int]]:
    """Half-open time_ms ranges that cut the day ``date`` of the typed log into consecutive pieces of
    about ``chunk_rows`` rows: the day's time span in ``bins`` equal bins, counted (a streaming
    aggregation: memory ~ bins), then consecutive bins joined while they fit. A piece may exceed
    ``chunk_rows`` by at most one bin's rows (rows with one time_ms are never split)."""
    day = pl.scan_parquet(lpath).filter(pl.col("date") == date).select("time_ms")
    lo, hi = day.select(pl.col("time_ms").min().alias("lo"), pl.col("time_ms").max().alias("hi")) \
        .collect(engine="streaming").row(0)
    width = max(1, -(-(hi - lo + 1) // bins))
    counts = day.group_by(((pl.col("time_ms") - lo) // width).alias("bin")).agg(pl.len().alias("n")) \
        .collect(engine="streaming").sort("bin")
    ranges, start, rows = [], lo, 0
    for b, n in counts.iter_rows():
        end = lo + b * width
        if rows and rows + n > chunk_rows:
            ranges.append((start, end))
            start, rows = end, 0
        rows += n
    ranges.append((start, hi + 1))
    return ranges


def day_query_of(lpath: str, upath: str, vpath: str, vocabs: dict, oracle_cols: list) -> Callable:
    """``day_query(date, day_date, times)``: the processed rows of a day of the typed log ``lpath``,
    joined with the user and video tables ``upath`` and ``vpath`` and encoded through ``vocabs``."""
    rows_of = {f: vocabs[f].select(pl.col("raw_id"), pl.col("row").alias(f"{f}__row")).lazy() for f in V.ID_FEATURES}
    tag_keys, tag_rows = vocabs["tag"]["raw_id"].to_list(), vocabs["tag"]["row"].to_list()

    label_exprs = []
    for t in S.TASKS:
        comps = S.TASK_COMPONENTS[t]
        label_exprs.append((pl.max_horizontal([pl.col(c) for c in comps]) > 0)
                           .cast(pl.Float32).alias(C.label_column(t)))
    values = [c for c in S.DENSE_VALUES if c != "log_video_age_days"]

    def day_query(date: int, day_date: dt.date, times: tuple | None) -> pl.LazyFrame:
        """The day's processed rows (those with ``times[0] <= time_ms < times[1]`` when given), sorted by
        time_ms, ties in log order."""
        log_rows = pl.scan_parquet(lpath).filter(pl.col("date") == date)
        if times is not None:
            log_rows = log_rows.filter(pl.col("time_ms").is_between(times[0], times[1], closed="left"))
        q = log_rows.join(pl.scan_parquet(upath), on="user_id", how="left") \
            .join(pl.scan_parquet(vpath), on="video_id", how="left")
        for f, raw in (("user_id", "user_id"), ("video_id", "video_id"), ("tab", "tab"),
                       ("author_id", "author_raw"), ("music_id", "music_raw")):
            q = q.join(rows_of[f], left_on=raw, right_on="raw_id", how="left")
        return q.select(
            *[V.encode(pl.col(raw), pl.col(f"{f}__row")).alias(f) for f, raw in
              (("user_id", "user_id"), ("video_id", "video_id"), ("author_id", "author_raw"),
               ("music_id", "music_raw"), ("tab", "tab"))],
            (pl.col("hourmin") // 100 + 1).clip(0, S.HOUR_VOCAB - 1).fill_null(0).alias("hour"),
            *[pl.col(c).fill_null(0) for c in USER_STRINGS + VIDEO_STRINGS],
            pl.col("tag_raw").list.eval(pl.element().replace_strict(tag_keys, tag_rows, default=V.OOV_ROW,
                                                                     return_dtype=pl.Int64))
            .fill_null(pl.lit([], dtype=pl.List(pl.Int64))).alias("tag"),
            *[pl.col(c).cast(pl.Float32).alias(c) for c in values],
            (pl.lit(day_date) - pl.col("_upload_date")).dt.total_days().cast(pl.Float64)
            .clip(lower_bound=0.0).log1p().cast(pl.Float32).alias("log_video_age_days"),
            *label_exprs,
            *[pl.col(c) for c in oracle_cols],
            pl.col(C.RAND_COLUMN),
            *[pl.col(raw).alias(kept) for raw, kept in zip(("user_id", "video_id"), C.RAW_ID_COLUMNS)],
            pl.col("date"),
            pl.col("time_ms"),
            pl.col(LOG_ORDER),
        ).with_columns(
            *[pl.col(c).is_null().cast(pl.Float32).alias(S.missing_indicator(c)) for c in S.DENSE_VALUES],
        ).sort(["time_ms", LOG_ORDER]).select(
            list(S.SPARSE_FEATURES) + list(S.DENSE_FEATURES) + list(S.LABEL_COLUMNS)
            + oracle_cols + [C.RAND_COLUMN] + list(C.SOURCE_COLUMNS))

    return day_query


def write_days(tmp: str, dates, day_query: Callable, lpath: str, progress: _Progress, *, chunk_rows: int,
               row_group_rows: int) -> dict:
    """Writes the file of each day of ``dates`` into ``tmp`` (except the days ``progress`` records: written
    before the conversion was interrupted), recording each in ``progress``; returns the meta file's ``days``."""
    day_rows = dict(pl.scan_parquet(lpath).group_by("date").agg(pl.len()).collect(engine="streaming").iter_rows())
    days = dict(progress.days)
    for date in dates:
        if str(date) in days:  # written before this conversion was interrupted
            continue
        path = _write_day(tmp, date, day_query, lpath, day_rows[date], chunk_rows=chunk_rows,
                          row_group_rows=row_group_rows)
        days[str(date)] = _day_entry(path, date)
        progress.day_done(str(date), days[str(date)])
    return days


def _write_day(tmp: str, date: int, day_query: Callable, lpath: str, rows: int, *, chunk_rows: int,
               row_group_rows: int) -> str:
    """Writes the file of the day ``date`` (``rows`` rows) into ``tmp`` and returns its path."""
    day_date = dt.datetime.strptime(str(date), "%Y%m%d").date()
    path = os.path.join(tmp, C.day_file(date))
    for stale in glob.glob(os.path.join(tmp, "_part-*.parquet")):  # an interrupted day's pieces
        os.remove(stale)
    ranges = _time_ranges(lpath, date, chunk_rows) if rows > chunk_rows else [None]
    if len(ranges) == 1:
        day_query(date, day_date, None).sink_parquet(path, row_group_size=row_group_rows)
    else:  # sorted a time range at a time, then concatenated in order (streaming): memory ~ chunk_rows
        parts = [os.path.join(tmp, f"_part-{i:05d}.parquet") for i in range(len(ranges))]
        for part, times in zip(parts, ranges):
            day_query(date, day_date, times).sink_parquet(part)
        pl.scan_parquet(parts).sink_parquet(path, row_group_size=row_group_rows)
        for part in parts:
            os.remove(part)
    return path


def _day_entry(path: str, date: int) -> dict:
    """The day's entry in the meta file's ``days``: its file, rows, random-exposure rows and, per dense
    feature, the count, sum and sum of squares of its non-null values."""
    rows, rand = pl.scan_parquet(path).select(pl.len(), pl.col(C.RAND_COLUMN).cast(pl.Int64).sum()) \
        .collect(engine="streaming").row(0)
    dense_stats = {}
    for c in S.DENSE_FEATURES:
        # a column at a time, summed by numpy: the same bits whatever polars' engine, threads or the
        # file's row groups (polars' float sums follow its partitioning)
        x = pl.read_parquet(path, columns=[c])[c].drop_nulls().cast(pl.Float64).to_numpy()
        dense_stats[c] = {"count": len(x), "sum": float(np.sum(x)), "sumsq": float(np.sum(x * x))}
    return {"file": C.day_file(date), "rows": int(rows), "random_exposure_rows": int(rand),
            "dense_stats": dense_stats}
