"""OpenMP threads of helper threads.

A helper thread that runs torch ops (the day reader) starts, at its first parallel region, an
OpenMP team of its own with as many threads as the training thread's (torch sets each new thread
to the process's thread count). The process then holds more OpenMP threads than cores, libgomp
throttles its spin-waiting, and every parallel region of the training thread pays a sleep and wake:
a lone worker with two threads on two cores trained slower than with one (BENCHMARKS.md).
:func:`single_openmp_thread` keeps the calling thread's parallel regions on that thread alone; the
training thread keeps its team.

Limits: acts on GNU OpenMP (libgomp, which torch's Linux wheels load); with another runtime it
does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch


@functools.lru_cache(maxsize=1)
def _libgomp() -> Optional[ctypes.CDLL]:
    """The libgomp this process has loaded (torch's own copy), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line and line.rstrip().endswith(".so.1")}
    except OSError:
        return None
    return ctypes.CDLL(sorted(paths)[0]) if paths else None


def single_openmp_thread() -> None:
    """Makes the calling thread's OpenMP parallel regions run on one thread (its own setting: other
    threads keep theirs). Call it first in a helper thread, e.g. as a ThreadPoolExecutor initializer."""
    torch.get_num_threads()  # torch's per-thread setup first: it would undo what follows
    lib = _libgomp()
    if lib is not None:
        lib.omp_set_num_threads(1)
