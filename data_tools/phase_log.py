"""The wall time and peak memory of each phase of a long data command (:class:`PhaseLog`).

A conversion's memory is decided by its worst phase, and which phase that is changes with the input's
shape (the catalog, the rows a day): ``python -m data_tools.convert`` prints each phase's figures so
that a user (and ``benchmarks/scaling_catalog.py``) sees it without a profiler.

On Linux each phase's peak is its own: the kernel's high-water mark of the process's resident set is
reset when a phase starts (writing 5 to ``/proc/self/clear_refs``) and read when it ends (``VmHWM``).
That reset also resets what ``getrusage`` and a parent's ``wait4`` report as the process's peak, so the
log keeps the whole run's peak itself (:attr:`PhaseLog.peak_mb`: the largest phase's, and the mark
before the first phase) and prints it last. Elsewhere (no ``/proc``), a phase's figure is the process's
peak so far. A disabled log (the library's default) measures nothing and touches nothing.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from typing import Iterator, List, Tuple

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_RESET_PEAK = "5"  # clear_refs: reset the peak resident set size to the current one


def _peak_mb() -> float:
    """The process's resident-set high-water mark (VmHWM, or ru_maxrss without /proc), in MB."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # bytes on macOS, KB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / (1024.0 * 1024.0)


def _reset_peak() -> None:
    """Resets the high-water mark where the system has that control (elsewhere a phase reads the peak so far)."""
    with contextlib.suppress(OSError):
        with open(_CLEAR_REFS, "w") as f:
            f.write(_RESET_PEAK)


class PhaseLog:
    """Per phase, its name, seconds and peak RSS in MB (:attr:`phases`), printed as it ends when ``echo``."""

    def __init__(self, enabled: bool = False, echo: bool = True):
        self.enabled = enabled
        self.echo = echo
        self.phases: List[Tuple[str, float, float]] = []
        self.peak_mb = 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self.peak_mb = max(self.peak_mb, _peak_mb())  # what the reset below would lose
        _reset_peak()
        start = time.perf_counter()
        yield
        seconds, peak = time.perf_counter() - start, _peak_mb()
        self.peak_mb = max(self.peak_mb, peak)
        self.phases.append((name, seconds, peak))
        if self.echo:
            print(f"phase {name}: {seconds:.1f} s, peak RSS {peak:.0f} MB", flush=True)

    def summary(self) -> str:
        """The run's peak over every phase (a reset mark hides it from ``getrusage``)."""
        worst = max(self.phases, key=lambda p: p[2])[0] if self.phases else "-"
        return f"peak RSS {max(self.peak_mb, _peak_mb()):.0f} MB (largest phase: {worst})"
