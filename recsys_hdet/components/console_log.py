"""The run's console output, copied into ``<run_dir>/train.log``.

The launcher and its workers write to the console with ``print`` (the workers are spawned
processes, outside the launcher's ``logging`` setup), so Hydra's job log stayed empty. A
:class:`ConsoleLog` copies at the file-descriptor level, as ``tee`` does: descriptors 1 and 2 of the
launcher become pipes, which the spawned workers inherit, and one thread per pipe writes what
arrives to the original stdout (stderr) and to ``train.log``. The console shows exactly what it
showed before, stdout and stderr stay apart, and the log holds both in the order they arrived,
tracebacks of crashed workers included. A descriptor that already writes to ``train.log`` (a job
that runs training with its output redirected there, as the retraining job does) is left as is.

Limits: the local launcher only (under torchrun every rank is its own process tree: torchrun's
``--tee``/``--log-dir`` keep its logs); if the launcher is killed alone, its workers lose their
console and stop at their next write (a scheduler kills the whole process group).

:func:`output_to` is the other direction, for a process that runs several runs one after the other (the LR
range test's sweeps, :mod:`recsys_hdet.lr_find`): during each run its descriptors 1 and 2 write to that run's
``train.log`` only, so that the console shows the job's own lines and each log holds its run's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from multiprocessing import resource_tracker
from typing import Iterator, List, Optional


class ConsoleLog:
    """Copies this process's and its children's stdout and stderr into ``path`` (appending) until
    :meth:`close`. Use as a context manager."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "ab")
        self._lock = threading.Lock()
        self._fds: List[int] = []
        self._saved: List[int] = []
        self._threads: List[threading.Thread] = []
        _drop_file_handlers(path)  # Hydra's handler on the same file would write over the copy
        # The multiprocessing resource tracker (one per process, started by the first spawned worker) keeps
        # the descriptors 1 and 2 it started with until this process exits: started under the pipes, it
        # would hold their write ends open, and close() would wait out its timeout on each copy (10 s at the
        # end of every run). Started first, it keeps the console.
        resource_tracker.ensure_running()
        for fd in (1, 2):
            if _writes_to(fd, path):  # already redirected there (a job that runs this one, e.g. retrain)
                continue
            (sys.stdout if fd == 1 else sys.stderr).flush()
            read, write = os.pipe()
            self._fds.append(fd)
            self._saved.append(os.dup(fd))
            os.dup2(write, fd)
            os.close(write)
            thread = threading.Thread(target=self._copy, args=(read, self._saved[-1]), name=f"console-log-{fd}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _copy(self, read: int, console: int) -> None:
        # Drains the pipe until every writer closed it, whatever happens to the console (a closed
        # reader, e.g. `| head`) or the disk: a copy that stopped draining would block the writers.
        console_ok, file_ok = True, True
        with os.fdopen(read, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    return
                if console_ok:
                    try:
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(console, view):]
                    except OSError:
                        console_ok = False
                if file_ok:
                    try:
                        with self._lock:
                            self._file.write(chunk)
                            self._file.flush()
                    except (OSError, ValueError):
                        file_ok = False

    def close(self, timeout_s: Optional[float] = 5.0) -> None:
        """Puts the console back and waits for the copies to drain (a writer that outlives the
        launcher's children, if any, is not waited for beyond ``timeout_s``)."""
        if self._file.closed:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip(self._fds, self._saved):
            os.dup2(saved, fd)  # closes this process's end of the pipe: its reader sees the end
        for thread in self._threads:
            thread.join(timeout_s)
        for saved in self._saved:
            os.close(saved)
        self._saved = []
        with self._lock:
            self._file.close()

    def __enter__(self) -> "ConsoleLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def output_to(path: str) -> Iterator[None]:
    """Points this process's descriptors 1 and 2 at ``path`` (appending) for the block, then back at what they
    were. Python's buffers are flushed at both ends; what a library's C code still buffers may land on the
    wrong side. The process's children started inside the block keep ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log, *saved):
            os.close(fd)


def _writes_to(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _drop_file_handlers(path: str) -> None:
    target = os.path.abspath(path)
    for logger in [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]:
        for handler in list(getattr(logger, "handlers", [])):
            if isinstance(handler, logging.FileHandler) and os.path.abspath(handler.baseFilename) == target:
                logger.removeHandler(handler)
                handler.close()
