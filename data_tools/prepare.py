"""Make sure a processed synthetic data set exists (generate + convert on first use).

``ensure_dataset(root, generator, min_count)`` returns ``root`` when it already holds a valid
processed data set built from the same generator config, id min_count and format version; otherwise it generates the
raw KuaiRand-schema CSVs into ``root + ".raw"`` (via a temp dir + rename), converts them into
``root`` atomically and returns ``root``. An ``fcntl`` lock on ``root + ".lock"`` makes
concurrent callers (e.g. several local worker processes) wait for one builder.
A valid processed data set in ``root`` without generator provenance (e.g. converted real
KuaiRand data) is returned as is and never overwritten.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager

from data_tools import schema as S
from data_tools.convert import convert, resolve_min_count
from data_tools.errors import DataError
from data_tools.generate import (LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE,
                                 GeneratorConfig, generate)
from data_tools.validate import validate_processed


@contextmanager
def file_lock(path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class LockHeld(RuntimeError):
    """Another process holds the lock; ``holder`` is what it wrote into the lock file."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path} is held by {holder}")
        self.holder = holder


def try_exclusive_lock(path: str):
    """Takes an exclusive flock on ``path`` without waiting and returns the open file that holds
    it (the OS drops it when the file is closed or the process dies, so a killed holder never
    leaves a stale lock); writes this process's pid into it for the next one to name. Raises
    :class:`LockHeld` with the holder's pid when another process has it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise LockHeld(path, holder) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def _existing(root: str, cfg: GeneratorConfig, voc: dict) -> tuple[bool, str]:
    """(usable, reason)."""
    try:
        meta = validate_processed(root)
    except DataError as e:
        return False, str(e)
    src = meta.get("source") or {}
    if "generator" not in src:
        return True, "valid processed data set (not generated here)"
    if src.get("generator") != cfg.to_dict():
        return False, "generator config differs"
    if src.get("min_count") != voc:
        return False, "id min_count differs"
    return True, "valid"


def ensure_dataset(root: str, generator: dict | None = None, min_count: dict | None = None) -> str:
    """Return ``root`` holding a valid processed data set, generating it if needed."""
    root = os.path.abspath(os.fspath(root))
    cfg = generator if isinstance(generator, GeneratorConfig) else GeneratorConfig.from_dict(generator)
    voc = resolve_min_count(min_count)
    ok, _ = _existing(root, cfg, voc) if os.path.exists(root) else (False, "missing")
    if ok:
        return root
    with file_lock(root + ".lock"):
        ok, reason = _existing(root, cfg, voc) if os.path.exists(root) else (False, "missing")
        if ok:  # another process built it while we waited
            return root
        t0 = time.time()
        raw = root + ".raw"
        parent = os.path.dirname(root)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(raw)}.tmp-", dir=parent)
        try:
            os.chmod(tmp, 0o755)
            generate(cfg, tmp)
            if os.path.exists(raw):
                shutil.rmtree(raw)
            os.rename(tmp, raw)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        meta = convert(os.path.join(raw, LOG_FILE), os.path.join(raw, USER_FILE),
                       os.path.join(raw, VIDEO_FILE), root, voc, overwrite=True,
                       source={"generator": cfg.to_dict(), "min_count": voc, "raw_dir": raw,
                               "oracle_file": os.path.join(raw, ORACLE_FILE)})
        rows = sum(d["rows"] for d in meta["days"].values())
        print(f"[data_tools] generating synthetic data set into {root} ({reason}): {rows} rows, "
              f"{len(meta['days'])} days, raw CSVs in {raw}, took {time.time() - t0:.1f}s", flush=True)
        return root


def load_oracle(root: str) -> dict | None:
    """The generator's oracle.json for a data set built by ensure_dataset (None if unknown)."""
    try:
        with open(os.path.join(root, "meta.json")) as f:
            src = json.load(f).get("source") or {}
        with open(src["oracle_file"]) as f:
            return json.load(f)
    except (OSError, KeyError, ValueError):
        return None


__all__ = ["ensure_dataset", "load_oracle", "file_lock", "try_exclusive_lock", "LockHeld"]
