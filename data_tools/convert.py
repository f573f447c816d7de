"""Convert raw KuaiRand-schema CSVs into a processed data set (see DATA_CONTRACT.md).

Bounded memory: the raw log is scanned in streaming passes (never loaded whole): validated, copied
once into a typed Parquet file, counted into the id vocabularies; then each date is joined with the
user and video feature tables and written sorted by ``time_ms`` (ties in log order), a day longer
than ``chunk_rows`` a time range at a time. Peak memory follows the vocabulary sizes and the chunk
size, not the log's rows (benchmarks/scaling.py measures it). Everything is written into a stage
directory next to the output (``.<name>.partial``) and renamed into place at the end, so a failure
leaves no half-written output; a conversion killed half way resumes after its last finished day
when run again on the same inputs.

Feature encoding:
- integer ids (user_id, video_id, author_id, music_id, tab, tag ids) go through an exact
  vocabulary (:mod:`data_tools.vocab`): row 0 = missing, 1 = out of vocabulary (fewer than
  ``min_count`` impressions), 2.. = one row per id in order of first appearance; persisted in
  ``vocab/`` and extendable with ``extend_vocab=DIR`` (existing ids keep their rows)
- string categoricals use a sorted vocabulary of the values in the feature files, 1-based,
  0 = missing; their vocab is ``len(values) + 1``
- hour = hourmin // 100 + 1 (0 = missing), vocab 25
- dense features are stored untransformed by statistics, null where missing (an empty field, a
  KuaiRand sentinel such as -124, a missing join), each with a ``<name>_missing`` indicator; the
  per-day count / sum / sum of squares of each is in the data set's meta file, so that the trainer normalizes
  with the statistics of its own training days only
- ``is_rand`` (random exposure, 0/1; 0 when a log file has no such column) is kept as a column,
  never a model input
- missing joins -> row 0 ids, null dense, empty tag list (counted, and refused above
  ``max_unmatched``)

CLI: ``python -m data_tools.convert log=GLOB users=CSV videos=CSV data.root=DIR
[min_count.user_id=N ...] [extend_vocab=DIR] [overwrite=true]``; exit status 2 on bad input (the
message names the file and column; nothing is written).

New days: ``python -m data_tools.convert data.root=DIR append=true log=GLOB users=CSV videos=CSV``
(:func:`append_days`) adds the log's days to the processed data set DIR in place: old day files
are not rewritten, vocabularies are extended (existing rows unchanged), the meta file is replaced last.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, Optional

from data_tools import contract as C
from data_tools import schema as S
from data_tools import vocab as V
from data_tools.append import append_days
from data_tools.cli_args import DataSet, opt, parse, usage_error
from data_tools.day_files import DEFAULT_CHUNK_ROWS
from data_tools.errors import DataError, data_error
from data_tools.exit_status import ExitStatus
from data_tools.feature_tables import check_joins
from data_tools.id_vocabs import _base_vocabs, resolve_min_count
from data_tools.phase_log import PhaseLog
from data_tools.resume import _Progress, open_stage, resume_key, start_or_resume
from data_tools.validate import _load_meta, validate_processed
from data_tools.validate_raw import validate_raw
from data_tools.write_processed import _convert_into

# This module holds the command and convert() (options, stage, publishing, report); each step has a module
# of its own: feature_tables (the user and video tables, the joins' checks), id_vocabs (the id
# vocabularies), day_files (the typed log and the day files), write_processed (a conversion into a
# directory), resume (the stage directory and resuming), append (appending days to a data set).


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

    Day files are written in row groups of ``row_group_rows`` rows (the meta file's ``layout`` version 2), the
    unit a training rank reads under ``data.read=own_row_groups``.
    """
    t0 = time.time()
    out = os.path.abspath(os.fspath(out))
    _check_options(out, overwrite, chunk_rows, row_group_rows)
    counts = resolve_min_count(min_count)
    base = _base_vocabs(extend_vocab)
    if string_vocabs is None and extend_vocab is not None and C.has_meta(extend_vocab):
        string_vocabs = _load_meta(extend_vocab).get("source", {}).get("string_vocabs")
    phases = PhaseLog(enabled=verbose)
    with phases.phase("validate raw"):
        info = validate_raw(log, users, videos)
    files = info["log_files"]
    with phases.phase("check joins"):
        joins = check_joins(files, users, videos, max_unmatched_fraction, max_conflicting_duplicates)
    source = {**(source or {}), "joins": joins}
    if extend_vocab is not None:
        source["extended_vocab_of"] = os.path.abspath(extend_vocab)
    tmp, stage_lock = open_stage(out)
    progress = _Progress(tmp, resume_key(files, users, videos, counts, extend_vocab, string_vocabs, source,
                                         row_group_rows))
    try:
        start_or_resume(tmp, progress, len(info["dates"]), verbose)
        meta = _convert_into(tmp, files, users, videos, counts, base, info, source, string_vocabs,
                             chunk_rows=chunk_rows, row_group_rows=row_group_rows, progress=progress,
                             phases=phases)
        with phases.phase("validate processed"):
            validate_processed(tmp)
        _move_into_place(tmp, out)
    except DataError:
        shutil.rmtree(tmp, ignore_errors=True)  # bad input: nothing worth resuming
        raise
    finally:
        os.close(stage_lock)
    if verbose:
        _print_summary(meta, out, joins, t0)
        print(phases.summary())
    return meta


