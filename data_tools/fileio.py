"""File locks and atomic writes, shared by the trainer, the data tools and the retraining job.

- :func:`write_text_atomic` / :func:`write_json_atomic`: a reader never sees a half-written file
  (written under a temporary name, then renamed into place).
- :func:`file_lock`: an exclusive ``flock`` that waits (concurrent builders of one data set).
- :func:`try_exclusive_lock`: an exclusive ``flock`` that does not wait (one retraining job or one
  append at a time); raises :class:`LockHeld` naming the holder.
- :func:`abs_path`: a configured path made absolute (``~`` expanded), as every job reads one.

Limits: a local (or POSIX) filesystem; rename and flock are what these rely on. The module imports
only the standard library and sits in ``data_tools``, the bottom package, so every package of the
project can use it without an import circle (a leaf: pyproject.toml's import contracts).
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from typing import IO, Iterator


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
