"""Convert raw KuaiRand-schema CSVs into a processed data set (see DATA_CONTRACT.md).

Bounded memory: the raw log is scanned in streaming passes (never loaded whole): validated, copied
once into a typed Parquet file, counted into the id vocabularies; then each date is joined with the
user and video feature tables and written sorted by ``time_ms`` (ties in log order), a day longer
than ``--chunk-rows`` a time range at a time. Peak memory follows the vocabulary sizes and the chunk
size, not the log's rows (benchmarks/scaling.py measures it). Everything is written into a stage
directory next to ``out`` (``.<out>.partial``) and renamed into place at the end, so a failure
leaves no half-written output; a conversion killed half way resumes after its last finished day
when run again on the same inputs.

Feature encoding:
- integer ids (user_id, video_id, author_id, music_id, tab, tag ids) go through an exact
  vocabulary (:mod:`data_tools.vocab`): row 0 = missing, 1 = out of vocabulary (fewer than
  ``min_count`` impressions), 2.. = one row per id in order of first appearance; persisted in
  ``vocab/`` and extendable with ``--extend-vocab`` (existing ids keep their rows)
- string categoricals use a sorted vocabulary of the values in the feature files, 1-based,
  0 = missing; their vocab is ``len(values) + 1``
- hour = hourmin // 100 + 1 (0 = missing), vocab 25
- dense features are stored untransformed by statistics, null where missing (an empty field, a
  KuaiRand sentinel such as -124, a missing join), each with a ``<name>_missing`` indicator; the
  per-day count / sum / sum of squares of each is in meta.json, so that the trainer normalizes
  with the statistics of its own training days only
- ``is_rand`` (random exposure, 0/1; 0 when a log file has no such column) is kept as a column,
  never a model input
- missing joins -> row 0 ids, null dense, empty tag list (counted, and refused above
  --max-unmatched)

CLI: ``python -m data_tools.convert --log GLOB --users FILE --videos FILE --out DIR
[--min-count user_id=N ...] [--extend-vocab DIR] [--overwrite]``; exit status 2 on bad input (the
message names the file and column; nothing is written).

New days: ``python -m data_tools.convert --append-to ROOT --log GLOB --users FILE --videos FILE``
(:func:`append_days`) adds the log's days to the processed data set ROOT in place: old day files
are not rewritten, vocabularies are extended (existing rows unchanged), meta.json is replaced last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import polars as pl

from data_tools import contract as C
from data_tools import schema as S
from data_tools import vocab as V
from data_tools.errors import DataError, data_error
from data_tools.exit_status import ExitStatus
from data_tools.fileio import file_lock, write_text_atomic
from data_tools.validate import (_load_meta, parse_date_expr, parse_expr, scan_raw_csv,
                                 tag_list_expr, validate_day_file, validate_processed, validate_raw)

# A processed row's place in the raw log (files in order, then lines): a day is sorted by time_ms with ties
# in log order, whether sorted whole or a time range at a time.
LOG_ORDER = "_log_row"
# Rows a day is sorted in at once: a longer day is sorted a time range at a time (memory ~ these rows).
DEFAULT_CHUNK_ROWS = 1_000_000


def resolve_min_count(min_count: dict | None) -> dict:
    """Per id feature, the impressions an id needs for a row of its own (default 1: every id)."""
    out = {f: 1 for f in V.ID_FEATURES}
    for k, v in (min_count or {}).items():
        if k not in out:
            raise DataError(f"min_count: field '{k}': not an id feature (id features: {list(V.ID_FEATURES)})")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DataError(f"min_count: field '{k}': must be an int >= 1, got {v!r}")
        out[k] = v
    return out


def _base_vocabs(root: str | None) -> dict:
    """The vocabularies of an earlier processed data set, to extend (DataError if unusable)."""
    if root is None:
        return {}
    out = {}
    for f in V.ID_FEATURES:
        path = V.vocab_path(root, f)
        try:
            out[f] = pl.read_parquet(path, columns=["raw_id", "row", "count"])
        except Exception as e:  # noqa: BLE001
            raise data_error(path, None, f"cannot read the vocabulary to extend ({type(e).__name__}: {e})") from None
    return out


def _string_vocab(lf: pl.LazyFrame, cols, base: dict | None = None) -> dict[str, list[str]]:
    """Per column, its values in code order (code = index + 1): sorted; with ``base`` (an earlier
    conversion's ``string_vocabs``), the base values first, in their order, then the new values
    sorted, so that every existing value keeps its code."""
    q = lf.select([parse_expr(c, pl.String).drop_nulls().unique().sort().implode().alias(c)
                   for c in cols]).collect()
    out = {}
    for c in cols:
        old = list((base or {}).get(c) or [])
        seen = set(old)
        out[c] = old + [v for v in q[c][0] if v not in seen]
    return out


def _encode(col: str, values: list[str]) -> pl.Expr:
    e = parse_expr(col, pl.String)
    if not values:
        return pl.lit(0, pl.Int64).alias(col)
    return e.replace_strict(values, list(range(1, len(values) + 1)), default=0,
                            return_dtype=pl.Int64).alias(col)


def _known_value(col: str, e: pl.Expr) -> pl.Expr:
    """``e`` with KuaiRand's missing-value sentinels (DATA_CONTRACT.md) replaced by null."""
    return pl.when(e.is_in(list(S.SENTINELS))).then(None).otherwise(e).alias(col)


def _log1p_count(col: str) -> pl.Expr:
    """log(1 + count); null when missing or a sentinel (a count is never negative)."""
    e = _known_value(col, parse_expr(col, pl.Int64))
    return pl.when(e >= 0).then(e.cast(pl.Float64).log1p()).otherwise(None)


def convert(log, users: str, videos: str, out: str, min_count: dict | None = None, *,
            overwrite: bool = False, source: dict | None = None, verbose: bool = False,
            max_unmatched_fraction: float = 0.01, max_conflicting_duplicates: int = 0,
            extend_vocab: str | None = None, string_vocabs: dict | None = None,
            chunk_rows: int = DEFAULT_CHUNK_ROWS, row_group_rows: int = C.ROW_GROUP_ROWS) -> dict:
    """Convert raw CSVs (``log``: a glob, path or list) into the processed directory ``out``.

    Returns the written meta dict. Raises DataError (naming file and column) on bad input;
    on any failure ``out`` is left untouched and no temp directory remains. Joins are checked
    first (:func:`check_joins`): log rows whose user or video has no feature row, and feature
    rows that repeat an id with other values, are counted, reported in ``meta.source.joins`` and
    refused above ``max_unmatched_fraction`` of the log rows / ``max_conflicting_duplicates`` ids.
    ``extend_vocab``: an earlier processed data set whose id vocabularies are kept and extended, and its
    string categoricals' codes (``source.string_vocabs``) with them; ``string_vocabs``: those codes given
    directly (an exported model's manifest), so that every known value keeps its code.

    Memory: the log is read in streaming passes (validation, the typed copy, the vocabularies' counts)
    and a day is sorted ``chunk_rows`` rows at a time, so peak memory follows the vocabulary sizes and
    ``chunk_rows``, not the number of rows. A conversion that is killed or fails other than on bad input
    keeps its stage directory ``.<out>.partial`` next to ``out``: run again with the same inputs, it
    goes on after the last finished day (different inputs start afresh).

    Day files are written in row groups of ``row_group_rows`` rows (meta.json ``layout`` version 2), the
    unit a training rank reads under ``data.read=own_row_groups``.
    """
    t0 = time.time()
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not overwrite:
        raise data_error(out, None, "output directory already exists (pass overwrite=True / --overwrite)")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise DataError(f"chunk_rows: must be an int >= 1, got {chunk_rows!r}")
    if isinstance(row_group_rows, bool) or not isinstance(row_group_rows, int) or row_group_rows < 1:
        raise DataError(f"row_group_rows: must be an int >= 1, got {row_group_rows!r}")
    counts = resolve_min_count(min_count)
    base = _base_vocabs(extend_vocab)
    if string_vocabs is None and extend_vocab is not None and C.has_meta(extend_vocab):
        string_vocabs = _load_meta(extend_vocab).get("source", {}).get("string_vocabs")
    info = validate_raw(log, users, videos)
    files = info["log_files"]
    joins = check_joins(files, users, videos, max_unmatched_fraction, max_conflicting_duplicates)
    source = {**(source or {}), "joins": joins}
    if extend_vocab is not None:
        source["extended_vocab_of"] = os.path.abspath(extend_vocab)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.partial")
    os.makedirs(tmp, mode=0o755, exist_ok=True)
    stage_lock = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(stage_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(stage_lock)
        raise data_error(out, None, f"another conversion into it is running (its stage {tmp} is locked)") from None
    # what the staged files depend on: the inputs as they are now, and every option that changes the output
    key = {"inputs": [[os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files + [users, videos]],
           "min_count": counts, "extend_vocab": os.path.abspath(extend_vocab) if extend_vocab else None,
           "string_vocabs": string_vocabs, "source": source, "row_group_rows": row_group_rows}
    progress = _Progress(tmp, key)
    try:
        if not progress.tables:  # nothing to resume: whatever an earlier conversion left goes
            for name in os.listdir(tmp):
                shutil.rmtree(os.path.join(tmp, name)) if os.path.isdir(os.path.join(tmp, name)) \
                    else os.remove(os.path.join(tmp, name))
        elif verbose:
            print(f"resuming the conversion staged in {tmp}: {len(progress.days)} of {len(info['dates'])} days done")
        meta = _convert_into(tmp, files, users, videos, counts, base, info, source, string_vocabs,
                             chunk_rows=chunk_rows, row_group_rows=row_group_rows, progress=progress)
        validate_processed(tmp)
        if os.path.exists(out):
            trash = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
            os.rename(out, os.path.join(trash, "old"))
            os.rename(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except DataError:
        shutil.rmtree(tmp, ignore_errors=True)  # bad input: nothing worth resuming
        raise
    finally:
        os.close(stage_lock)
    if verbose:
        rows = sum(d["rows"] for d in meta["days"].values())
        rand = sum(d["random_exposure_rows"] for d in meta["days"].values())
        print(f"converted {rows} rows ({rand} random exposure) in {len(meta['days'])} days into {out} "
              f"in {time.time() - t0:.1f}s")
        print("joins: " + ", ".join(f"{k} {v}" for k, v in joins.items()))
        for f, c in meta["ids"].items():
            print(f"ids {f}: {c['distinct_raw_ids']} distinct raw ids -> {c['distinct_rows']} rows "
                  f"(collision rate {c['collision_rate']:.2%}, {c['oov_ids']} ids below min_count "
                  f"{c['min_count']} share the out-of-vocabulary row), table {c['table_rows']} rows")
        missing = {k: v for k, v in meta["source"]["missing_values"].items() if v}
        print("missing values (null, empty or a sentinel): " + (", ".join(f"{k} {v}" for k, v in missing.items())
                                                               or "none"))
    return meta


def check_joins(files, users: str, videos: str, max_unmatched_fraction: float,
                max_conflicting_duplicates: int) -> dict:
    """Counts what the feature joins would otherwise do silently: log rows whose user (video) has no
    feature row (they would get all-zero features), and ids repeated in a feature file, exactly
    (dropped) or with conflicting values (only the first would be kept). Raises DataError above the
    thresholds, naming the file, the column, the count and an example id."""
    ids = pl.concat([scan_raw_csv(f).select(parse_expr("user_id", pl.Int64, lenient_int=False),
                                             parse_expr("video_id", pl.Int64, lenient_int=False)) for f in files])
    counts: dict = {}
    # counted through a column: polars answers a bare pl.len() over a CSV scan by reading the whole file
    # into memory (1 GB for 9M rows)
    log_rows = ids.select(pl.col("user_id").fill_null(0).count()).collect(engine="streaming").item()
    counts["log_rows"] = log_rows
    for kind, path, col in (("user", users, "user_id"), ("video", videos, "video_id")):
        table = scan_raw_csv(path).with_columns(parse_expr(col, pl.Int64))
        per_id = table.group_by(col).agg(pl.len().alias("n"), pl.struct(pl.all().exclude(col)).n_unique().alias("distinct"))
        dup = per_id.filter(pl.col("n") > 1).select(
            pl.len().alias("ids"), (pl.col("distinct") > 1).sum().alias("conflicting"),
            pl.col(col).filter(pl.col("distinct") > 1).first().alias("example")).collect(engine="streaming").row(0, named=True)
        # streaming: memory ~ the feature file's ids, not the log's rows
        unmatched = ids.join(table.select(col).unique(), on=col, how="anti").select(
            pl.len().alias("rows"), pl.col(col).first().alias("example")).collect(engine="streaming").row(0, named=True)
        counts[f"unmatched_{kind}_rows"] = unmatched["rows"]
        counts[f"duplicate_{kind}_ids"] = dup["ids"]
        counts[f"conflicting_{kind}_ids"] = dup["conflicting"]
        if dup["conflicting"] > max_conflicting_duplicates:
            raise data_error(path, col, f"{dup['conflicting']} ids repeated with conflicting feature values (e.g. "
                                        f"{dup['example']}); allowed: {max_conflicting_duplicates} "
                                        "(--max-conflicting-duplicates)")
        if unmatched["rows"] > max_unmatched_fraction * log_rows:
            raise data_error(path, col, f"{unmatched['rows']} of {log_rows} log rows "
                                        f"({unmatched['rows'] / log_rows:.2%}) have a {col} with no row in this "
                                        f"file (e.g. {unmatched['example']}); allowed: {max_unmatched_fraction:.2%} "
                                        "(--max-unmatched)")
    return counts


class _Progress:
    """What a conversion has written into its stage directory so far, in ``_progress.json``: the typed
    tables with the id vocabularies (``tables``, ``ids``) and each finished day's entry for meta.json
    (``days``). A conversion killed half way is resumed from it when it runs again on the same inputs
    (``key``); a different key starts afresh. Day files are written whole before they are recorded."""

    FILE = "_progress.json"

    def __init__(self, stage: str, key: dict) -> None:
        self.path = os.path.join(stage, self.FILE)
        self.key = key
        saved = {}
        if os.path.isfile(self.path):
            with open(self.path) as f:
                saved = json.load(f)
        fresh = saved.get("key") != key
        self.tables: bool = False if fresh else bool(saved.get("tables"))
        self.ids: dict = {} if fresh else saved.get("ids") or {}
        self.days: dict = {} if fresh else saved.get("days") or {}

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps({"key": self.key, "tables": self.tables, "ids": self.ids,
                                                 "days": self.days}))

    def tables_written(self, ids: dict) -> None:
        self.tables, self.ids = True, ids
        self._save()

    def day_done(self, day: str, entry: dict) -> None:
        self.days[day] = entry
        self._save()

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


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


def _convert_into(tmp, files, users, videos, min_count, base, info, source, string_base=None, *,
                  chunk_rows: int = DEFAULT_CHUNK_ROWS, row_group_rows: int = C.ROW_GROUP_ROWS,
                  progress: _Progress | None = None) -> dict:
    progress = progress or _Progress(tmp, {})
    has_oracle = info["has_oracle"]
    # ---- user table: categoricals encoded, dense values raw (null where missing)
    ulf = scan_raw_csv(users)
    u_str = ("user_active_degree",) + tuple(f"{c}_range" for c in S.RANGE_SOURCES)
    uvocab = _string_vocab(ulf, u_str, string_base)
    user_dense = [_log1p_count(c).alias(f"log_{c}") for c in S.RANGE_SOURCES] + [
        _known_value(c, parse_expr(c, pl.Int64)).cast(pl.Float64).alias(c)
        for c in ("is_lowactive_period", "is_live_streamer", "is_video_author")]
    uq = ulf.select(
        parse_expr("user_id", pl.Int64).alias("user_id"),
        *[_encode(c, uvocab[c]) for c in u_str],
        *user_dense,
    ).unique(subset="user_id", keep="first", maintain_order=True)
    upath = os.path.join(tmp, "_users.parquet")
    if not progress.tables:
        uq.sink_parquet(upath)
    # ---- video table (raw author, music and tag ids; they are encoded after the vocabularies)
    vlf = scan_raw_csv(videos)
    v_str = ("video_type", "upload_type")
    vvocab = _string_vocab(vlf, v_str, string_base)
    w = parse_expr("server_width", pl.Float64)
    h = parse_expr("server_height", pl.Float64)
    duration = parse_expr("video_duration", pl.Float64)
    vq = vlf.select(
        parse_expr("video_id", pl.Int64).alias("video_id"),
        parse_expr("author_id", pl.Int64).alias("author_raw"),
        parse_expr("music_id", pl.Int64).alias("music_raw"),
        *[_encode(c, vvocab[c]) for c in v_str],
        tag_list_expr("tag").alias("tag_raw"),
        pl.when(duration >= 0).then((duration / 1000.0).log1p()).otherwise(None).alias("log_video_duration_s"),
        pl.when((h > 0) & (w > 0)).then((w / h).clip(0.0, 4.0)).otherwise(None).alias("aspect_ratio"),
        parse_date_expr("upload_dt").alias("_upload_date"),
    ).unique(subset="video_id", keep="first", maintain_order=True)
    vpath = os.path.join(tmp, "_videos.parquet")
    if not progress.tables:
        vq.sink_parquet(vpath)
    # ---- log: one typed pass into a temp parquet, then one sink per date
    oracle_cols = list(S.ORACLE_COLUMNS) if has_oracle else []
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
    if not progress.tables:  # LOG_ORDER: the row's place in the log, so that a day's sort is the same in chunks
        (pl.concat(parts) if len(parts) > 1 else parts[0]).with_row_index(LOG_ORDER).sink_parquet(lpath)

    # ---- id vocabularies, from the impressions (author, music and tags through the log's videos)
    log = pl.scan_parquet(lpath)
    log_videos = log.select("date", "video_id").join(pl.scan_parquet(vpath), on="video_id", how="left")
    occurrences = {
        "user_id": log.select(pl.col("user_id").alias("raw_id"), "date"),
        "video_id": log.select(pl.col("video_id").alias("raw_id"), "date"),
        "tab": log.select(pl.col("tab").alias("raw_id"), "date"),
        "author_id": log_videos.select(pl.col("author_raw").alias("raw_id"), "date"),
        "music_id": log_videos.select(pl.col("music_raw").alias("raw_id"), "date"),
        "tag": log_videos.select(pl.col("tag_raw").alias("raw_id"), "date").explode("raw_id"),
    }
    if progress.tables:
        vocabs = {f: pl.read_parquet(V.vocab_path(tmp, f)) for f in V.ID_FEATURES}
        ids = progress.ids
    else:
        vocabs, ids = {}, {}
        os.makedirs(os.path.join(tmp, V.VOCAB_DIR), exist_ok=True)
        for f in V.ID_FEATURES:
            vocabs[f] = V.build_vocab(occurrences[f], min_count[f], base.get(f))
            vocabs[f].write_parquet(V.vocab_path(tmp, f))
            ids[f] = {**V.coverage(vocabs[f], occurrences[f]), "min_count": min_count[f]}
        progress.tables_written(ids)
    rows_of = {f: vocabs[f].select(pl.col("raw_id"), pl.col("row").alias(f"{f}__row")).lazy() for f in V.ID_FEATURES}
    tag_keys, tag_rows = vocabs["tag"]["raw_id"].to_list(), vocabs["tag"]["row"].to_list()

    label_exprs = []
    for t in S.TASKS:
        comps = S.TASK_COMPONENTS[t]
        label_exprs.append((pl.max_horizontal([pl.col(c) for c in comps]) > 0)
                           .cast(pl.Float32).alias(C.label_column(t)))
    values = [c for c in S.DENSE_VALUES if c != "log_video_age_days"]
    day_rows = dict(pl.scan_parquet(lpath).group_by("date").agg(pl.len()).collect(engine="streaming").iter_rows())

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
            *[pl.col(c).fill_null(0) for c in u_str + v_str],
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

    days = dict(progress.days)
    for date in info["dates"]:
        if str(date) in days:  # written before this conversion was interrupted
            continue
        day_date = dt.datetime.strptime(str(date), "%Y%m%d").date()
        path = os.path.join(tmp, C.day_file(date))
        for stale in glob.glob(os.path.join(tmp, "_part-*.parquet")):  # an interrupted day's pieces
            os.remove(stale)
        ranges = _time_ranges(lpath, date, chunk_rows) if day_rows[date] > chunk_rows else [None]
        if len(ranges) == 1:
            day_query(date, day_date, None).sink_parquet(path, row_group_size=row_group_rows)
        else:  # sorted a time range at a time, then concatenated in order (streaming): memory ~ chunk_rows
            parts = [os.path.join(tmp, f"_part-{i:05d}.parquet") for i in range(len(ranges))]
            for part, times in zip(parts, ranges):
                day_query(date, day_date, times).sink_parquet(part)
            pl.scan_parquet(parts).sink_parquet(path, row_group_size=row_group_rows)
            for part in parts:
                os.remove(part)
        rows, rand = pl.scan_parquet(path).select(pl.len(), pl.col(C.RAND_COLUMN).cast(pl.Int64).sum()) \
            .collect(engine="streaming").row(0)
        dense_stats = {}
        for c in S.DENSE_FEATURES:
            # a column at a time, summed by numpy: the same bits whatever polars' engine, threads or the
            # file's row groups (polars' float sums follow its partitioning)
            x = pl.read_parquet(path, columns=[c])[c].drop_nulls().cast(pl.Float64).to_numpy()
            dense_stats[c] = {"count": len(x), "sum": float(np.sum(x)), "sumsq": float(np.sum(x * x))}
        days[str(date)] = {"file": C.day_file(date), "rows": int(rows), "random_exposure_rows": int(rand),
                           "dense_stats": dense_stats}
        progress.day_done(str(date), days[str(date)])
    missing_values = {c: sum(d["dense_stats"][S.missing_indicator(c)]["sum"] for d in days.values())
                      for c in S.DENSE_VALUES}
    for p in (upath, vpath, lpath):
        os.remove(p)
    progress.remove()

    sparse = {}
    for c in S.SPARSE_FEATURES:
        if c in vocabs:
            v = V.table_rows(vocabs[c])
        elif c == "hour":
            v = S.HOUR_VOCAB
        else:
            v = len((uvocab | vvocab)[c]) + 1
        sparse[c] = {"vocab": int(v), "multi": c in S.SPARSE_MULTI}
    meta = {
        "format_version": C.FORMAT_VERSION,
        "layout": {"version": C.LAYOUT_VERSION, "row_group_rows": row_group_rows},
        "sparse": sparse,
        "dense": list(S.DENSE_FEATURES),
        "tasks": list(S.TASKS),
        "days": days,
        "has_oracle": has_oracle,
        # False when a log file had no is_rand column: its rows are written as 0 (standard), so the
        # evaluation's random-exposure slice cannot be trusted to be complete.
        "has_is_rand": not without_rand,
        "ids": ids,
        "source": {
            "log": [os.path.abspath(f) for f in files],
            "users": os.path.abspath(users),
            "videos": os.path.abspath(videos),
            "string_vocabs": uvocab | vvocab,
            "id_encoding": "exact vocabulary (vocab/<feature>.parquet): 0 missing, 1 out of vocabulary, 2.. ids",
            "missing_values": {c: int(n) for c, n in missing_values.items()},
            "is_rand_absent_in": without_rand,
            **(source or {}),
        },
    }
    C.write_meta(tmp, meta)
    return meta


# ---- appending days to an existing processed data set -------------------------------------------
# New files are staged in ROOT/.append-XXXX/ and moved into place with os.replace; meta.json is
# replaced last (the commit). Before the first move, the stage's manifest.json lists every move and
# keeps a hard link (or copy) of each file it replaces, so an append that fails or is killed half way
# is rolled back: at once when it fails, or by the next append (under the lock) when it was killed.
APPEND_STAGE_PREFIX = ".append-"
_MANIFEST = "manifest.json"


def append_days(log, users: str, videos: str, root: str, *, source: dict | None = None,
                verbose: bool = False, max_unmatched_fraction: float = 0.01,
                max_conflicting_duplicates: int = 0) -> dict:
    """Add the days of raw CSVs (``log``: a glob, path or list) to the processed data set ``root``
    in place and return its new meta dict.

    Existing day files are not touched; each id vocabulary keeps every row and appends the ids first
    seen on the new days (with ``min_count`` as recorded in ``meta.json``, judged on the new days'
    impressions); string categoricals keep their codes and append new values; ``meta.json``'s
    ``days``, ``sparse`` table sizes, ``ids``, ``has_is_rand`` and ``source`` (``appended_days``,
    ``appended``: one record per append, ``string_vocabs``, ``missing_values``) are updated.
    Refused with a DataError, nothing written: a day already in the data set or before its last
    day, a data set with oracle columns and a log without them, anything :func:`convert` refuses.
    The new day files are validated before anything is published; an fcntl lock on
    ``root + ".lock"`` (the one ``ensure_dataset`` takes) keeps appenders from interleaving.
    """

    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise data_error(root, None, "processed data directory not found (nothing to append to)")
    with file_lock(root + ".lock"):
        return _append_locked(log, users, videos, root, source=source, verbose=verbose,
                              max_unmatched_fraction=max_unmatched_fraction,
                              max_conflicting_duplicates=max_conflicting_duplicates)


def _append_locked(log, users: str, videos: str, root: str, *, source: dict | None = None,
                   verbose: bool = False, max_unmatched_fraction: float = 0.01,
                   max_conflicting_duplicates: int = 0, extra_files=()) -> dict:
    """:func:`append_days` for a caller that holds the lock. ``extra_files``: (staged path, final
    path) pairs moved into place with the data set's files, before meta.json, and rolled back with
    them (e.g. the synthetic generator's raw log and oracle.json)."""
    t0 = time.time()
    root = os.path.abspath(os.fspath(root))
    recover_appends(root)
    old = _load_meta(root)
    meta_path = C.meta_path(root)
    base = _base_vocabs(root)
    src_old = old.get("source") or {}
    _check_appendable(meta_path, old, base, src_old)
    info = validate_raw(log, users, videos)
    files = info["log_files"]
    new_days = [str(d) for d in info["dates"]]
    dup = [d for d in new_days if d in old["days"]]
    if dup:
        raise data_error(meta_path, "days", f"day {dup[0]} is already in this data set"
                         + (f" (so are {', '.join(dup[1:])})" if len(dup) > 1 else "")
                         + f"; the log {files} would replace it: appending never replaces a day")
    last = max(old["days"])
    early = [d for d in new_days if d < last]
    if early:
        raise data_error(meta_path, "days", f"day {early[0]} of the log {files} comes before the data set's last "
                                            f"day {last}: appended days must come after it")
    if old["has_oracle"] and not info["has_oracle"]:
        lacking = next(f for f in files if not set(S.ORACLE_COLUMNS) <= set(scan_raw_csv(f).collect_schema().names()))
        raise data_error(lacking, S.ORACLE_COLUMNS[0], "the data set's day files have oracle columns "
                         f"(has_oracle) but this log lacks {list(S.ORACLE_COLUMNS)}")
    joins = check_joins(files, users, videos, max_unmatched_fraction, max_conflicting_duplicates)
    old_ids = old.get("ids") or {}
    min_count = {f: int((old_ids.get(f) or {}).get("min_count", 1)) for f in V.ID_FEATURES}
    stage = tempfile.mkdtemp(prefix=APPEND_STAGE_PREFIX, dir=root)
    token = os.path.basename(stage)
    committed = False
    try:
        os.chmod(stage, 0o755)
        part = _convert_into(stage, files, users, videos, min_count, base,
                             dict(info, has_oracle=old["has_oracle"]), {},
                             string_base=src_old.get("string_vocabs"),
                             row_group_rows=int((old.get("layout") or {}).get("row_group_rows", C.ROW_GROUP_ROWS)))
        ids = {}
        for f in V.ID_FEATURES:
            ids[f] = _merge_vocab(V.vocab_path(stage, f), base[f], old_ids.get(f) or {}, part["ids"][f],
                                  min_count[f])
        sparse = part["sparse"]
        for c, spec in old["sparse"].items():
            if sparse[c]["vocab"] < spec["vocab"]:  # cannot happen: vocabularies only grow
                raise data_error(meta_path, f"sparse.{c}", f"table would shrink {spec['vocab']} -> "
                                                           f"{sparse[c]['vocab']}")
        src = dict(src_old)
        src["string_vocabs"] = part["source"]["string_vocabs"]
        src["missing_values"] = {c: int((src_old.get("missing_values") or {}).get(c, 0)) + int(n)
                                 for c, n in part["source"]["missing_values"].items()}
        src["is_rand_absent_in"] = list(src_old.get("is_rand_absent_in") or []) + part["source"]["is_rand_absent_in"]
        src["appended_days"] = list(src_old.get("appended_days") or []) + new_days
        record = {"days": new_days, "log": [os.path.abspath(f) for f in files], "users": os.path.abspath(users),
                  "videos": os.path.abspath(videos), "joins": joins, **(source or {}), "token": token}
        src["appended"] = list(src_old.get("appended") or []) + [record]
        meta = dict(old)
        meta.update(sparse=sparse, days=dict(sorted({**old["days"], **part["days"]}.items())), ids=ids, source=src)
        if "has_is_rand" in old:
            meta["has_is_rand"] = bool(old["has_is_rand"]) and part["has_is_rand"]
        C.write_meta(stage, meta)
        # validate what would be published: the new meta and the new day files against it (the old
        # day files are valid against it too: same columns, ids below the old, smaller table sizes)
        _load_meta(stage)
        for d in new_days:
            validate_day_file(os.path.join(stage, part["days"][d]["file"]), meta, d, part["days"][d]["rows"])
        moves = [(os.path.join(stage, part["days"][d]["file"]), os.path.join(root, part["days"][d]["file"]))
                 for d in new_days]
        moves += [(os.path.abspath(a), os.path.abspath(b)) for a, b in extra_files]
        moves += [(V.vocab_path(stage, f), V.vocab_path(root, f)) for f in V.ID_FEATURES]
        _publish(stage, token, moves, meta_path)
        committed = True
    except BaseException:
        if not committed:
            _rollback(stage)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if verbose:
        rows = sum(part["days"][d]["rows"] for d in new_days)
        print(f"appended {rows} rows in {len(new_days)} days ({', '.join(new_days)}) to {root} "
              f"in {time.time() - t0:.1f}s; it now has {len(meta['days'])} days")
        print("joins: " + ", ".join(f"{k} {v}" for k, v in joins.items()))
        for f in V.ID_FEATURES:
            print(f"ids {f}: table {old['sparse'][f]['vocab']} -> {sparse[f]['vocab']} rows")
    return meta


def _check_appendable(meta_path: str, old: dict, base: dict, src: dict) -> None:
    """The data set was written by this converter's format and its vocabularies match meta.json."""
    want = {"sparse": {c: c in S.SPARSE_MULTI for c in S.SPARSE_FEATURES}, "dense": list(S.DENSE_FEATURES),
            "tasks": list(S.TASKS)}
    have = {"sparse": {c: spec.get("multi") for c, spec in old["sparse"].items()}, "dense": old["dense"],
            "tasks": old["tasks"]}
    for k in want:
        if have[k] != want[k]:
            raise data_error(meta_path, k, f"{have[k]} differs from what this converter writes ({want[k]}): "
                                           "convert the data set again instead of appending to it")
    for f in V.ID_FEATURES:
        if V.table_rows(base[f]) != old["sparse"][f]["vocab"]:
            raise data_error(V.vocab_path(os.path.dirname(meta_path), f), None,
                             f"{V.table_rows(base[f])} rows but meta.json's sparse.{f}.vocab is "
                             f"{old['sparse'][f]['vocab']}")
    strings = src.get("string_vocabs") or {}
    for c in S.STRING_SPARSE:
        if not isinstance(strings.get(c), list) or len(strings[c]) + 1 != old["sparse"][c]["vocab"]:
            raise data_error(meta_path, f"source.string_vocabs.{c}", "missing or inconsistent with "
                                                                     f"sparse.{c}.vocab: cannot keep its codes")


def _merge_vocab(path: str, base: pl.DataFrame, old_ids: dict, new_cov: dict, min_count: int) -> dict:
    """Rewrites the staged vocabulary at ``path`` with counts over every day (the data set's plus the
    new days'), checks that every existing id kept its row, and returns the feature's ``ids`` entry.
    Out-of-vocabulary ids are not stored, so an id below ``min_count`` on several conversions counts
    once per conversion in ``oov_ids`` (exact with ``min_count`` 1, where there are none)."""
    staged = pl.read_parquet(path)
    merged = (staged.join(base.select("raw_id", pl.col("count").alias("_old")), on="raw_id", how="left")
              .with_columns((pl.col("count") + pl.col("_old").fill_null(0)).alias("count"))
              .select("raw_id", "row", "count").sort("row"))
    top = int(base["row"].max()) if base.height else V.FIRST_ROW - 1
    kept = merged.filter(pl.col("row") <= top).select("raw_id", "row")
    if not kept.equals(base.select("raw_id", "row").sort("row")):  # build_vocab guarantees it
        raise data_error(path, "row", "an existing id would change its row")
    merged.write_parquet(path)
    present = merged.filter(pl.col("count") > 0).height
    oov_ids = int(old_ids.get("oov_ids", 0)) + int(new_cov["oov_ids"])
    distinct = present + oov_ids
    return {"distinct_raw_ids": distinct, "distinct_rows": present + (1 if oov_ids else 0), "oov_ids": oov_ids,
            "oov_impressions": int(old_ids.get("oov_impressions", 0)) + int(new_cov["oov_impressions"]),
            "collision_rate": (oov_ids if oov_ids > 1 else 0) / distinct if distinct else 0.0,
            "table_rows": V.table_rows(merged), "min_count": min_count}


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit_meta(staged: str, meta_path: str) -> None:
    """The commit point of an append (a function of its own so that tests can fail it)."""
    os.replace(staged, meta_path)


def _publish(stage: str, token: str, moves, meta_path: str) -> None:
    backup = os.path.join(stage, "backup")
    os.mkdir(backup)
    entries = [{"src": a, "dst": b, "existed": os.path.exists(b), "backup": os.path.join(backup, str(i))}
               for i, (a, b) in enumerate(moves)]
    tmp = os.path.join(stage, _MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"token": token, "entries": entries}, fh, indent=1)
    _fsync(tmp)
    os.replace(tmp, os.path.join(stage, _MANIFEST))
    for e in entries:  # every backup before the first move: a rollback finds one for each replaced file
        if e["existed"]:
            try:
                os.link(e["dst"], e["backup"])
            except OSError:
                shutil.copy2(e["dst"], e["backup"])
    staged_meta = C.meta_path(stage)
    for path in [e["src"] for e in entries] + [staged_meta]:
        _fsync(path)
    for e in entries:
        os.replace(e["src"], e["dst"])
    _commit_meta(staged_meta, meta_path)
    try:
        _fsync(os.path.dirname(meta_path))
    except OSError:
        pass


def _rollback(stage: str) -> None:
    """Undo the moves an uncommitted append made (from its manifest; none made: nothing to undo)."""
    path = os.path.join(stage, _MANIFEST)
    if not os.path.isfile(path):
        return
    with open(path) as fh:
        entries = json.load(fh)["entries"]
    for e in reversed(entries):
        if e["existed"]:
            if os.path.exists(e["backup"]):
                os.replace(e["backup"], e["dst"])
        elif os.path.exists(e["dst"]):
            os.remove(e["dst"])


def recover_appends(root: str) -> list[str]:
    """Clean up after appends to ``root`` that were killed: a stage whose token meta.json records
    (committed) is removed, any other is rolled back first. Call with the lock held; returns the
    stage names handled. An unreadable meta.json is left for the caller to report."""
    try:
        appended = ((C.read_meta(root).get("source") or {}).get("appended") or [])
    except (OSError, ValueError, AttributeError):
        return []
    tokens = {r.get("token") for r in appended if isinstance(r, dict)}
    done = []
    for name in sorted(os.listdir(root)):
        stage = os.path.join(root, name)
        if not (name.startswith(APPEND_STAGE_PREFIX) and os.path.isdir(stage)):
            continue
        if name not in tokens:
            _rollback(stage)
        shutil.rmtree(stage, ignore_errors=True)
        done.append(name)
    return done


def _parse_min_count_args(items) -> dict:
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep:
            raise SystemExit(f"--min-count {it!r}: expected NAME=INT")
        try:
            out[k] = int(v)
        except ValueError:
            raise SystemExit(f"--min-count {it!r}: {v!r} is not an int") from None
    return out


def main(argv=None) -> int:
    used = lambda cols: ", ".join(cols)
    epilog = (f"Columns read (every other column is ignored):\n"
              f"  log:    {used(S.LOG_REQUIRED)} (+ {used(S.ORACLE_COLUMNS)} when present: synthetic data's "
              f"true probabilities; + {C.RAND_COLUMN} when present: random exposure, 0 when absent)\n"
              f"  users:  {used(S.USER_REQUIRED)}\n"
              f"  videos: {used(S.VIDEO_REQUIRED)}\n"
              f"KuaiRand columns ignored:\n"
              f"  log:    {used(c for c in S.LOG_COLUMNS if c not in S.LOG_REQUIRED and c != C.RAND_COLUMN)}\n"
              f"  users:  {used(c for c in S.USER_COLUMNS if c not in S.USER_REQUIRED)}\n"
              f"  videos: {used(c for c in S.VIDEO_COLUMNS if c not in S.VIDEO_REQUIRED)}\n")
    ap = argparse.ArgumentParser(prog="python -m data_tools.convert", description=__doc__, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", required=True, nargs="+", help="log CSV file(s) or glob(s)")
    ap.add_argument("--users", required=True)
    ap.add_argument("--videos", required=True)
    ap.add_argument("--out", help="the processed data set to write (a new directory; see --overwrite)")
    ap.add_argument("--append-to", metavar="ROOT",
                    help="instead of --out: add the log's days to the processed data set ROOT in place (old day "
                         "files untouched, ids keep their rows, new ids appended; a day ROOT already has, or one "
                         "before its last day, is refused)")
    ap.add_argument("--min-count", action="append", default=[], metavar="NAME=INT",
                    help="impressions an id needs for an embedding row of its own; rarer ids share the "
                         f"out-of-vocabulary row (default 1 for each of {', '.join(V.ID_FEATURES)})")
    ap.add_argument("--extend-vocab", metavar="DIR",
                    help="an earlier processed data set: its ids keep their rows, new ids get rows after them")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, metavar="N",
                    help="rows of a day sorted at once; a longer day is sorted a time range at a time: peak memory "
                         f"follows N and the vocabularies, not the log's rows (default {DEFAULT_CHUNK_ROWS:,})")
    ap.add_argument("--row-group-rows", type=int, default=C.ROW_GROUP_ROWS, metavar="N",
                    help="rows per Parquet row group of a day file: the unit a training rank reads under "
                         f"data.read=own_row_groups (default {C.ROW_GROUP_ROWS:,})")
    ap.add_argument("--max-unmatched", type=float, default=0.01, metavar="FRACTION",
                    help="largest share of log rows whose user or video has no feature row (default 0.01)")
    ap.add_argument("--max-conflicting-duplicates", type=int, default=0, metavar="N",
                    help="ids a feature file may repeat with conflicting values (default 0)")
    args = ap.parse_args(argv)
    if (args.out is None) == (args.append_to is None):
        ap.error("give exactly one of --out and --append-to")
    if args.append_to is not None:
        if args.min_count or args.extend_vocab or args.overwrite:
            ap.error("--append-to keeps the data set's vocabularies and min_count: --min-count, --extend-vocab "
                     "and --overwrite do not apply")
        try:
            append_days(args.log, args.users, args.videos, args.append_to, verbose=True,
                        max_unmatched_fraction=args.max_unmatched,
                        max_conflicting_duplicates=args.max_conflicting_duplicates)
        except DataError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return ExitStatus.USAGE
        return 0
    try:
        convert(args.log, args.users, args.videos, args.out, _parse_min_count_args(args.min_count),
                overwrite=args.overwrite, verbose=True, max_unmatched_fraction=args.max_unmatched,
                max_conflicting_duplicates=args.max_conflicting_duplicates, extend_vocab=args.extend_vocab,
                chunk_rows=args.chunk_rows, row_group_rows=args.row_group_rows)
    except DataError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
