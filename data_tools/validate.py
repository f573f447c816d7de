"""Validation of processed data sets (DATA_CONTRACT.md); raw CSVs: :mod:`data_tools.validate_raw`.

- ``validate_processed(dir) -> meta`` is run by the trainer before training, ``validate_day_file`` by the
  converter, an append and a relayout on each day file they write.

Both raise :class:`data_tools.errors.DataError` whose message names the file, the column and
the problem. Each file is checked with one lazy aggregate query.

CLI: ``python -m data_tools.validate data.root=DIR`` (exit status 2 and the message on bad data).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import polars as pl
import pyarrow.parquet as pq

from data_tools import contract as C
from data_tools.cli_args import DataSet, opt
from data_tools.errors import DataError, data_error
from data_tools.exit_status import ExitStatus


# ---- processed --------------------------------------------------------------------------------
def _load_meta(root: str) -> dict:
    path = C.meta_path(root)
    if not os.path.isdir(root):
        raise data_error(root, None, "processed data directory not found")
    if not C.has_meta(root):
        raise data_error(path, None, f"{C.META_FILE} missing")
    try:
        meta = C.read_meta(root)
    except (OSError, ValueError) as e:
        raise data_error(path, None, f"not parseable JSON ({e})") from None
    if not isinstance(meta, dict):
        raise data_error(path, None, "top level must be a JSON object")
    for key, typ in (("format_version", int), ("sparse", dict), ("dense", list), ("tasks", list),
                     ("days", dict), ("has_oracle", bool)):
        if key not in meta:
            raise data_error(path, key, "required key missing")
        if not isinstance(meta[key], typ):
            raise data_error(path, key, f"must be a JSON {typ.__name__}, got {type(meta[key]).__name__}")
    if meta["format_version"] != C.FORMAT_VERSION:
        raise data_error(path, "format_version",
                         f"unsupported version {meta['format_version']} (expected {C.FORMAT_VERSION})")
    layout = meta.get("layout", {"version": 1})
    if not (isinstance(layout, dict) and layout.get("version") in (1, C.LAYOUT_VERSION)):
        raise data_error(path, "layout", f"needs {{'version': 1}} or {{'version': {C.LAYOUT_VERSION}, "
                                         f"'row_group_rows': int >= 1}}, got {layout!r}")
    if layout["version"] == C.LAYOUT_VERSION and not (isinstance(layout.get("row_group_rows"), int) and layout["row_group_rows"] >= 1):
        raise data_error(path, "layout.row_group_rows", f"must be an int >= 1, got {layout.get('row_group_rows')!r}")
    for name, spec in meta["sparse"].items():
        if not (isinstance(spec, dict) and isinstance(spec.get("vocab"), int) and spec["vocab"] >= 1
                and isinstance(spec.get("multi"), bool)):
            raise data_error(path, f"sparse.{name}", f"needs {{'vocab': int >= 1, 'multi': bool}}, got {spec!r}")
    if not meta["days"]:
        raise data_error(path, "days", "no days listed")
    for day, spec in meta["days"].items():
        if not (isinstance(spec, dict) and isinstance(spec.get("file"), str)):
            raise data_error(path, f"days.{day}", f"needs {{'file': str, 'rows': int}}, got {spec!r}")
        stats = spec.get("dense_stats")
        missing = [c for c in meta["dense"] if not (isinstance(stats, dict) and isinstance(stats.get(c), dict)
                                                      and {"count", "sum", "sumsq"} <= set(stats[c]))]
        if missing:
            raise data_error(path, f"days.{day}.dense_stats", f"no count/sum/sumsq for {missing} (the trainer "
                                                              "normalizes dense features with them)")
    return meta


def row_group_sizes(path: str) -> list[int]:
    """The row counts of a Parquet file's row groups (from its footer)."""
    footer = pq.read_metadata(path)
    return [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]


