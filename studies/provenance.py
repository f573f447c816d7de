"""Where a study's run comes from: the checkout's root, the commit it trains from and whether the tree is
clean, and whether a results file is one that a commit holds.

A results line records ``commit`` and ``clean`` (:func:`code_state`, stamped by :func:`studies.runs.train_run`);
a study records into a committed results file (:func:`is_committed_path`) only from a clean tree
(:meth:`studies.results.StudyFiles.open`).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(repo: str, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def code_state(repo: str = REPO) -> Dict[str, Any]:
    """{"commit": HEAD, "clean": no change outside docs/ (tracked or untracked, ignored files aside)}.
    docs/ holds the studies' own results files and reports, which change as a study runs; nothing under
    it is read by training."""
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    except Exception:  # not a git checkout (or no git): no commit to name
        return {"commit": None, "clean": False}
    changed = [line[3:].split(" -> ")[-1].strip('"') for line in status.splitlines() if line.strip()]
    return {"commit": commit, "clean": not [p for p in changed if not p.startswith("docs/")]}


def is_committed_path(path: str, repo: str = REPO) -> bool:
    """Whether ``path`` lies in the checkout's docs/ or is tracked by git: a results file that a commit holds."""
    path = os.path.abspath(path)
    if path == os.path.join(repo, "docs") or path.startswith(os.path.join(repo, "docs") + os.sep):
        return True
    if not path.startswith(repo + os.sep):
        return False
    try:
        return bool(_git(repo, "ls-files", "--", os.path.relpath(path, repo)).strip())
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def is_ancestor(commit: str, of: str, repo: str = REPO) -> bool:
    """Whether ``commit`` is ``of`` or one of its ancestors in the checkout's history (False where git cannot
    place either: no git, a shallow clone, an unknown commit)."""
    try:
        _git(repo, "merge-base", "--is-ancestor", commit, of)
    except Exception:  # exit status 1: not an ancestor; 128: unknown commit; or no git at all
        return False
    return True
