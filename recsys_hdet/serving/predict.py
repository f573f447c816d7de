"""``python -m recsys_hdet.predict model_dir=MODEL_DIR data.root=DIR|log=FILE out=scores.parquet``: scores rows
with an exported model (:mod:`recsys_hdet.serving.artifact`).

What :func:`predict` scores (``input``; on the command line ``data.root=`` for a directory, ``log=`` for a file)
is either
- a processed data set's directory, with ``day=YYYYMMDD`` (default: its last day), or
- a processed day file (``day=YYYYMMDD.parquet``, DATA_CONTRACT.md) of the model's data set or of one
  that extended its vocabularies: its rows are scored in file order; or
- a raw KuaiRand-schema log CSV (with ``users=`` and ``videos=``, the feature files): converted as
  ``data_tools.convert`` converts a log, with every check it makes, through the model's vocabularies
  and string codes; the rows come out in the converter's order (by date, then ``time_ms``).

An id the model has no row for (a row past its table: a user, video, author, music, tab or tag it
never saw) is scored through the out-of-vocabulary row (row 1; string categoricals: 0, "missing"),
counted per feature and reported. ``out`` gets the raw ids and time of each row (``user_id_raw``,
``video_id_raw``, ``date``, ``time_ms``), its labels when the input has them, and ``pred_<task>``;
it is written to a temporary name and renamed. Bad input (a missing column, a wrong type, a null
or negative id, NaN or inf in a dense column) raises :class:`PredictError` naming the file, the
row (0-based, in file order) and the column; the command exits 2 and writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Optional

import numpy as np
import polars as pl
import torch

from data_tools import contract
from data_tools.vocab import OOV_ROW  # string categoricals have no out-of-vocabulary row (0: missing)
from recsys_hdet.serving.manifest import read_manifest

KEEP = contract.SOURCE_COLUMNS  # each row's source ids and time, copied into the scores


class PredictError(ValueError):
    """Input that cannot be scored; the message names the file, row and column."""


def _first_row(df: pl.DataFrame, bad: pl.Expr) -> int:
    return int(df.with_row_index("__row").filter(bad)["__row"][0])


def check_processed(df: pl.DataFrame, path: str, manifest: Dict[str, Any]) -> None:
    """Refuses what the program cannot score: the contract's columns with their types, no null or
    negative id, dense values finite or null."""
    want = {n: pl.Int64 for n in manifest["single_features"]}
    want.update({n: pl.List(pl.Int64) for n in manifest["multi_features"]})
    want.update({n: pl.Float32 for n in manifest["dense"]})
    for col, dtype in want.items():
        if col not in df.columns:
            raise PredictError(f"{path}: column '{col}': required column missing (file has: {df.columns})")
        if df.schema[col] != dtype:
            raise PredictError(f"{path}: column '{col}': dtype {df.schema[col]} (expected {dtype})")
    for col in manifest["single_features"] + manifest["multi_features"]:
        ids = pl.col(col).list.min() if col in manifest["multi_features"] else pl.col(col)
        for bad, what in ((pl.col(col).is_null(), "a null id (the contract's missing id is 0)"),
                          (ids < 0, "a negative id")):
            if df.select(bad.any()).item():
                raise PredictError(f"{path}: row {_first_row(df, bad)}: column '{col}': {what}")
    for col in manifest["dense"]:
        bad = ~pl.col(col).is_finite() & pl.col(col).is_not_null()
        if df.select(bad.any()).item():
            raise PredictError(f"{path}: row {_first_row(df, bad)}: column '{col}': NaN or inf (missing is null)")


def to_model_rows(df: pl.DataFrame, manifest: Dict[str, Any]) -> tuple[pl.DataFrame, Dict[str, int]]:
    """``df`` with every id past the model's table replaced by the out-of-vocabulary row (0 for a string
    categorical); returns it and, per feature, the rows that had such an id."""
    id_features = set(manifest["vocabularies"])
    unknown, fixes = {}, []
    for col in manifest["single_features"] + manifest["multi_features"]:
        rows = int(manifest["tables"][col])
        fallback = OOV_ROW if col in id_features else 0
        if col in manifest["multi_features"]:
            past = pl.col(col).list.max().fill_null(-1) >= rows
            fixes.append(pl.col(col).list.eval(pl.when(pl.element() >= rows).then(fallback).otherwise(pl.element())))
        else:
            past = pl.col(col) >= rows
            fixes.append(pl.when(past).then(fallback).otherwise(pl.col(col)).alias(col))
        unknown[col] = int(df.select(past.sum()).item())
    return df.with_columns(fixes), unknown


def model_inputs(df: pl.DataFrame, manifest: Dict[str, Any]) -> tuple:
    """The program's arguments for the rows of ``df`` (see :mod:`recsys_hdet.serving.program`)."""
    dense = torch.from_numpy(df.select(manifest["dense"]).to_numpy().astype(np.float32))
    ids = torch.from_numpy(np.ascontiguousarray(df.select(manifest["single_features"]).to_numpy().astype(np.int64)))
    values, offsets = [], []
    for col in manifest["multi_features"]:
        lengths = df[col].list.len().to_numpy().astype(np.int64)
        offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)))
        values.append(torch.from_numpy(df[col].explode().drop_nulls().to_numpy().astype(np.int64)))
    return dense, ids, values, offsets