def _check_options(out: str, overwrite: bool, chunk_rows: int, row_group_rows: int) -> None:
    """DataError unless ``out`` may be written and the sizes are ints >= 1."""
    if os.path.exists(out) and not overwrite:
        raise data_error(out, None, "output directory already exists (pass overwrite=True / overwrite=true)")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise DataError(f"chunk_rows: must be an int >= 1, got {chunk_rows!r}")
    if isinstance(row_group_rows, bool) or not isinstance(row_group_rows, int) or row_group_rows < 1:
        raise DataError(f"row_group_rows: must be an int >= 1, got {row_group_rows!r}")


def _move_into_place(tmp: str, out: str) -> None:
    """Renames the finished stage ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed."""
    parent = os.path.dirname(out)
    if os.path.exists(out):
        trash = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
        os.rename(out, os.path.join(trash, "old"))
        os.rename(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, out)


def _print_summary(meta: dict, out: str, joins: dict, t0: float) -> None:
    """What a conversion wrote: rows, joins, ids and missing values (a conversion started at ``t0``)."""
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


@dataclasses.dataclass
class ConvertArgs:
    """The command's arguments (``key=value``, :mod:`data_tools.cli_args`)."""
    log: Any = opt("???", "the log CSV file(s): a path, a glob ('DIR/log_standard_*.csv') or a list [a.csv,b.csv]",
                   "CSV")
    users: str = opt("???", "the user features CSV (KuaiRand's user_features_*.csv)", "CSV")
    videos: str = opt("???", "the video features CSV (KuaiRand's video_features_basic_*.csv)", "CSV")
    data: DataSet = opt(factory=DataSet, help="the processed data set to write (a new directory; see overwrite); "
                        "with append=true, the one the log's days are added to")
    append: bool = opt(False, "true: add the log's days to data.root in place (old day files untouched, ids keep "
                       "their rows, new ids appended; a day data.root already has, or one before its last day, "
                       "is refused)")
    min_count: Dict[str, int] = opt(factory=dict, metavar="{NAME:INT}",
                                    help="impressions an id needs for an embedding row of its own (or min_count.NAME="
                                         "INT); rarer ids share the out-of-vocabulary row (1 for each of "
                                         f"{', '.join(V.ID_FEATURES)} unless given)")
    extend_vocab: Optional[str] = opt(None, "an earlier processed data set: its ids keep their rows, new ids get "
                                      "rows after them", "DIR")
    overwrite: bool = opt(False, "true: replace an existing data.root")
    chunk_rows: int = opt(DEFAULT_CHUNK_ROWS, "rows of a day sorted at once; a longer day is sorted a time range "
                          "at a time: peak memory follows N and the vocabularies, not the log's rows", "N")
    row_group_rows: int = opt(C.ROW_GROUP_ROWS, "rows per Parquet row group of a day file: the unit a training "
                              "rank reads under data.read=own_row_groups", "N")
    max_unmatched: float = opt(0.01, "largest share of log rows whose user or video has no feature row",
                               "FRACTION")
    max_conflicting_duplicates: int = opt(0, "ids a feature file may repeat with conflicting values", "N")


# The spellings before the one convention (docs/data.md), each refused naming the new one.
OLD_SPELLINGS = {"--out": "data.root=DIR", "--append-to": "data.root=DIR append=true",
                 "--min-count": "min_count.NAME=INT"}


def _usage_doc() -> str:
    used = lambda cols: ", ".join(cols)
    return (f"{__doc__.strip()}\n\nColumns read (every other column is ignored):\n"
            f"  log:    {used(S.LOG_REQUIRED)} (+ {used(S.ORACLE_COLUMNS)} when present: synthetic data's "
            f"true probabilities; + {C.RAND_COLUMN} when present: random exposure, 0 when absent)\n"
            f"  users:  {used(S.USER_REQUIRED)}\n"
            f"  videos: {used(S.VIDEO_REQUIRED)}\n"
            f"KuaiRand columns ignored:\n"
            f"  log:    {used(c for c in S.LOG_COLUMNS if c not in S.LOG_REQUIRED and c != C.RAND_COLUMN)}\n"
            f"  users:  {used(c for c in S.USER_COLUMNS if c not in S.USER_REQUIRED)}\n"
            f"  videos: {used(c for c in S.VIDEO_COLUMNS if c not in S.VIDEO_REQUIRED)}")


def main(argv=None) -> int:
    args = parse(argv, ConvertArgs, "python -m data_tools.convert", _usage_doc(), OLD_SPELLINGS)
    if args.append:
        if args.min_count or args.extend_vocab or args.overwrite:
            usage_error("append=true keeps the data set's vocabularies and min_count: min_count, extend_vocab "
                        "and overwrite do not apply")
        try:
            append_days(args.log, args.users, args.videos, args.data.root, verbose=True,
                        max_unmatched_fraction=args.max_unmatched,
                        max_conflicting_duplicates=args.max_conflicting_duplicates)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return ExitStatus.USAGE
        return 0
    try:
        convert(args.log, args.users, args.videos, args.data.root, dict(args.min_count),
                overwrite=args.overwrite, verbose=True, max_unmatched_fraction=args.max_unmatched,
                max_conflicting_duplicates=args.max_conflicting_duplicates, extend_vocab=args.extend_vocab,
                chunk_rows=args.chunk_rows, row_group_rows=args.row_group_rows)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