def miscut_row_group(sizes: list[int], rows_per_group: int) -> int | None:
    """The first row group that breaks layout 2 (every group ``rows_per_group`` rows, the last one at
    most that), or None."""
    return next((i for i, n in enumerate(sizes)
                 if n != rows_per_group and (i < len(sizes) - 1 or n > rows_per_group)), None)


def validate_day_file(path: str, meta: dict, day: str | None = None,
                      expected_rows: int | None = None) -> int:
    """Check one processed day file against ``meta``; return its row count."""
    if not os.path.isfile(path):
        raise data_error(path, None, f"day file listed in {C.META_FILE} does not exist")
    try:
        sch = pl.read_parquet_schema(path)
    except Exception as e:  # noqa: BLE001
        raise data_error(path, None, f"not a readable Parquet file ({type(e).__name__}: {e})") from None
    want: dict[str, object] = {}
    for name, spec in meta["sparse"].items():
        want[name] = pl.List(pl.Int64) if spec["multi"] else pl.Int64
    for name in meta["dense"]:
        want[name] = pl.Float32
    for t in meta["tasks"]:
        want[C.label_column(t)] = pl.Float32
        if meta["has_oracle"]:
            want[C.oracle_column(t)] = pl.Float32
    for c in C.SOURCE_COLUMNS:
        want[c] = pl.Int64
    if "has_is_rand" in meta:  # format 2 always writes the column (0 where a log file had none)
        want[C.RAND_COLUMN] = pl.Int8
    for c, dtype in want.items():
        if c not in sch:
            raise data_error(path, c, f"required column missing (file has: {list(sch)})")
        if sch[c] != dtype:
            raise data_error(path, c, f"dtype {sch[c]} (expected {dtype})")
    layout = meta.get("layout") or {"version": 1}
    if layout.get("version") == C.LAYOUT_VERSION:  # the row groups own_row_groups deals
        sizes, g = row_group_sizes(path), int(layout["row_group_rows"])
        bad = miscut_row_group(sizes, g)
        if bad is not None:
            raise data_error(path, None, f"row group {bad} holds {sizes[bad]} rows; {C.META_FILE}'s layout "
                                         f"{C.LAYOUT_VERSION} says {g} per group (the last may be shorter): "
                                         f"rewrite it with python -m data_tools.relayout data.root=DIR")
    aggs = [pl.len().alias("__rows")]
    for name, spec in meta["sparse"].items():
        e = pl.col(name).list.explode() if spec["multi"] else pl.col(name)
        aggs += [e.min().alias(f"{name}__min"), e.max().alias(f"{name}__max"),
                 pl.col(name).null_count().alias(f"{name}__null")]
    for name in meta["dense"]:  # null = missing (the loader fills it); NaN and inf are not values
        aggs.append((~pl.col(name).is_finite()).fill_null(False).sum().alias(f"{name}__bad"))
    if "has_is_rand" in meta:
        aggs.append((~pl.col(C.RAND_COLUMN).is_in([0, 1])).fill_null(True).sum().alias("__badrand"))
    for t in meta["tasks"]:
        c = C.label_column(t)
        aggs.append((~pl.col(c).is_in([0.0, 1.0])).fill_null(True).sum().alias(f"{c}__bad"))
        if meta["has_oracle"]:
            c = C.oracle_column(t)
            aggs.append(((pl.col(c) <= 0) | (pl.col(c) >= 1) | pl.col(c).is_nan())
                        .fill_null(True).sum().alias(f"{c}__bad"))
    aggs += [pl.col("date").n_unique().alias("__ndates"), pl.col("date").first().alias("__date"),
             *[pl.col(c).null_count().alias(f"{c}__null") for c in (*C.RAW_ID_COLUMNS, "time_ms")]]
    try:
        st = pl.scan_parquet(path).select(aggs).collect(engine="streaming").row(0, named=True)
        # on its own: the streaming engine runs an order-dependent diff over one column in bounded memory,
        # but beside the other aggregations it reads the whole file into memory
        st["__unsorted"] = pl.scan_parquet(path).select((pl.col("time_ms").diff() < 0).sum()) \
            .collect(engine="streaming").item()
    except Exception as e:  # noqa: BLE001
        raise data_error(path, None, f"not a readable Parquet file ({type(e).__name__}: {e})") from None
    if st["__rows"] == 0:
        raise data_error(path, None, "empty day partition (0 rows)")
    if expected_rows is not None and st["__rows"] != expected_rows:
        raise data_error(path, None, f"{st['__rows']} rows but {C.META_FILE} says {expected_rows}")
    for name, spec in meta["sparse"].items():
        lo, hi, v = st[f"{name}__min"], st[f"{name}__max"], spec["vocab"]
        if st[f"{name}__null"]:
            raise data_error(path, name, f"{st[f'{name}__null']} null values")
        if lo is not None and (lo < 0 or hi >= v):
            raise data_error(path, name, f"ids outside [0, {v}) (min {lo}, max {hi})")
    for name in meta["dense"]:
        if st[f"{name}__bad"]:
            raise data_error(path, name, f"{st[f'{name}__bad']} non-finite values (NaN or inf)")
    if "has_is_rand" in meta and st["__badrand"]:
        raise data_error(path, C.RAND_COLUMN, f"{st['__badrand']} values not 0 or 1")
    for t in meta["tasks"]:
        label, oracle = C.label_column(t), C.oracle_column(t)
        if st[f"{label}__bad"]:
            raise data_error(path, label, f"{st[f'{label}__bad']} values not in {{0, 1}}")
        if meta["has_oracle"] and st[f"{oracle}__bad"]:
            raise data_error(path, oracle, f"{st[f'{oracle}__bad']} values outside (0, 1)")
    for c in (*C.RAW_ID_COLUMNS, "time_ms"):
        if st[f"{c}__null"]:
            raise data_error(path, c, f"{st[f'{c}__null']} null values")
    if st["__unsorted"]:
        raise data_error(path, "time_ms", f"rows not sorted by time_ms ({st['__unsorted']} decreases)")
    if st["__ndates"] != 1 or (day is not None and str(st["__date"]) != str(day)):
        raise data_error(path, "date", f"expected a single date {day}, found {st['__ndates']} "
                                       f"distinct (first {st['__date']})")
    return st["__rows"]


