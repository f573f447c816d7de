"""Writes the processed data set of raw CSVs into a directory, step by step (:func:`_convert_into`).

The step that :func:`data_tools.convert.convert` (a new data set, in its stage directory) and
:func:`data_tools.append.append_days` (the new days of one, in the append's stage) share: the feature
tables (:mod:`data_tools.feature_tables`), the typed log and the id vocabularies
(:mod:`data_tools.id_vocabs`), the day files (:mod:`data_tools.day_files`), then the meta file.
"""

from __future__ import annotations

import os

from data_tools import contract as C
from data_tools import schema as S
from data_tools import vocab as V
from data_tools.day_files import DEFAULT_CHUNK_ROWS, day_query_of, write_days, write_typed_log
from data_tools.feature_tables import write_user_table, write_video_table
from data_tools.id_vocabs import id_vocabularies
from data_tools.phase_log import PhaseLog
from data_tools.resume import _Progress


def _convert_into(tmp, files, users, videos, min_count, base, info, source, string_base=None, *,
                  chunk_rows: int = DEFAULT_CHUNK_ROWS, row_group_rows: int = C.ROW_GROUP_ROWS,
                  progress: _Progress | None = None, phases: PhaseLog | None = None) -> dict:
    """Converts the validated raw CSVs (``files``: the log files, ``info``: what
    :func:`data_tools.validate_raw.validate_raw` found) into the directory ``tmp``: day files, ``vocab/``
    and the meta file (returned). ``min_count`` per id feature, ``base``: vocabularies to extend,
    ``string_base``: string categoricals' codes to keep, ``source``: added to the meta file's ``source``.
    ``progress``: what an interrupted conversion into ``tmp`` wrote already (its typed tables,
    vocabularies and finished days are kept); ``phases``: each step's time and peak memory. Scratch files
    (the typed tables) are removed at the end."""
    progress = progress or _Progress(tmp, {})
    phases = phases or PhaseLog()
    has_oracle = info["has_oracle"]
    write = not progress.tables  # a resumed conversion has its typed tables already
    oracle_cols = list(S.ORACLE_COLUMNS) if has_oracle else []
    with phases.phase("typed log"):
        lpath, without_rand = write_typed_log(tmp, files, oracle_cols, write)
    with phases.phase("user table"):
        upath, uvocab = write_user_table(tmp, users, string_base, write)
    with phases.phase("video table"):  # after the log: only the log's videos are kept
        vpath, vvocab = write_video_table(tmp, videos, string_base, write, lpath)
    with phases.phase("id vocabularies"):
        vocabs, ids = id_vocabularies(tmp, lpath, vpath, min_count, base, progress)
    with phases.phase("day files"):
        day_query = day_query_of(lpath, upath, vpath, vocabs, oracle_cols)
        days = write_days(tmp, info["dates"], day_query, lpath, progress, chunk_rows=chunk_rows,
                          row_group_rows=row_group_rows)
    missing_values = {c: sum(d["dense_stats"][S.missing_indicator(c)]["sum"] for d in days.values())
                      for c in S.DENSE_VALUES}
    for p in (upath, vpath, lpath):
        os.remove(p)
    progress.remove()

    meta = {
        "format_version": C.FORMAT_VERSION,
        "layout": {"version": C.LAYOUT_VERSION, "row_group_rows": row_group_rows},
        "sparse": _sparse_tables(vocabs, uvocab | vvocab),
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


def _sparse_tables(vocabs: dict, string_vocabs: dict) -> dict:
    """the meta file's ``sparse``: per sparse feature, its table's rows and whether it is a list feature."""
    sparse = {}
    for c in S.SPARSE_FEATURES:
        if c in vocabs:
            v = V.table_rows(vocabs[c])
        elif c == "hour":
            v = S.HOUR_VOCAB
        else:
            v = len(string_vocabs[c]) + 1
        sparse[c] = {"vocab": int(v), "multi": c in S.SPARSE_MULTI}
    return sparse
