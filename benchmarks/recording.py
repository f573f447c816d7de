"""Where the benchmarks' figures go and what each record says of its run: the repository root
(:data:`REPO`), a section of ``BENCHMARKS.md`` (:func:`replace_benchmarks_section`), and the provenance a
results entry carries: the machine (:func:`machine`), the command line (:func:`command_line`) and the
commit (:func:`code_state`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results.json")  # the committed figures


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
            f"torch {importlib.metadata.version('torch')}")


def command_line(module: str, argv: Optional[List[str]]) -> str:
    """``python -m <module>`` and its arguments (``argv``, or the process's own when None)."""
    return f"python -m {module}" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))


def code_state() -> Dict[str, Any]:
    """The commit the figures were measured at, and whether the checkout had uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return {"commit": head, "clean": not dirty}


def replace_benchmarks_section(heading: str, section: str) -> None:
    """Writes ``section`` (starting with ``heading``) into BENCHMARKS.md, in place of the section with
    that heading, or at the end."""
    path = os.path.join(REPO, "BENCHMARKS.md")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n\nEvery table here is produced by the script named in its heading.\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")  # a blank line before the next heading
    else:
        text = text.rstrip() + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)
