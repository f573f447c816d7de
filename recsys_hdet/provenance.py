"""Which code produced an artifact: the checkout's commit, recorded by training runs (``RunDir.SUMMARY``
``code``), exported models (``manifest.json``) and the retraining job's registry."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_version(repo: str = REPO) -> str:
    """``<sha>`` of the checkout's HEAD, ``<sha>+dirty`` when tracked files differ from it, ``unknown``
    outside a git checkout (an installed wheel) or without git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
