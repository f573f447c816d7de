"""The user and video feature tables of a conversion.

How the raw log joins them (:func:`check_joins`: log rows whose user or video has no feature row, and
ids a feature file repeats, counted and refused above a threshold), and their typed copies in the
stage directory (:func:`write_user_table`, :func:`write_video_table`): one row per id, string
categoricals encoded with a sorted vocabulary (1-based, 0 = missing; an earlier conversion's codes
kept), dense values untransformed by statistics and null where missing or a KuaiRand sentinel. Each
day's rows are joined with them by :mod:`data_tools.day_files`.
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from data_tools import schema as S
from data_tools.errors import data_error
from data_tools.validate_raw import parse_date_expr, parse_expr, scan_raw_csv, tag_list_expr

# The string categoricals of each feature table, in the order their codes are listed.
USER_STRINGS = ("user_active_degree",) + tuple(f"{c}_range" for c in S.RANGE_SOURCES)
VIDEO_STRINGS = ("video_type", "upload_type")
# A feature row's place in its file: of the rows that repeat an id, the first is kept.
_FILE_ROW = "_file_row"


def check_joins(files, users: str, videos: str, max_unmatched_fraction: float,
                max_conflicting_duplicates: int) -> dict:
    """Counts what the feature joins would otherwise do silently: log rows whose user (video) has no
    feature row (they would get all-zero features), and ids repeated in a feature file, exactly
    (dropped) or with conflicting values (only the first would be kept). Raises DataError above the
    thresholds, naming the file, the column, the count and an example id.

    Memory follows the feature file's id count as one sorted int64 array (32M videos: 256 MB) and the
    log's distinct ids, never the feature file's other columns: duplicates are found on the sorted ids,
    and only the rows of a repeated id are compared column by column (grouping every row by id with its
    values holds the whole file: BENCHMARKS.md, "Reading the catalog axis")."""
    ids = pl.concat([scan_raw_csv(f).select(parse_expr("user_id", pl.Int64, lenient_int=False),
                                             parse_expr("video_id", pl.Int64, lenient_int=False)) for f in files])
    # each id's log rows (streaming: memory ~ the log's distinct ids); every row is in one group, so they sum
    # to the log's rows without a pass of their own
    rows_per_id = {col: ids.group_by(col).agg(pl.len().alias("rows")).collect(engine="streaming")
                   for col in ("user_id", "video_id")}
    log_rows = int(rows_per_id["user_id"]["rows"].sum())
    counts: dict = {"log_rows": log_rows}
    for kind, path, col in (("user", users, "user_id"), ("video", videos, "video_id")):
        table = scan_raw_csv(path).with_columns(parse_expr(col, pl.Int64))
        known = np.sort(table.select(col).collect(engine="streaming")[col].drop_nulls().to_numpy())
        repeated = np.unique(known[1:][known[1:] == known[:-1]])  # each repeated id once
        dup = {"ids": len(repeated), "conflicting": 0, "example": None}
        if len(repeated):  # only the repeated ids' rows, each id's distinct values counted
            per_id = table.filter(pl.col(col).is_in(pl.Series(repeated))).group_by(col).agg(
                pl.struct(pl.all().exclude(col)).n_unique().alias("distinct")).sort(col).collect()
            conflicting = per_id.filter(pl.col("distinct") > 1)[col]
            dup.update(conflicting=conflicting.len(), example=conflicting[0] if conflicting.len() else None)
        per_log_id = rows_per_id[col]
        logged = per_log_id[col].fill_null(_NEVER_AN_ID).to_numpy()
        at = np.minimum(np.searchsorted(known, logged), max(len(known) - 1, 0))
        matched = (known[at] == logged) if len(known) else np.zeros(len(logged), bool)
        matched &= per_log_id[col].is_not_null().to_numpy()  # a null id has no feature row
        unmatched = {"rows": int(per_log_id["rows"].to_numpy()[~matched].sum()), "example": None}
        if unmatched["rows"]:  # the first unmatched log row's id, in log order
            missing = per_log_id.filter(pl.Series(~matched))[col]
            unmatched["example"] = ids.filter(pl.col(col).is_in(missing.drop_nulls()) | pl.col(col).is_null()) \
                .select(pl.col(col).first()).collect(engine="streaming").item()
        counts[f"unmatched_{kind}_rows"] = unmatched["rows"]
        counts[f"duplicate_{kind}_ids"] = dup["ids"]
        counts[f"conflicting_{kind}_ids"] = dup["conflicting"]
        if dup["conflicting"] > max_conflicting_duplicates:
            raise data_error(path, col, f"{dup['conflicting']} ids repeated with conflicting feature values (e.g. "
                                        f"{dup['example']}); allowed: {max_conflicting_duplicates} "
                                        "(max_conflicting_duplicates=N)")
        if unmatched["rows"] > max_unmatched_fraction * log_rows:
            raise data_error(path, col, f"{unmatched['rows']} of {log_rows} log rows "
                                        f"({unmatched['rows'] / log_rows:.2%}) have a {col} with no row in this "
                                        f"file (e.g. {unmatched['example']}); allowed: {max_unmatched_fraction:.2%} "
                                        "(max_unmatched=FRACTION)")
    return counts


# Stands in for a null log id in the sorted search (then marked unmatched whatever it finds).
_NEVER_AN_ID = -1


def _string_vocab(lf: pl.LazyFrame, cols, base: dict | None = None) -> dict[str, list[str]]:
    """Per column, its values in code order (code = index + 1): sorted; with ``base`` (an earlier
    conversion's ``string_vocabs``), the base values first, in their order, then the new values
    sorted, so that every existing value keeps its code."""
    out = {}
    for c in cols:
        # a frame's unique() in the streaming engine: memory ~ the distinct values, not the file's rows
        values = lf.select(parse_expr(c, pl.String).alias(c)).drop_nulls().unique() \
            .collect(engine="streaming")[c].sort()
        old = list((base or {}).get(c) or [])
        seen = set(old)
        out[c] = old + [v for v in values if v not in seen]
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


def write_user_table(tmp: str, users: str, string_base: dict | None, write: bool) -> tuple[str, dict]:
    """The user table of the feature file ``users`` (the first row of a repeated user_id): categoricals
    encoded, dense values raw (null where missing), written to ``tmp/_users.parquet`` when ``write``
    (a resumed conversion's is there already). Returns its path and the string categoricals' values in
    code order (``string_base``: an earlier conversion's, kept)."""
    ulf = scan_raw_csv(users)
    u_str = USER_STRINGS
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
    if write:
        uq.sink_parquet(upath)
    return upath, uvocab


def write_video_table(tmp: str, videos: str, string_base: dict | None, write: bool,
                      lpath: str) -> tuple[str, dict]:
    """The video table of the feature file ``videos`` (the first row of a repeated video_id), with its raw
    author, music and tag ids (encoded through the id vocabularies when a day is written), written to
    ``tmp/_videos.parquet`` when ``write``. Returns its path and the string categoricals' values in code
    order (``string_base``: an earlier conversion's, kept).

    Only the videos of the typed log ``lpath`` are kept: they are the only rows a day or a vocabulary
    joins, so the joins' memory follows the log's distinct videos, not the catalog (KuaiRand-27K's is
    32M videos). The string codes are still those of every value in the file."""
    vlf = scan_raw_csv(videos)
    v_str = VIDEO_STRINGS
    vvocab = _string_vocab(vlf, v_str, string_base)
    w = parse_expr("server_width", pl.Float64)
    h = parse_expr("server_height", pl.Float64)
    duration = parse_expr("video_duration", pl.Float64)
    vq = vlf.select(
        parse_expr("video_id", pl.Int64).alias("video_id"),
        parse_expr("author_id", pl.Int64).alias("author_raw"),
        parse_expr("music_id", pl.Int64).alias("music_raw"),
        *[parse_expr(c, pl.String) for c in v_str],
        tag_list_expr("tag").alias("tag_raw"),
        pl.when(duration >= 0).then((duration / 1000.0).log1p()).otherwise(None).alias("log_video_duration_s"),
        pl.when((h > 0) & (w > 0)).then((w / h).clip(0.0, 4.0)).otherwise(None).alias("aspect_ratio"),
        parse_date_expr("upload_dt").alias("_upload_date"),
    )
    vpath = os.path.join(tmp, "_videos.parquet")
    if write:
        # collected apart: a unique() inside the join's input keeps the whole query out of the streaming engine
        logged = pl.scan_parquet(lpath).select("video_id").unique().collect(engine="streaming")
        vq = vq.with_row_index(_FILE_ROW).join(logged.lazy(), on="video_id", how="semi")
        # The log's videos' rows are streamed out of the file first; only then deduplicated and their strings
        # encoded: polars runs neither sort, keep-first nor replace_strict in its streaming engine, and a
        # query holding one runs whole in memory, the whole file's rows with it.
        vq.sink_parquet(vpath)
        pl.read_parquet(vpath).sort(_FILE_ROW).unique(subset="video_id", keep="first", maintain_order=True) \
            .drop(_FILE_ROW).with_columns(*[_encode(c, vvocab[c]) for c in v_str]).write_parquet(vpath)
    return vpath, vvocab