def validate_processed(root: str, days=None) -> dict:
    """Validate a processed data set directory; return its meta dict (DataError on problems).
    ``days``: check only these day files (e.g. the new days a retraining job is about to train on)."""
    root = os.fspath(root)
    meta = _load_meta(root)
    for day, spec in sorted(meta["days"].items()):
        if days is None or day in days:
            validate_day_file(os.path.join(root, spec["file"]), meta, day, spec.get("rows"))
    return meta


@dataclasses.dataclass
class ValidateArgs:
    """The command's arguments (``key=value``, :mod:`data_tools.cli_args`)."""
    data: DataSet = opt(factory=DataSet, help=f"the processed data set to check (the directory holding {C.META_FILE})")


def main(argv=None) -> int:
    from data_tools.cli_args import parse

    args = parse(argv, ValidateArgs, "python -m data_tools.validate",
                 f"Validate a processed recsys-hdet data set (DATA_CONTRACT.md): {C.META_FILE}, every day file's columns, "
                 "types and id ranges.\nExit status 0: valid; 2: the first problem, naming the file, line or field.",
                 positional="data.root=DIR")
    root = args.data.root
    try:
        meta = validate_processed(root)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    rows = sum(d.get("rows", 0) for d in meta["days"].values())
    print(f"OK: {root}: {len(meta['days'])} days, {rows} rows, "
          f"{len(meta['sparse'])} sparse, {len(meta['dense'])} dense, has_oracle={meta['has_oracle']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
