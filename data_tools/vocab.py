"""Exact id vocabularies: every raw id kept gets an embedding row of its own.

Why not a hash: the hash this project used before (``(x * 2654435761 mod P) mod (vocab - 1) + 1``)
maps sequential ids, which is what KuaiRand's are, onto far fewer rows than a random hash would:
KuaiRand-Pure's 27,285 user ids land on about 16.9k rows of 100,000 (about 76% of users share a
row); a random hash into the same table would still merge about 12% of them. An exact vocabulary
merges none, costs one row per id, and is what a production ranking model uses for its id
features, with a frequency threshold for the long tail.

Layout of each feature's rows:

- row 0: missing (the raw id is null, e.g. a log row whose video has no feature row);
- row 1: out of vocabulary (ids seen fewer than ``min_count`` times);
- rows 2, 3, ...: the kept ids, in order of first appearance (date, then raw id).

Ordering by first appearance is what makes a vocabulary *extendable*: converting later days with
``base`` = the previous data set's vocabulary keeps every existing id on its row and appends the
new ids after the last one, so a published model's embedding rows keep their meaning (rows are
never remapped or reused). An id that was out of vocabulary before and now reaches ``min_count``
gets a new row; its old impressions trained the shared row 1.

Persisted per feature as ``vocab/<feature>.parquet`` (columns ``raw_id`` Int64, ``row`` Int64,
``count`` Int64: impressions in this data set's logs) next to the day files.
"""

from __future__ import annotations

import os

import polars as pl

MISSING_ROW = 0
OOV_ROW = 1
FIRST_ROW = 2
# Integer id features encoded through a vocabulary (tag is a list feature; each element is an id).
ID_FEATURES = ("user_id", "video_id", "author_id", "music_id", "tab", "tag")
VOCAB_DIR = "vocab"


def vocab_path(root: str, feature: str) -> str:
    return os.path.join(root, VOCAB_DIR, f"{feature}.parquet")


def build_vocab(occurrences: pl.LazyFrame, min_count: int = 1, base: pl.DataFrame | None = None) -> pl.DataFrame:
    """The vocabulary of one feature from its occurrences (columns ``raw_id``, ``date``; one row per
    impression, nulls ignored): ``raw_id``, ``row``, ``count``, sorted by row.

    ``base`` (a vocabulary from an earlier conversion) is kept as is, whatever the new counts; ids
    it lacks that occur at least ``min_count`` times get rows after its last one."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts = (occurrences.drop_nulls("raw_id").group_by("raw_id")
              .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("date").min().alias("first_date"))
              .collect(engine="streaming"))  # memory ~ distinct ids, not impressions
    if base is None:
        base = pl.DataFrame({"raw_id": [], "row": [], "count": []}, schema={"raw_id": pl.Int64, "row": pl.Int64,
                                                                              "count": pl.Int64})
    kept = base.select("raw_id", "row").join(counts.select("raw_id", "count"), on="raw_id", how="left") \
        .with_columns(pl.col("count").fill_null(0))
    next_row = int(base["row"].max()) + 1 if base.height else FIRST_ROW
    new = (counts.join(base.select("raw_id"), on="raw_id", how="anti")
           .filter(pl.col("count") >= min_count).sort(["first_date", "raw_id"])
           .with_row_index("row", offset=next_row).select("raw_id", pl.col("row").cast(pl.Int64), "count"))
    return pl.concat([kept.select("raw_id", "row", "count"), new]).sort("row")


def table_rows(vocab: pl.DataFrame) -> int:
    """The embedding table size this vocabulary needs (rows 0 and 1 included)."""
    return int(vocab["row"].max()) + 1 if vocab.height else FIRST_ROW


def coverage(vocab: pl.DataFrame, occurrences: pl.LazyFrame) -> dict:
    """What the vocabulary does to this data: distinct raw ids, distinct rows they map to, ids and
    impressions sent to the out-of-vocabulary row, and the collision rate (the share of distinct
    ids that share a row with another id; with an exact vocabulary only the OOV row is shared)."""
    counts = occurrences.drop_nulls("raw_id").group_by("raw_id").agg(pl.len().alias("n")).collect(engine="streaming")
    mapped = counts.join(vocab.select("raw_id", "row"), on="raw_id", how="left")
    oov = mapped.filter(pl.col("row").is_null())
    distinct = counts.height
    oov_ids = oov.height
    rows = mapped["row"].drop_nulls().n_unique() + (1 if oov_ids else 0)
    shared = oov_ids if oov_ids > 1 else 0
    return {"distinct_raw_ids": distinct, "distinct_rows": int(rows), "oov_ids": oov_ids,
            "oov_impressions": int(oov["n"].sum()) if oov_ids else 0,
            "collision_rate": shared / distinct if distinct else 0.0, "table_rows": table_rows(vocab)}


def hash_collision_rate(ids: pl.Series, rows_of) -> float:
    """The share of distinct ids that share a row with another id under the mapping ``rows_of``
    (a function of an Int64 Series; used to measure hashes against the exact vocabulary)."""
    ids = ids.unique()
    rows = rows_of(ids)
    per_row = pl.DataFrame({"row": rows}).group_by("row").agg(pl.len().alias("n"))
    return float(per_row.filter(pl.col("n") > 1)["n"].sum()) / ids.len()


def encode(raw: pl.Expr, mapping_row: pl.Expr) -> pl.Expr:
    """Row of a raw id after a left join with its vocabulary (``mapping_row``: the joined row)."""
    return pl.when(raw.is_null()).then(pl.lit(MISSING_ROW, pl.Int64)).otherwise(
        mapping_row.fill_null(OOV_ROW)).cast(pl.Int64)
