"""Validation of raw KuaiRand-schema CSVs (DATA_CONTRACT.md): ``validate_raw(log_files, users_file,
videos_file) -> dict``, run by the converter before it writes anything, and the parsing expressions the
converter shares with it (:func:`parse_expr`, :func:`parse_date_expr`, :func:`tag_list_expr`,
:func:`scan_raw_csv`). Raises :class:`data_tools.errors.DataError` naming the file, line, column and problem;
each file is checked with one lazy aggregate query. Processed data sets: :mod:`data_tools.validate`.
"""

from __future__ import annotations

import codecs
import glob
import os

import polars as pl

from data_tools import contract as C
from data_tools import schema as S
from data_tools.errors import DataError, data_error


# ---- shared parsing (the converter uses the same expressions) ---------------------------------
def parse_expr(col: str, dtype, lenient_int: bool = True) -> pl.Expr:
    """Parse a String column read with ``infer_schema=False`` into ``dtype`` (null if unparsable).

    With ``lenient_int``, Int64 columns also accept integral floats such as ``"12.0"`` (feature
    files; the log is parsed strictly, which is faster)."""
    e = pl.col(col).str.strip_chars()
    e = pl.when(e == "").then(None).otherwise(e)
    if dtype == pl.String:
        return e.alias(col)
    if dtype == pl.Int64 and lenient_int:
        # accept "12" and float-formatted integers such as "12.0" (pandas writes ints that way
        # when a column has missing values)
        i = e.cast(pl.Int64, strict=False)
        f = e.cast(pl.Float64, strict=False)
        ok = f.is_finite() & (f == f.floor()) & (f.abs() < 2.0**53)
        return (pl.when(i.is_not_null()).then(i).when(ok).then(f.cast(pl.Int64))
                .otherwise(None).alias(col))
    return e.cast(dtype, strict=False).alias(col)


def parse_date_expr(col: str) -> pl.Expr:
    """Parse ``YYYY-MM-DD`` or ``YYYYMMDD`` strings into a Date (null if unparsable)."""
    e = pl.col(col).str.strip_chars()
    return pl.coalesce(e.str.to_date("%Y-%m-%d", strict=False),
                       e.str.to_date("%Y%m%d", strict=False)).alias(col)


def tag_list_expr(col: str = "tag") -> pl.Expr:
    """Comma-separated tag string -> List(Int64) of parsed tag ids (null elements if bad)."""
    el = pl.element().str.strip_chars()
    return (pl.col(col).str.split(",")
            .list.eval(el.filter(el != "").cast(pl.Int64, strict=False)))


def scan_raw_csv(path: str) -> pl.LazyFrame:
    return pl.scan_csv(path, infer_schema=False, has_header=True)


def expand_files(spec) -> list[str]:
    """A glob pattern, a path, or a list of them -> sorted list of files (DataError if none, or if
    one file is named twice: a glob and its own name, or two spellings of one path, would read
    every row of it twice)."""
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[str] = []
    given: dict[str, str] = {}  # real path -> the spec that named it first
    for s in specs:
        s = os.fspath(s)
        hits = sorted(glob.glob(s)) if glob.has_magic(s) else [s]
        if not hits:
            raise DataError(f"{s}: no file matches this pattern")
        for h in hits:
            real = os.path.realpath(h)
            if real in given:
                raise DataError(f"{h}: given twice (by {given[real]!r} and by {s!r}): its rows would be read "
                                "twice; name each file once")
            given[real] = s
        files.extend(hits)
    return files