def _convert_raw(manifest: Dict[str, Any], model_dir: str, log: str, users: str, videos: str, scratch: str) -> pl.DataFrame:
    """A raw log converted through the model's vocabularies (ids it never saw get rows past its tables)."""
    from data_tools.convert import convert

    root = os.path.join(scratch, "processed")
    meta = convert(log, users, videos, root, extend_vocab=model_dir, string_vocabs=manifest["string_vocabs"])
    return pl.concat([pl.read_parquet(os.path.join(root, d["file"])) for _, d in sorted(meta["days"].items())],
                     how="vertical_relaxed")


def day_file(root: str, day: Optional[str]) -> str:
    """A processed data set's day file (``day`` None: its last day)."""
    try:
        days = contract.read_meta(root)["days"]
    except (OSError, ValueError, KeyError) as e:
        raise PredictError(f"data.root={root}: not a processed data set ({contract.meta_path(root)}: "
                           f"{type(e).__name__}: {e})") from None
    day = str(day) if day is not None else max(days)
    if day not in days:
        raise PredictError(f"day={day}: not a day of {root} (it has {min(days)}..{max(days)})")
    return os.path.join(root, days[day]["file"])


def predict(model_dir: str, input: str, out: str, users: Optional[str] = None, videos: Optional[str] = None,
            batch_size: int = 65536, day: Optional[str] = None, say=print) -> Dict[str, Any]:
    """Scores ``input`` with the exported model; writes ``out``; returns ``{"rows", "unknown_ids"}``."""
    manifest = read_manifest(model_dir)
    input, out = os.path.abspath(input), os.path.abspath(out)
    if os.path.isdir(input):
        input = day_file(input, day)
    elif day is not None:
        raise PredictError(f"day={day}: only with data.root=DIR, a processed data set ({input} is a file)")
    if not os.path.isfile(input):
        raise PredictError(f"{input}: no such file or directory")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".predict-", dir=os.path.dirname(out)) as scratch:
        if input.endswith(".parquet"):
            try:
                df = pl.read_parquet(input)
            except Exception as e:  # noqa: BLE001 - polars raises several kinds for a broken file
                raise PredictError(f"{input}: not a readable Parquet file ({type(e).__name__}: {e})") from None
        else:
            if users is None or videos is None:
                raise PredictError(f"log={input}: a raw log needs users=USER_FEATURES.csv and "
                                   f"videos=VIDEO_FEATURES.csv (or give a processed data set: data.root=DIR "
                                   "day=YYYYMMDD)")
            df = _convert_raw(manifest, model_dir, input, users, videos, scratch)
        check_processed(df, input, manifest)
        df, unknown = to_model_rows(df, manifest)
        program = torch.export.load(os.path.join(model_dir, manifest["program"])).module()
        parts: List[np.ndarray] = []
        with torch.no_grad():
            for start in range(0, df.height, batch_size):
                parts.append(program(*model_inputs(df.slice(start, batch_size), manifest)).numpy())
        probs = np.concatenate(parts) if parts else np.zeros((0, len(manifest["tasks"])), np.float32)
        keep = [c for c in KEEP if c in df.columns] + [c for c in df.columns if c.startswith(contract.LABEL_PREFIX)]
        scores = df.select(keep).with_columns(
            [pl.Series(f"pred_{t}", probs[:, i]) for i, t in enumerate(manifest["tasks"])])
        tmp = os.path.join(scratch, "scores.parquet")
        scores.write_parquet(tmp)
        os.replace(tmp, out)
    say(f"scored {df.height} rows of {input} with {model_dir} into {out}")
    seen = {k: v for k, v in unknown.items() if v}
    say("ids the model has no row for (scored through the out-of-vocabulary row): "
        + (", ".join(f"{k} {v} rows" for k, v in seen.items()) if seen else "none"))
    return {"rows": df.height, "unknown_ids": unknown}
