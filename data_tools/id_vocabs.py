"""The id vocabularies of a conversion (the exact vocabularies of :mod:`data_tools.vocab`).

How many impressions an id needs for a row of its own (:func:`resolve_min_count`), the earlier data
set's vocabularies a conversion extends (:func:`_base_vocabs`), the vocabularies counted from the
typed log's impressions, author, music and tags through the log's videos (:func:`id_vocabularies`),
and, when days are appended, the new days' counts merged with the data set's (:func:`_merge_vocab`).
"""

from __future__ import annotations

import os

import polars as pl

from data_tools import vocab as V
from data_tools.errors import DataError, data_error
from data_tools.resume import _Progress


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


def id_vocabularies(tmp: str, lpath: str, vpath: str, min_count: dict, base: dict,
                    progress: _Progress) -> tuple[dict, dict]:
    """Per id feature, its vocabulary counted from the impressions of the typed log ``lpath`` (author,
    music and tags through the video table ``vpath``), extending ``base``'s, written to ``tmp/vocab/``,
    and its coverage (the meta file's ``ids``); read back when ``progress`` records them written."""
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
    return vocabs, ids


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
