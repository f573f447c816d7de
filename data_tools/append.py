"""Appending days to a processed data set in place (``python -m data_tools.convert data.root=DIR append=true``).

The new days are converted into a stage, ``ROOT/.append-XXXX/``, with the data set's vocabularies,
string codes, min_count and row-group size (:func:`data_tools.write_processed._convert_into`); the
vocabularies' counts are merged, the meta file updated and the new files validated; then everything is
moved into place with os.replace, the meta file last (the commit). Before the first move, the stage's
manifest.json lists every move and keeps a hard link (or copy) of each file it replaces, so an append
that fails or is killed half way is rolled back: at once when it fails, or by the next append (under
the lock) when it was killed (:func:`recover_appends`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from data_tools import contract as C
from data_tools import schema as S
from data_tools import vocab as V
from data_tools.errors import data_error
from data_tools.feature_tables import check_joins
from data_tools.fileio import file_lock
from data_tools.id_vocabs import _base_vocabs, _merge_vocab
from data_tools.validate import _load_meta, validate_day_file
from data_tools.validate_raw import scan_raw_csv, validate_raw
from data_tools.write_processed import _convert_into

APPEND_STAGE_PREFIX = ".append-"
_MANIFEST = "manifest.json"


def append_days(log, users: str, videos: str, root: str, *, source: dict | None = None,
                verbose: bool = False, max_unmatched_fraction: float = 0.01,
                max_conflicting_duplicates: int = 0) -> dict:
    """Add the days of raw CSVs (``log``: a glob, path or list) to the processed data set ``root``
    in place and return its new meta dict.

    Existing day files are not touched; each id vocabulary keeps every row and appends the ids first
    seen on the new days (with ``min_count`` as recorded in the meta file, judged on the new days'
    impressions); string categoricals keep their codes and append new values; the meta file's
    ``days``, ``sparse`` table sizes, ``ids``, ``has_is_rand`` and ``source`` (``appended_days``,
    ``appended``: one record per append, ``string_vocabs``, ``missing_values``) are updated.
    Refused with a DataError, nothing written: a day already in the data set or before its last
    day, a data set with oracle columns and a log without them, anything :func:`data_tools.convert.convert` refuses.
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
    path) pairs moved into place with the data set's files, before the meta file, and rolled back with
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
    _check_new_days(meta_path, old, info, new_days)
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
        record = {"days": new_days, "log": [os.path.abspath(f) for f in files], "users": os.path.abspath(users),
                  "videos": os.path.abspath(videos), "joins": joins, **(source or {}), "token": token}
        meta = _appended_meta(meta_path, old, part, ids, new_days, record)
        C.write_meta(stage, meta)
        _validate_staged(stage, meta, part, new_days)
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
            print(f"ids {f}: table {old['sparse'][f]['vocab']} -> {meta['sparse'][f]['vocab']} rows")
    return meta


def _check_new_days(meta_path: str, old: dict, info: dict, new_days: list) -> None:
    """The log's days can be appended to the data set (meta ``old``): none is in it already, none comes
    before its last day, and the log has the oracle columns if the data set's day files have them."""
    files = info["log_files"]
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


def _appended_meta(meta_path: str, old: dict, part: dict, ids: dict, new_days: list, record: dict) -> dict:
    """The data set's the meta file after the append: the old meta ``old`` with the new days, table sizes
    and ``ids`` of the converted part ``part``, and its ``source`` extended (``record``: the append's)."""
    src_old = old.get("source") or {}
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
    src["appended"] = list(src_old.get("appended") or []) + [record]
    meta = dict(old)
    meta.update(sparse=sparse, days=dict(sorted({**old["days"], **part["days"]}.items())), ids=ids, source=src)
    if "has_is_rand" in old:
        meta["has_is_rand"] = bool(old["has_is_rand"]) and part["has_is_rand"]
    return meta


def _validate_staged(stage: str, meta: dict, part: dict, new_days: list) -> None:
    """Validates what would be published: the new meta and the new day files against it (the old
    day files are valid against it too: same columns, ids below the old, smaller table sizes)."""
    _load_meta(stage)
    for d in new_days:
        validate_day_file(os.path.join(stage, part["days"][d]["file"]), meta, d, part["days"][d]["rows"])


def _check_appendable(meta_path: str, old: dict, base: dict, src: dict) -> None:
    """The data set was written by this converter's format and its vocabularies match the meta file."""
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
                             f"{V.table_rows(base[f])} rows but {C.META_FILE}'s sparse.{f}.vocab is "
                             f"{old['sparse'][f]['vocab']}")
    strings = src.get("string_vocabs") or {}
    for c in S.STRING_SPARSE:
        if not isinstance(strings.get(c), list) or len(strings[c]) + 1 != old["sparse"][c]["vocab"]:
            raise data_error(meta_path, f"source.string_vocabs.{c}", "missing or inconsistent with "
                                                                     f"sparse.{c}.vocab: cannot keep its codes")


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
    """Clean up after appends to ``root`` that were killed: a stage whose token the meta file records
    (committed) is removed, any other is rolled back first. Call with the lock held; returns the
    stage names handled. An unreadable the meta file is left for the caller to report."""
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
