"""A study's results store: ``<out>/results.jsonl``, one JSON line per finished run, instead of committed run
directories.

Each study (``studies.ablation``, ``lr_recovery``, ``probe_bias``, ``signal_noise``, ...) keeps
``<out>/results.jsonl``: when a run finishes, its line (:func:`studies.record.record_from_run_dir`, whose
docstring describes the line's fields) is appended (:func:`append`: one write, flushed and fsynced); a run
whose line exists is not trained again (:func:`is_finished`); every report is rebuilt from the file alone
(:func:`load`). The run directories themselves (checkpoints, logs, ``RunDir.METRICS``, ``hdet.jsonl``) go to
a git-ignored working directory (:func:`work_dir`: ``outputs/studies/<its folder's name>`` for a study under
``docs/``, whose results files and reports live in ``docs/results/<study module>/``), never under docs/. A study records into a committed results file only from a clean tree
(:meth:`StudyFiles.open`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from studies.contract import CONTRACT, Contract, StudyMismatch
from studies.provenance import REPO, code_state, is_ancestor, is_committed_path

RESULTS = "results.jsonl"
FINISHED = ("completed", "diverged", "stopped")


class ResultsError(ValueError):
    """A results file that cannot be read (an unreadable line that is not the last one)."""


def load(path: str) -> Dict[str, Dict[str, Any]]:
    """{run name: its line}. A last line cut off by a crash (no newline, not JSON) is left out with a
    warning (that run trains again); any other unreadable line is an error. A name recorded twice
    keeps its last line."""
    out: Dict[str, Dict[str, Any]] = {}
    if not os.path.isfile(path):
        return out
    with open(path) as f:
        lines = f.read().split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number - 1 == last:
                print(f"warning: {path}:{number}: last line cut off (a crash while appending?): left out, "
                      "that run is not finished", file=sys.stderr)
                continue
            raise ResultsError(f"{path}:{number}: not a JSON line") from None
        out[record["name"]] = record
    return out


def append(path: str, record: Mapping[str, Any]) -> None:
    """Appends one line in a single write, flushed and fsynced. A last line left cut off by an
    earlier crash is dropped first, so that it cannot swallow this one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = dumps(record) + "\n"
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(max(0, size - 65536))
            tail = f.read()
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                if cut < 0 and size > len(tail):
                    raise ResultsError(f"{path}: a last line over 64 KiB without a newline")
                f.truncate(size - len(tail) + cut + 1)
                print(f"warning: {path}: dropped a cut-off last line before appending", file=sys.stderr)
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


def is_finished(results: Mapping[str, Mapping[str, Any]], name: str) -> bool:
    """The studies' skip rule: a run is finished when its line exists with a final status (completed,
    diverged or stopped: all three are results; a crash leaves no line)."""
    record = results.get(name)
    return record is not None and record.get("status") in FINISHED


def study_overrides(record: Mapping[str, Any]) -> List[str]:
    """The overrides a study passed to the run: its recorded ones without ``+experiment=`` and ``seed=``,
    which the study runner adds itself, in today's spelling (:func:`current_spelling`)."""
    return current_spelling([o for o in record["overrides"] if not o.startswith(("+experiment=", "seed="))],
                            record.get("commit"))


# Until this commit conf/hdet/enabled.yaml held the HDET controller that conf/hdet/controller.yaml holds now;
# since, hdet=enabled loads the range test on the replicas. A run recorded at this commit or an earlier one that
# spelled hdet=enabled without a range test (no hdet.range_test.steps > 0) trained the controller.
CONTROLLER_WAS_ENABLED_UNTIL = "4540089b3e200167417cf1d1e06ecd02edf9856f"


def current_spelling(overrides: List[str], commit: Optional[str]) -> List[str]:
    """A recorded run's overrides as a study spells them today: ``hdet=enabled`` read as ``hdet=controller`` where
    it loaded the controller (:data:`CONTROLLER_WAS_ENABLED_UNTIL`), so a finished run compares equal to the
    study's overrides and retrains (``--verify``) as it trained. Unchanged where git cannot place the commit (a
    resumed study then refuses the run, naming both spellings)."""
    range_test = any(o.startswith("hdet.range_test.steps=") and o.split("=", 1)[1] not in ("0", "") for o in overrides)
    if ("hdet=enabled" not in overrides or range_test or not commit
            or not is_ancestor(commit, CONTROLLER_WAS_ENABLED_UNTIL)):
        return list(overrides)
    return ["hdet=controller" if o == "hdet=enabled" else o for o in overrides]


def work_dir(out: str) -> str:
    """Where a study's run directories go: beside the results file, except for a study under the
    repository's docs/ (``docs/results/<study module>/.../<folder>``), whose runs go to the git-ignored
    ``outputs/studies/<folder>`` (the results folder's own name, e.g. ``lr_recovery_f3``)."""
    out = os.path.abspath(out)
    docs = os.path.join(REPO, "docs")
    if out.startswith(docs + os.sep):
        return os.path.join(REPO, "outputs", "studies", os.path.basename(out))
    return out


def run_name(config: str, seed: int) -> str:
    """A run's name in its study's results file (its directory under the working directory's runs/)."""
    return f"{config}/seed{seed}"


@dataclass
class StudyFiles:
    """A study's results file (``<out>/results.jsonl``), as loaded, its working directory, and the
    fairness contract its runs train under (None: a study that compares no contenders)."""

    out: str
    work: str
    results: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    contract: Optional[Contract] = CONTRACT

    @classmethod
    def open(cls, out: str, work: Optional[str] = None, *, allow_dirty: bool = False, train: bool = True,
             contract: Optional[Contract] = CONTRACT, repo: str = REPO) -> "StudyFiles":
        """A study that will ``train`` records into ``<out>/results.jsonl`` only from a clean tree when that
        file is committed (under docs/ or tracked: :func:`is_committed_path`); ``allow_dirty`` sends it to
        ``outputs/dirty/<path>`` instead (copying the committed lines, so the study resumes there)."""
        out = os.path.abspath(out)
        if train and is_committed_path(os.path.join(out, RESULTS), repo) and not code_state(repo)["clean"]:
            if not allow_dirty:
                raise StudyMismatch(f"{os.path.join(out, RESULTS)} is a committed results file and the tree has "
                                    "changes outside docs/: commit them first (every recorded run names the clean "
                                    "commit it trained from), or pass --allow-dirty to record elsewhere")
            dirty = os.path.join(repo, "outputs", "dirty", os.path.relpath(out, repo))
            os.makedirs(dirty, exist_ok=True)
            if not os.path.exists(os.path.join(dirty, RESULTS)) and os.path.exists(os.path.join(out, RESULTS)):
                import shutil

                shutil.copyfile(os.path.join(out, RESULTS), os.path.join(dirty, RESULTS))
            print(f"--allow-dirty: the tree is dirty; recording into {dirty}", file=sys.stderr)
            out = dirty
        return cls(out, os.path.abspath(work) if work else work_dir(out), load(os.path.join(out, RESULTS)), contract)

    @property
    def results_path(self) -> str:
        return os.path.join(self.out, RESULTS)

    def add(self, record: Dict[str, Any]) -> Dict[str, Any]:
        append(self.results_path, record)
        self.results[record["name"]] = record
        return record
