"""File locks and atomic writes, shared by the trainer, the data tools and the retraining job.

- :func:`write_text_atomic` / :func:`write_json_atomic`: a reader never sees a half-written file
  (written under a temporary name, then renamed into place).
- :func:`file_lock`: an exclusive ``flock`` that waits (concurrent builders of one data set).
- :func:`try_exclusive_lock`: an exclusive ``flock`` that does not wait (one retraining job or one
  append at a time); raises :class:`LockHeld` naming the holder.
- :func:`abs_path`: a configured path made absolute (``~`` expanded), as every job reads one.
- :func:`staged_directory` / :func:`publish_directory` / :func:`write_manifest`: a directory written whole or
  not at all (staged beside its final name, its manifest fsynced, one rename, the stage removed on failure):
  the serving artifact, a registry version, a periodic checkpoint, a generated raw data set.
- :func:`read_json` / :func:`read_jsonl`: a JSON or JSON-lines file, None / empty when absent.

Limits: a local (or POSIX) filesystem; rename and flock are what these rely on. The module imports
only the standard library and sits in ``data_tools``, the bottom package, so every package of the
project can use it without an import circle (a leaf: pyproject.toml's import contracts).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import IO, Any, Dict, Iterator, List, Optional


def abs_path(path: object) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def write_text_atomic(path: str, text: str) -> None:
    """Writes a file so that readers never see it half-written: a temporary name, then a rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json_atomic(path: str, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=True) + "\n")


def write_manifest(directory: str, name: str, body: object) -> None:
    """Writes a staged directory's manifest (``indent=1`` JSON) and fsyncs it, so that the rename that
    publishes the directory never publishes a manifest still in the page cache."""
    with open(os.path.join(directory, name), "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def publish_directory(stage: str, final: str, *, replace: bool = False) -> None:
    """Moves the staged directory ``stage`` to ``final`` with one rename. ``replace``: an existing ``final``
    is first renamed aside and deleted only once the new one is in place (a crash in between leaves the
    old one beside, never neither); otherwise an existing ``final`` is an error (FileExistsError)."""
    os.chmod(stage, 0o755)  # tempfile.mkdtemp makes it 0700
    if not os.path.exists(final):
        os.rename(stage, final)
        return
    if not replace:
        raise FileExistsError(f"{final}: exists already")
    aside = f"{stage}.old"
    os.rename(final, aside)
    try:
        os.rename(stage, final)
    except BaseException:
        os.rename(aside, final)  # the old one back: a failed publish changes nothing
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def staged_directory(final: str, *, replace: bool = False, stage: Optional[str] = None) -> Iterator[str]:
    """Yields an empty directory beside ``final`` to write into; when the block ends without an exception
    it is published as ``final`` (:func:`publish_directory`), otherwise removed: a failure leaves nothing.
    ``stage``: a fixed name for it (a crashed attempt's leftovers there are removed first; default: a fresh
    ``.<name>.tmp-*``)."""
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    if stage is None:
        stage = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.tmp-", dir=parent)
    else:
        shutil.rmtree(stage, ignore_errors=True)
        os.makedirs(stage)
    try:
        yield stage
        publish_directory(stage, final, replace=replace)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Holds an exclusive flock on ``path`` (created if missing), waiting for other holders."""
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


def try_exclusive_lock(path: str) -> IO[str]:
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


def read_json(path: str) -> Optional[Any]:
    """A JSON artifact, or None when the file does not exist."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """A JSON-lines artifact (a run's metrics or HDET records); empty when the file does not exist."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