def _check_utf8(path: str, chunk_bytes: int = 1 << 24) -> None:
    """The whole file decodes as UTF-8 (polars stops at a bad byte with no file or line named)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                at = line + chunk.count(b"\n", 0, max(e.start, 0))
                raise data_error(path, None, f"line {at}: byte {chunk[e.start:e.start + 1]!r} is not UTF-8 "
                                             "(save the file as UTF-8)") from None
            if not chunk:
                return
            line += chunk.count(b"\n")


# ---- raw ----------------------------------------------------------------------------------------
def _header(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise data_error(path, None, "file not found")
    if os.path.getsize(path) == 0:
        raise data_error(path, None, "empty file (0 bytes, no header)")
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) not in (b"\n", b"\r"):
            # A CSV writer ends every line with a newline; a file without one was cut off, and its
            # last line (a truncated value, a row missing fields) would be read as data.
            raise data_error(path, None, "the file does not end with a newline: its last line is cut off "
                                         "(truncated file?)")
    _check_utf8(path)
    try:
        return list(scan_raw_csv(path).collect_schema().names())
    except Exception as e:  # noqa: BLE001 - any parser failure is a data problem
        raise data_error(path, None, f"not a readable CSV file ({type(e).__name__}: {e})") from None


def _check_field_counts(path: str, header: list[str]) -> None:
    """Every line has the header's number of fields. polars reads a row with too few fields as
    nulls in the missing columns, so a ragged or cut row would pass as missing values: count the
    separators outside quotes on every line instead (one extra pass over the file)."""
    lines = pl.scan_csv(path, has_header=False, separator="\x1f", quote_char=None, schema={"line": pl.String})
    fields = pl.col("line").str.replace_all('"[^"]*"', "").str.count_matches(",") + 1
    indexed = lines.with_row_index("index")
    # polars reads a blank line as a row of nulls (a misleading "1 missing value" later)
    blank = indexed.filter(pl.col("line").is_null() | (pl.col("line").str.len_bytes() == 0))
    st = blank.select(pl.len().alias("n"), pl.col("index").first().alias("first")).collect().row(0, named=True)
    if st["n"]:
        raise data_error(path, None, f"{st['n']} blank lines (first at line {st['first'] + 1}): a blank line "
                                     "would be read as a row of missing values; remove it")
    bad = indexed.filter((fields != len(header)) & (pl.col("line").str.len_bytes() > 0))
    st = bad.select(pl.len().alias("n"), pl.col("index").first().alias("first"),
                    fields.first().alias("fields")).collect(engine="streaming").row(0, named=True)
    if st["n"]:
        raise data_error(path, None, f"{st['n']} lines do not have the header's {len(header)} fields (first at line "
                                     f"{st['first'] + 1}, with {st['fields']}): a ragged or cut-off file")


def _first_line(cond: pl.Expr, name: str) -> pl.Expr:
    """The file line of the first row where ``cond`` holds (row ``__index`` i is line i + 2: the
    header is line 1, and blank lines were refused, so every line is a row)."""
    return (pl.col("__index").filter(cond).first() + 2).alias(name)


def _check_csv(path: str, kind: str, dtypes: dict, required, not_null, nonneg,
               floats_finite, extra_checks=None, lenient_int: bool = True) -> dict:
    cols = _header(path)
    missing = [c for c in required if c not in cols]
    if missing:
        raise data_error(path, missing[0],
                         f"required {kind} column missing (missing: {missing}; file has: {cols})")
    _check_field_counts(path, cols)
    checked = [c for c in dtypes if c in cols]
    # stage 1: parse every column once; stage 2: aggregate the parsed columns
    stage1 = [pl.col(c) for c in checked]
    for c in checked:
        raw = parse_expr(c, pl.String)
        if c == "upload_dt":
            parsed = parse_date_expr(c)
        elif c == "tag":
            tl = tag_list_expr(c)
            parsed = tl.list.eval(pl.element().is_null() | (pl.element() < 0)).list.any().fill_null(False)
        else:
            parsed = parse_expr(c, dtypes[c], lenient_int)
        stage1 += [raw.is_null().alias(f"{c}__isnull"), parsed.alias(f"{c}__p")]
    # every line of the file is a row here (blank lines were refused above): row i is line i + 2
    stage1.append(pl.col("__index"))
    lf = scan_raw_csv(path).with_row_index("__index").select(checked + ["__index"]).select(stage1)
    aggs = [pl.len().alias("__rows")]
    for c in checked:
        isnull, p = pl.col(f"{c}__isnull"), pl.col(f"{c}__p")
        bad = ~isnull & p.is_null()
        aggs += [isnull.sum().alias(f"{c}__null"),
                 bad.sum().alias(f"{c}__bad"),
                 pl.col(c).filter(bad).first().alias(f"{c}__badval"), _first_line(bad, f"{c}__badline"),
                 _first_line(isnull, f"{c}__nullline")]
        if c in nonneg:
            aggs += [(p < 0).sum().alias(f"{c}__neg"), p.min().alias(f"{c}__min"), _first_line(p < 0, f"{c}__negline")]
        if c in floats_finite:
            aggs += [p.is_nan().sum().alias(f"{c}__nan"), p.is_infinite().sum().alias(f"{c}__inf"),
                     _first_line(p.is_nan() | p.is_infinite(), f"{c}__nanline")]
        if c == "tag":
            aggs += [p.sum().alias("tag__badtag"),
                     pl.col(c).filter(p).first().alias("tag__badtagval"), _first_line(p, "tag__badtagline")]
    if extra_checks:
        aggs += extra_checks
    try:
        st = lf.select(aggs).collect(engine="streaming").row(0, named=True)
    except Exception as e:  # noqa: BLE001
        raise data_error(path, None, f"cannot parse CSV ({type(e).__name__}: {e})") from None
    if st["__rows"] == 0:
        raise data_error(path, None, "no data rows (empty file)")
    for c in checked:
        if st[f"{c}__bad"]:
            want = "a YYYY-MM-DD date" if c == "upload_dt" else str(dtypes[c])
            raise data_error(path, c, f"{st[f'{c}__bad']} values not parsable as {want} "
                                      f"(first at line {st[f'{c}__badline']}: {st[f'{c}__badval']!r})")
        if c in not_null and st[f"{c}__null"]:
            raise data_error(path, c, f"{st[f'{c}__null']} missing (null/empty) values (first at line "
                                      f"{st[f'{c}__nullline']})")
        if c in nonneg and st[f"{c}__neg"]:
            what = "ids" if c in (S.LOG_ID_COLUMNS + S.USER_ID_COLUMNS + S.VIDEO_ID_COLUMNS) else "values"
            raise data_error(path, c, f"{st[f'{c}__neg']} negative {what} (min {st[f'{c}__min']}), first at line "
                                      f"{st[f'{c}__negline']}")
        if c in floats_finite and (st[f"{c}__nan"] or st[f"{c}__inf"]):
            raise data_error(path, c, f"{st[f'{c}__nan']} NaN and {st[f'{c}__inf']} infinite values (first at line "
                                      f"{st[f'{c}__nanline']})")
        if c == "tag" and st["tag__badtag"]:
            raise data_error(path, c, f"{st['tag__badtag']} rows with tag ids that are not "
                                      f"non-negative integers (first at line {st['tag__badtagline']}: "
                                      f"{st['tag__badtagval']!r})")
    st["__columns"] = cols
    return st


def validate_raw(log_files, users_file: str, videos_file: str) -> dict:
    """Check raw KuaiRand-schema CSVs; return ``{"dates": [...], "rows": n, "has_oracle": bool,
    "log_files": [...]}``. Raises DataError naming file and column on any problem."""
    files = expand_files(log_files)
    label_cols = [c for cs in S.TASK_COMPONENTS.values() for c in cs]
    dates: set[int] = set()
    rows = 0
    has_oracle = True
    for f in files:
        cols = _header(f)
        oracle_cols = [c for c in S.ORACLE_COLUMNS if c in cols]
        dtypes = {c: S.LOG_COLUMNS[c] for c in S.LOG_REQUIRED}
        dtypes.update({c: pl.Float64 for c in oracle_cols})
        rand_cols = [C.RAND_COLUMN] if C.RAND_COLUMN in cols else []
        dtypes.update({c: pl.Int64 for c in rand_cols})
        d, hm = pl.col("date__p"), pl.col("hourmin__p")
        y, m, dd = d // 10000, (d // 100) % 100, d % 100
        # A calendar date (20220431 is not one), in a plausible range.
        calendar = d.cast(pl.String).str.to_date("%Y%m%d", strict=False)
        baddate = d.is_not_null() & (calendar.is_null() | (y < 1900) | (y > 2200))
        badhm = (hm < 0) | (hm > 2359) | (hm % 100 > 59)
        extra = [
            baddate.sum().alias("__baddate"), d.filter(baddate).first().alias("__baddateval"),
            _first_line(baddate, "__baddateline"),
            badhm.sum().alias("__badhm"), hm.filter(badhm).first().alias("__badhmval"), _first_line(badhm, "__badhmline"),
        ]
        for c in oracle_cols:
            o = pl.col(f"{c}__p")
            outside = (o <= 0) | (o >= 1) | o.is_null()
            extra += [outside.sum().alias(f"{c}__range"), _first_line(outside, f"{c}__rangeline")]
        for c in rand_cols:
            r = pl.col(f"{c}__p")
            extra += [(r > 1).sum().alias("__badrand"), r.filter(r > 1).first().alias("__badrandval"),
                      _first_line(r > 1, "__badrandline")]
        st = _check_csv(f, "log", dtypes, S.LOG_REQUIRED, S.LOG_NOT_NULL + tuple(oracle_cols) + tuple(rand_cols),
                        S.LOG_ID_COLUMNS + tuple(label_cols) + ("time_ms",) + tuple(rand_cols), tuple(oracle_cols),
                        extra, lenient_int=False)
        if rand_cols and st["__badrand"]:
            raise data_error(f, C.RAND_COLUMN, f"{st['__badrand']} values not 0 or 1 (first at line "
                                           f"{st['__badrandline']}: {st['__badrandval']!r})")
        if st["__baddate"]:
            raise data_error(f, "date", f"{st['__baddate']} values not calendar dates in YYYYMMDD form "
                                        f"(first at line {st['__baddateline']}: {st['__baddateval']!r})")
        if st["__badhm"]:
            raise data_error(f, "hourmin", f"{st['__badhm']} values not an HHMM time of day "
                                           f"(first at line {st['__badhmline']}: {st['__badhmval']!r})")
        for c in oracle_cols:
            if st[f"{c}__range"]:
                raise data_error(f, c, f"{st[f'{c}__range']} probabilities outside (0, 1) (first at line "
                                       f"{st[f'{c}__rangeline']})")
        has_oracle = has_oracle and len(oracle_cols) == len(S.ORACLE_COLUMNS)
        # a pass of its own: polars' streaming engine holds every row of a unique() inside an aggregation,
        # but a frame's unique() keeps only the distinct values
        dates.update(int(x) for x in scan_raw_csv(f).select(parse_expr("date", pl.Int64, lenient_int=False))
                     .drop_nulls().unique().collect(engine="streaming")["date"])
        rows += st["__rows"]
    _check_csv(users_file, "user feature", {c: S.USER_COLUMNS[c] for c in S.USER_REQUIRED},
               S.USER_REQUIRED, S.USER_NOT_NULL, S.USER_ID_COLUMNS, ())
    vdt = {c: S.VIDEO_COLUMNS[c] for c in S.VIDEO_REQUIRED}
    _check_csv(videos_file, "video feature", vdt, S.VIDEO_REQUIRED, S.VIDEO_NOT_NULL,
               S.VIDEO_ID_COLUMNS, S.VIDEO_DENSE_SOURCES)
    return {"dates": sorted(dates), "rows": rows, "has_oracle": has_oracle, "log_files": files}
