"""The benchmarks' subprocesses, run from the repository root: a failed one stops the benchmark with its
command and the tail of its output (:func:`check`); :func:`run_measured` also measures its wall time and
peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from benchmarks.recording import REPO


def check(proc: subprocess.CompletedProcess, cmd: List[str]) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def run_checked(cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` from the repository root, its output captured as text; :func:`check`'d."""
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kwargs)
    check(proc, cmd)
    return proc


@dataclass
class Measured:
    seconds: float
    peak_rss_mb: float  # ru_maxrss of the process and its waited descendants (the largest one)
    stdout: str


def run_measured(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Measured:
    """Runs ``cmd`` from the repository root; its wall time and peak RSS (``os.wait4``'s rusage).
    A non-zero exit raises SystemExit with the command and the tail of its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return Measured(seconds, usage.ru_maxrss / 1024.0, stdout)


def python(code: str, *args: str, env: Optional[Dict[str, str]] = None) -> Measured:
    return run_measured([sys.executable, "-c", code, *args], env=env)
