"""Convert raw KuaiRand-schema CSVs into a processed data set (see DATA_CONTRACT.md).

Streaming / lazy polars: the raw log is scanned (never loaded whole), joined with the user and
video feature tables, and written with one ``sink_parquet`` per date, sorted by ``time_ms``.
Everything is written into a temp directory next to ``out`` and renamed into place at the end,
so a failure leaves no half-written output.

Feature encoding:
- integer ids (user_id, video_id, author_id, music_id, tab, tag ids) are hashed into [1, vocab)
  with ``((x mod P) * 2654435761 mod P) mod (vocab - 1) + 1``, P = 4294967311; 0 = missing
- string categoricals use a sorted vocabulary of the values in the feature files, 1-based,
  0 = missing; their vocab is ``len(values) + 1``
- hour = hourmin // 100 + 1 (0 = missing), vocab 25
- missing joins -> 0 ids, 0.0 dense, empty tag list (counted, and refused above --max-unmatched)

CLI: ``python -m data_tools.convert --log GLOB --users FILE --videos FILE --out DIR
[--vocab user_id=N ...] [--overwrite]``; exit status 2 on bad input (the message names the file
and column; nothing is written).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time

import polars as pl

from data_tools import schema as S
from data_tools.errors import DataError, data_error
from data_tools.validate import (parse_date_expr, parse_expr, scan_raw_csv,
                                 tag_list_expr, validate_processed, validate_raw)

HASH_MULT = 2654435761
HASH_PRIME = 4294967311


def hash_ids(e: pl.Expr, vocab: int) -> pl.Expr:
    """Deterministic hash of non-negative Int64 ids into [1, vocab); null -> 0."""
    x = e.cast(pl.UInt64)
    h = ((x % HASH_PRIME) * HASH_MULT % HASH_PRIME) % (vocab - 1) + 1
    return pl.when(e.is_not_null()).then(h.cast(pl.Int64)).otherwise(pl.lit(0, pl.Int64))


def hash_id_value(x: int, vocab: int) -> int:
    """Python reference of :func:`hash_ids` for one id."""
    return ((x % HASH_PRIME) * HASH_MULT % HASH_PRIME) % (vocab - 1) + 1


def resolve_vocab(vocab: dict | None) -> dict:
    out = dict(S.DEFAULT_VOCAB)
    for k, v in (vocab or {}).items():
        if k not in S.DEFAULT_VOCAB:
            if k in S.STRING_SPARSE or k == "hour":
                continue  # derived from the data; ignored
            raise DataError(f"vocab: field '{k}': not a hashed sparse feature "
                            f"(hashed: {sorted(S.DEFAULT_VOCAB)})")
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise DataError(f"vocab: field '{k}': must be an int >= 2, got {v!r}")
        out[k] = v
    return out


def _string_vocab(lf: pl.LazyFrame, cols) -> dict[str, list[str]]:
    q = lf.select([parse_expr(c, pl.String).drop_nulls().unique().sort().implode().alias(c)
                   for c in cols]).collect()
    return {c: list(q[c][0]) for c in cols}


def _encode(col: str, values: list[str]) -> pl.Expr:
    e = parse_expr(col, pl.String)
    if not values:
        return pl.lit(0, pl.Int64).alias(col)
    return e.replace_strict(values, list(range(1, len(values) + 1)), default=0,
                            return_dtype=pl.Int64).alias(col)


def _log1p_nonneg(e: pl.Expr) -> pl.Expr:
    return e.cast(pl.Float64).clip(lower_bound=0.0).log1p().fill_null(0.0).fill_nan(0.0)


def convert(log, users: str, videos: str, out: str, vocab: dict | None = None, *,
            overwrite: bool = False, source: dict | None = None, verbose: bool = False,
            max_unmatched_fraction: float = 0.01, max_conflicting_duplicates: int = 0) -> dict:
    """Convert raw CSVs (``log``: a glob, path or list) into the processed directory ``out``.

    Returns the written meta dict. Raises DataError (naming file and column) on bad input;
    on any failure ``out`` is left untouched and no temp directory remains. Joins are checked
    first (:func:`check_joins`): log rows whose user or video has no feature row, and feature
    rows that repeat an id with other values, are counted, reported in ``meta.source.joins`` and
    refused above ``max_unmatched_fraction`` of the log rows / ``max_conflicting_duplicates`` ids.
    """
    t0 = time.time()
    out = os.path.abspath(os.fspath(out))
    if os.path.exists(out) and not overwrite:
        raise data_error(out, None, "output directory already exists (pass overwrite=True / --overwrite)")
    voc = resolve_vocab(vocab)
    info = validate_raw(log, users, videos)
    files = info["log_files"]
    joins = check_joins(files, users, videos, max_unmatched_fraction, max_conflicting_duplicates)
    source = {**(source or {}), "joins": joins}
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        meta = _convert_into(tmp, files, users, videos, voc, info, source)
        validate_processed(tmp)
        if os.path.exists(out):
            trash = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
            os.rename(out, os.path.join(trash, "old"))
            os.rename(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        rows = sum(d["rows"] for d in meta["days"].values())
        print(f"converted {rows} rows in {len(meta['days'])} days into {out} in {time.time() - t0:.1f}s")
        print("joins: " + ", ".join(f"{k} {v}" for k, v in joins.items()))
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
    log_rows = ids.select(pl.len()).collect().item()
    counts["log_rows"] = log_rows
    for kind, path, col in (("user", users, "user_id"), ("video", videos, "video_id")):
        table = scan_raw_csv(path).with_columns(parse_expr(col, pl.Int64))
        per_id = table.group_by(col).agg(pl.len().alias("n"), pl.struct(pl.all().exclude(col)).n_unique().alias("distinct"))
        dup = per_id.filter(pl.col("n") > 1).select(
            pl.len().alias("ids"), (pl.col("distinct") > 1).sum().alias("conflicting"),
            pl.col(col).filter(pl.col("distinct") > 1).first().alias("example")).collect().row(0, named=True)
        unmatched = ids.join(table.select(col).unique(), on=col, how="anti").select(
            pl.len().alias("rows"), pl.col(col).first().alias("example")).collect().row(0, named=True)
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


def _convert_into(tmp, files, users, videos, voc, info, source) -> dict:
    has_oracle = info["has_oracle"]
    # ---- user table
    ulf = scan_raw_csv(users)
    u_str = ("user_active_degree",) + tuple(f"{c}_range" for c in S.RANGE_SOURCES)
    uvocab = _string_vocab(ulf, u_str)
    uq = ulf.select(
        parse_expr("user_id", pl.Int64).alias("user_id"),
        *[_encode(c, uvocab[c]) for c in u_str],
        *[_log1p_nonneg(parse_expr(c, pl.Int64)).alias(f"log_{c}") for c in S.RANGE_SOURCES],
        *[parse_expr(c, pl.Int64).cast(pl.Float64).alias(c)
          for c in ("is_lowactive_period", "is_live_streamer", "is_video_author")],
    ).unique(subset="user_id", keep="first", maintain_order=True)
    upath = os.path.join(tmp, "_users.parquet")
    uq.sink_parquet(upath)
    # ---- video table
    vlf = scan_raw_csv(videos)
    v_str = ("video_type", "upload_type")
    vvocab = _string_vocab(vlf, v_str)
    w = parse_expr("server_width", pl.Float64)
    h = parse_expr("server_height", pl.Float64)
    vq = vlf.select(
        parse_expr("video_id", pl.Int64).alias("video_id"),
        hash_ids(parse_expr("author_id", pl.Int64), voc["author_id"]).alias("author_id"),
        hash_ids(parse_expr("music_id", pl.Int64), voc["music_id"]).alias("music_id"),
        *[_encode(c, vvocab[c]) for c in v_str],
        tag_list_expr("tag").list.eval(hash_ids(pl.element(), voc["tag"])).alias("tag"),
        _log1p_nonneg(parse_expr("video_duration", pl.Float64) / 1000.0).alias("log_video_duration_s"),
        pl.when(h > 0).then((w / h).clip(0.0, 4.0)).otherwise(0.0).fill_null(0.0).fill_nan(0.0)
        .alias("aspect_ratio"),
        parse_date_expr("upload_dt").alias("_upload_date"),
    ).unique(subset="video_id", keep="first", maintain_order=True)
    vpath = os.path.join(tmp, "_videos.parquet")
    vq.sink_parquet(vpath)
    # ---- log: one typed pass into a temp parquet, then one sink per date
    oracle_cols = list(S.ORACLE_COLUMNS) if has_oracle else []
    parts = []
    for f in files:
        parts.append(scan_raw_csv(f).select(
            *[parse_expr(c, pl.Int64, lenient_int=False) for c in S.LOG_REQUIRED],
            *[parse_expr(c, pl.Float64).cast(pl.Float32).alias(c) for c in oracle_cols],
        ))
    lpath = os.path.join(tmp, "_log.parquet")
    (pl.concat(parts) if len(parts) > 1 else parts[0]).sink_parquet(lpath)

    label_exprs = []
    for t in S.TASKS:
        comps = S.TASK_COMPONENTS[t]
        label_exprs.append((pl.max_horizontal([pl.col(c) for c in comps]) > 0)
                           .cast(pl.Float32).alias(f"label_{t}"))
    dense_out = [pl.col(c).fill_null(0.0).cast(pl.Float32).alias(c) for c in S.DENSE_FEATURES
                 if c != "log_video_age_days"]
    days = {}
    for date in info["dates"]:
        day_date = dt.datetime.strptime(str(date), "%Y%m%d").date()
        fname = S.day_file(date)
        q = (pl.scan_parquet(lpath).filter(pl.col("date") == date)
             .join(pl.scan_parquet(upath), on="user_id", how="left")
             .join(pl.scan_parquet(vpath), on="video_id", how="left")
             .select(
                 hash_ids(pl.col("user_id"), voc["user_id"]).alias("user_id"),
                 hash_ids(pl.col("video_id"), voc["video_id"]).alias("video_id"),
                 pl.col("author_id").fill_null(0),
                 pl.col("music_id").fill_null(0),
                 hash_ids(pl.col("tab"), voc["tab"]).alias("tab"),
                 (pl.col("hourmin") // 100 + 1).clip(0, S.HOUR_VOCAB - 1).fill_null(0).alias("hour"),
                 *[pl.col(c).fill_null(0) for c in u_str + v_str],
                 pl.col("tag").fill_null(pl.lit([], dtype=pl.List(pl.Int64))),
                 *dense_out,
                 (pl.lit(day_date) - pl.col("_upload_date")).dt.total_days().cast(pl.Float64)
                 .clip(lower_bound=0.0).log1p().fill_null(0.0).cast(pl.Float32)
                 .alias("log_video_age_days"),
                 *label_exprs,
                 *[pl.col(c) for c in oracle_cols],
                 pl.col("user_id").alias("user_id_raw"),
                 pl.col("video_id").alias("video_id_raw"),
                 pl.col("date"),
                 pl.col("time_ms"),
             )
             .select(list(S.SPARSE_FEATURES) + list(S.DENSE_FEATURES) + list(S.LABEL_COLUMNS)
                     + oracle_cols + list(S.RAW_ID_COLUMNS) + ["date", "time_ms"])
             .sort("time_ms", maintain_order=True))
        path = os.path.join(tmp, fname)
        q.sink_parquet(path)
        rows = pl.scan_parquet(path).select(pl.len()).collect().item()
        days[str(date)] = {"file": fname, "rows": int(rows)}
    for p in (upath, vpath, lpath):
        os.remove(p)

    sparse = {}
    for c in S.SPARSE_FEATURES:
        if c in voc:
            v = voc[c]
        elif c == "hour":
            v = S.HOUR_VOCAB
        else:
            v = len((uvocab | vvocab)[c]) + 1
        sparse[c] = {"vocab": int(v), "multi": c in S.SPARSE_MULTI}
    meta = {
        "format_version": S.FORMAT_VERSION,
        "sparse": sparse,
        "dense": list(S.DENSE_FEATURES),
        "tasks": list(S.TASKS),
        "days": days,
        "has_oracle": has_oracle,
        "source": {
            "log": [os.path.abspath(f) for f in files],
            "users": os.path.abspath(users),
            "videos": os.path.abspath(videos),
            "string_vocabs": uvocab | vvocab,
            "hash": f"((x mod {HASH_PRIME}) * {HASH_MULT} mod {HASH_PRIME}) mod (vocab - 1) + 1",
            **(source or {}),
        },
    }
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def _parse_vocab_args(items) -> dict:
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep:
            raise SystemExit(f"--vocab {it!r}: expected NAME=INT")
        try:
            out[k] = int(v)
        except ValueError:
            raise SystemExit(f"--vocab {it!r}: {v!r} is not an int") from None
    return out


def main(argv=None) -> int:
    used = lambda cols: ", ".join(cols)
    epilog = (f"Columns read (every other column is ignored):\n"
              f"  log:    {used(S.LOG_REQUIRED)} (+ {used(S.ORACLE_COLUMNS)} when present: synthetic data's "
              f"true probabilities)\n"
              f"  users:  {used(S.USER_REQUIRED)}\n"
              f"  videos: {used(S.VIDEO_REQUIRED)}\n")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", required=True, nargs="+", help="log CSV file(s) or glob(s)")
    ap.add_argument("--users", required=True)
    ap.add_argument("--videos", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", action="append", default=[], metavar="NAME=INT",
                    help=f"hashed vocab size (defaults: {S.DEFAULT_VOCAB})")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--max-unmatched", type=float, default=0.01, metavar="FRACTION",
                    help="largest share of log rows whose user or video has no feature row (default 0.01)")
    ap.add_argument("--max-conflicting-duplicates", type=int, default=0, metavar="N",
                    help="ids a feature file may repeat with conflicting values (default 0)")
    args = ap.parse_args(argv)
    try:
        convert(args.log, args.users, args.videos, args.out, _parse_vocab_args(args.vocab),
                overwrite=args.overwrite, verbose=True, max_unmatched_fraction=args.max_unmatched,
                max_conflicting_duplicates=args.max_conflicting_duplicates)
    except DataError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
