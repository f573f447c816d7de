"""A study's results file: one JSON line per finished run, instead of committed run directories.

Each study (``studies.ablation``, ``lr_recovery``, ``probe_bias``, ``signal_noise``) keeps
``<out>/results.jsonl``: when a run finishes, its line (:func:`record_from_run_dir`) is appended
(:func:`append`: one write, flushed and fsynced); a run whose line exists is not trained again
(:func:`is_finished`); every report is rebuilt from the file alone. The run directories themselves
(checkpoints, logs, ``metrics.jsonl``, ``hdet.jsonl``) go to a git-ignored working directory
(:func:`work_dir`: ``outputs/studies/<study>`` for a study under ``docs/``), never under docs/.

A line (JSON object, keys in this order; floats rounded to 6 significant digits except the
held-out NE, the mean NE and the average train loss, which the reports compute with and keep
exactly)::

    name            study-relative run name, e.g. "all_low/hdet/seed1", "grid/e3_d2/seed0"
    seed, preset    the run's seed and its +experiment preset
    overrides       the Hydra overrides it was launched with (.hydra/overrides.yaml, verbatim)
    status          "completed" | "diverged" (| "stopped" where the trainer says so)
    steps           steps trained; total_steps: the pass's planned steps (summary.json)
    wall_seconds, train_seconds, process_seconds, exit_status, examples_per_sec
    eval            {task: {ne, auc, logloss, calibration}} (completed runs only)
    mean_ne         mean held-out NE over the tasks (completed runs only, else null)
    train_loss      {avg, <task>: ...}
    oracle          {task: {ne, logloss}} where the data has an oracle
    layout          {nproc, sharding_group_size}
    schedule        the run's optim.schedule (OneCycle's arguments)
    max_lr          {group: the max LR the run was configured with}
    preset_lr       {group: the preset's own max LR} (the plain schedule the LR areas refer to)
    lr_area         {group: geometric mean over every logged step of the pass (metrics.jsonl) of
                    the LR the run used / the preset's plain schedule at that step}: the pass's
                    mean log-multiplier, exactly max_lr / preset_lr for a plain run
    hdet            HDET runs only: the resolved ``hdet`` config section, and summary's
                    {syncs, seconds, fraction_of_train}
    syncs           HDET runs only, columns over hdet.jsonl's sync records: {"step": [...],
                    "losses": [[per rank]...] (10 significant digits: the signal's noise is ~1e-4),
                    "train_losses" (signal=probe runs: the window training losses, likewise),
                    "hparams": {"lr/<group>": {"base": [...], "next_base": [...],
                    "velocity": [...], "log_offset": [...], "mult": [[value / base per
                    replica]...]}}, "excluded": [[...]...] only where some sync excluded a rank}
    rollback        summary.json's rollback record, where present
    rows            {data, reserve_rows, total_steps, examples_per_step}: what the run trained on (two runs
                    are paired only when these are equal: :func:`check_same_rows`)
    range_test      LR range-test runs only (optim.schedule.name=range_test): the sweep's settings and
                    {"step": [...], "loss": [...]}, the average task loss of every logged step
    commit, clean   the commit the run trained from, and whether the tree was clean (no change outside
                    docs/) when it started (:func:`code_state`)

The fairness contract (:class:`Contract`, docs/studies.md): every run a study trains through
:func:`run_one` gets the same rows (``data.reserve_rows``: the probe rows are reserved from every
contender's days, not only from HDET's), the same rollback settings, and is judged by the same
failure rule (:func:`outcome`: a diverged run, or one that ends at the base-rate predictor, has
failed); :func:`paired_over_seeds` pairs two contenders only on the seeds where both have a result
and refuses runs that trained different rows. A study records into a committed results file only
from a clean tree (:meth:`StudyFiles.open`); ``--verify RUN`` retrains one recorded run and reports
whether it reproduces bit for bit (:func:`verify`).

Run as a tool, ``python -m studies.harness --convert RUNS_DIR RESULTS`` records every
finished run directory under RUNS_DIR (how the committed studies' run directories were replaced).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.components.metrics_log import read_json
from recsys_hdet.constants import PARAM_GROUPS as GROUPS, TASKS
from recsys_hdet.run_dir import RunDir
from data_tools.fileio import write_json_atomic, write_text_atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "results.jsonl"
FINISHED = ("completed", "diverged", "stopped")
SIG = 6
LOSS_SIG = 10  # the replicas' losses differ by ~1e-4 at ~0.2: their noise needs the digits


class ResultsError(ValueError):
    """A results file that cannot be read (an unreadable line that is not the last one)."""


class StudyMismatch(ValueError):
    """A study invocation that would break its results file: other overrides than a finished run's,
    a dirty tree writing a committed file, a pairing across different trained rows."""


# ----------------------------------------------------------------------------------------------
# Where a run comes from, and the fairness contract.


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


@dataclass(frozen=True)
class Contract:
    """What every contender of a comparison gets: the same trained rows (``reserve_rows`` reserved from
    each training day by every run, so that a probe signal's rows are outside every run's training
    rows) and the same rollback (on for all: ``max_rollbacks`` restores at ``lr_factor`` each)."""

    reserve_rows: int = 4096
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5

    def overrides(self) -> List[str]:
        return [f"data.reserve_rows={self.reserve_rows}", f"trainer.rollback.max_rollbacks={self.max_rollbacks}",
                f"trainer.rollback.lr_factor={self.rollback_lr_factor}"]

    def apply(self, overrides: Sequence[str]) -> List[str]:
        """The contract's overrides, then the study's; a study override of a contract key is refused."""
        keys = {o.split("=", 1)[0] for o in self.overrides()}
        clash = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in keys]
        if clash:
            raise StudyMismatch(f"{clash}: the fairness contract sets these keys for every contender "
                                f"({self.overrides()}); a study cannot change them for one run")
        return [*self.overrides(), *overrides]


CONTRACT = Contract()
# A run whose held-out NE reaches this on any task predicts (about) the base rate: it has failed,
# whatever its status says (NE 1 is the base-rate predictor's; above it, worse than that).
COLLAPSED_NE = 0.999


def outcome(record: Optional[Mapping[str, Any]]) -> Optional[str]:
    """"completed", "failed" (diverged, or completed at NE >= COLLAPSED_NE on some task, i.e. at or
    below the base-rate predictor) or None (no result: not run, crashed, stopped)."""
    if record is None:
        return None
    if record.get("status") == "diverged":
        return "failed"
    if record.get("status") != "completed":
        return None
    return "failed" if collapsed(record) else "completed"


def collapsed(record: Mapping[str, Any]) -> bool:
    """A completed run whose held-out NE on some task is at the base-rate predictor's or worse."""
    return any(m["ne"] >= COLLAPSED_NE for m in (record.get("eval") or {}).values())


def check_same_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Refuses to pair two runs that trained different rows (their ``rows`` records differ)."""
    if a.get("rows") != b.get("rows"):
        raise StudyMismatch(f"{a.get('name')} and {b.get('name')} trained different rows "
                            f"({a.get('rows')} vs {b.get('rows')}): no paired difference across them")


def paired_over_seeds(contender: Mapping[int, Mapping[str, Any]], reference: Mapping[int, Mapping[str, Any]],
                      value=lambda r: r["mean_ne"]) -> Dict[str, Any]:
    """contender - reference on every seed where both completed (:func:`outcome`), with the 95%
    interval (:func:`paired`); the failures of each side are reported beside, never paired. Records
    that trained different rows are refused (:func:`check_same_rows`)."""
    seeds = sorted(set(contender) & set(reference))
    for s in seeds:
        check_same_rows(contender[s], reference[s])
    both = [s for s in seeds if outcome(contender[s]) == "completed" and outcome(reference[s]) == "completed"]
    return {"diff": paired([value(contender[s]) - value(reference[s]) for s in both]), "seeds": both,
            "failed": sorted(s for s in contender if outcome(contender[s]) == "failed"),
            "reference_failed": sorted(s for s in reference if outcome(reference[s]) == "failed")}


# ----------------------------------------------------------------------------------------------
# The file.


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
    which the study runner adds itself."""
    return [o for o in record["overrides"] if not o.startswith(("+experiment=", "seed="))]


def work_dir(out: str) -> str:
    """Where a study's run directories go: beside the results file, except for a study under the
    repository's docs/, whose runs go to the git-ignored ``outputs/studies/<path under docs>``."""
    out = os.path.abspath(out)
    docs = os.path.join(REPO, "docs")
    if out == docs or out.startswith(docs + os.sep):
        return os.path.join(REPO, "outputs", "studies", os.path.relpath(out, docs))
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


# ----------------------------------------------------------------------------------------------
# One run's line.


def sig(x: Optional[float], digits: int = SIG) -> Optional[float]:
    """``x`` rounded to ``digits`` significant digits (None and non-finite values pass through)."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{digits}g}")


def _round_tree(obj: Any, digits: int = SIG) -> Any:
    if isinstance(obj, float):
        return sig(obj, digits)
    if isinstance(obj, dict):
        return {k: _round_tree(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round_tree(v, digits) for v in obj]
    return obj


_PRESET_LRS: Dict[str, Dict[str, float]] = {}


def preset_lrs(preset: str) -> Dict[str, float]:
    """The max LR per group of ``+experiment=<preset>`` as conf/ composes it, no other override."""
    if preset not in _PRESET_LRS:
        from recsys_hdet.config import compose

        cfg = compose("config", [f"+experiment={preset}"])
        _PRESET_LRS[preset] = {g: float(cfg.optim.lr[g]) for g in GROUPS}
    return dict(_PRESET_LRS[preset])


def one_cycle(schedule: Mapping[str, Any], max_lr: float, total_steps: int):
    from recsys_hdet.components.lr_scheduler import build_one_cycle

    return build_one_cycle(schedule, max_lr, total_steps)


def lr_area(metrics: Iterable[Mapping[str, Any]], schedule: Mapping[str, Any], preset_lr: Mapping[str, float],
            total_steps: int) -> Dict[str, float]:
    """Per group: exp(mean over the logged steps of log(logged LR / the preset's schedule at that step)).
    The trainer logs the LR the step ran with (the schedule at min(step, total - 1))."""
    plain = {g: one_cycle(schedule, preset_lr[g], total_steps) for g in preset_lr}
    logs: Dict[str, List[float]] = {g: [] for g in preset_lr}
    for m in metrics:
        if "lr" not in m or "step" not in m:
            continue
        at = min(int(m["step"]), total_steps - 1)
        for g, lr in m["lr"].items():
            if g in plain and lr and lr > 0 and math.isfinite(lr):
                logs[g].append(math.log(lr / plain[g](at)[0]))
    return {g: math.exp(statistics.fmean(v)) for g, v in logs.items() if v}


def compact_syncs(records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """hdet.jsonl's sync records as columns (see the module docstring); :func:`sync_records` inverts it."""
    names: List[str] = []
    for r in records:
        names += [k for k in (r.get("hparams") or {}) if k not in names]
    out: Dict[str, Any] = {"step": [r["step"] for r in records],
                           "losses": [_round_tree(r.get("losses"), LOSS_SIG) for r in records],
                           "hparams": {}}
    if any(r.get("train_losses") is not None for r in records):  # signal=probe: the window training losses too
        out["train_losses"] = [_round_tree(r.get("train_losses"), LOSS_SIG) for r in records]
    for k in names:
        col: Dict[str, List[Any]] = {"base": [], "next_base": [], "velocity": [], "log_offset": [], "mult": []}
        for r in records:
            h = (r.get("hparams") or {}).get(k)
            col["base"].append(sig(h["base"]) if h else None)
            col["next_base"].append(sig(h.get("next_base")) if h else None)
            col["velocity"].append(sig(h.get("velocity")) if h else None)
            col["log_offset"].append(sig(h.get("log_offset")) if h else None)
            col["mult"].append([sig(v / h["base"]) if h["base"] else sig(v) for v in h["values"]] if h else None)
        if all(v is None for v in col["log_offset"]):
            del col["log_offset"]
        out["hparams"][k] = col
    if any(r.get("excluded") for r in records):
        out["excluded"] = [r.get("excluded") or [] for r in records]
    return out


def sync_records(record: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A line's syncs back in hdet.jsonl's form ({step, losses, hparams: {k: {base, values, next_base,
    velocity[, log_offset]}}, excluded}), values and bases as recorded (6 significant digits)."""
    syncs = record.get("syncs")
    if not syncs:
        return []
    out = []
    for i, step in enumerate(syncs["step"]):
        hparams = {}
        for k, col in syncs["hparams"].items():
            if col["base"][i] is None:
                continue
            base = col["base"][i]
            h = {"base": base, "values": [m * base if base else m for m in col["mult"][i]],
                 "next_base": col["next_base"][i], "velocity": col["velocity"][i]}
            if "log_offset" in col:
                h["log_offset"] = col["log_offset"][i]
            hparams[k] = h
        out.append({"step": step, "losses": syncs["losses"][i], "hparams": hparams,
                    "excluded": syncs["excluded"][i] if "excluded" in syncs else []})
        if "train_losses" in syncs:
            out[-1]["train_losses"] = syncs["train_losses"][i]
    return out


def schedules(record: Mapping[str, Any], total_steps: Optional[int] = None) -> Dict[str, Any]:
    """Each group's OneCycle as the run built it (its max LR over its pass)."""
    steps = total_steps or record.get("total_steps") or record["steps"]
    return {g: one_cycle(record["schedule"], record["max_lr"][g], steps) for g in record["max_lr"]}


def record_from_run_dir(path: str, name: str) -> Dict[str, Any]:
    """The results line of the finished run in ``path`` (summary.json, .hydra/, metrics.jsonl,
    hdet.jsonl, ablation_run.json), named ``name`` within its study."""
    from omegaconf import OmegaConf

    run = RunDir(path)
    summary = run.summary()
    if summary is None:
        raise FileNotFoundError(f"{path}: no summary.json (the run has not finished)")
    overrides = run.overrides()
    cfg = run.config()
    run_info = read_json(run.path(RunDir.STUDY_RUN)) or {}
    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("+experiment=")), None)
    total = int(summary.get("total_steps") or summary["steps"])  # older summaries lack total_steps
    schedule = OmegaConf.to_container(cfg.optim.schedule, resolve=True)
    max_lr = {g: float(cfg.optim.lr[g]) for g in GROUPS}
    base_lr = preset_lrs(preset) if preset else dict(max_lr)
    completed = summary["status"] == "completed" and summary.get("eval")
    r: Dict[str, Any] = {
        "name": name, "seed": int(cfg.seed), "preset": preset, "overrides": overrides, "status": summary["status"],
        "steps": int(summary["steps"]), "total_steps": total,
        "wall_seconds": sig(summary.get("wall_seconds")), "train_seconds": sig(summary.get("train_seconds")),
        "process_seconds": sig(run_info.get("process_seconds")), "exit_status": run_info.get("exit_status"),
        "examples_per_sec": sig(summary.get("examples_per_sec")),
    }
    if completed:
        r["eval"] = {t: {"ne": m["ne"], **{k: sig(m[k]) for k in ("auc", "logloss", "calibration") if k in m}}
                     for t, m in summary["eval"].items()}
    r["mean_ne"] = statistics.fmean(summary["eval"][t]["ne"] for t in TASKS) if completed else None
    loss = summary.get("train_loss") or {}
    r["train_loss"] = {k: (v if k == "avg" else sig(v)) for k, v in loss.items()}
    if summary.get("oracle"):
        r["oracle"] = _round_tree(summary["oracle"])
    r["layout"] = {"nproc": int(cfg.trainer.nproc), "sharding_group_size": int(cfg.trainer.sharding_group_size)}
    if summary.get("threads_per_worker") is not None:  # the float results depend on it (see verify)
        r["layout"]["threads_per_worker"] = int(summary["threads_per_worker"])
    r["schedule"] = schedule
    r["max_lr"] = max_lr
    r["preset_lr"] = base_lr
    metrics = run.metrics()
    r["lr_area"] = _round_tree(lr_area(metrics, schedule, base_lr, total))
    if cfg.hdet.get("enabled"):
        r["hdet"] = {"config": OmegaConf.to_container(cfg.hdet, resolve=True), **_round_tree(summary.get("hdet") or {})}
        syncs = run.syncs()
        if syncs:
            r["syncs"] = compact_syncs(syncs)
    if summary.get("rollback"):
        r["rollback"] = _round_tree(summary["rollback"])
    from recsys_hdet.config import probe_rows

    r["rows"] = {"data": str(cfg.data.name), "reserve_rows": probe_rows(cfg), "total_steps": total,
                 "examples_per_step": int(cfg.data.batch_size) * int(cfg.trainer.nproc)}
    if str(cfg.optim.schedule.get("name", "one_cycle")) == "range_test":
        from recsys_hdet.lr_find import range_test_curve

        steps, losses = range_test_curve(metrics)
        r["range_test"] = {**OmegaConf.to_container(cfg.optim.schedule.range_test, resolve=True),
                           "step": steps, "loss": [sig(loss, LOSS_SIG) for loss in losses]}
    r["commit"], r["clean"] = run_info.get("commit"), bool(run_info.get("clean", False))
    return r


# ----------------------------------------------------------------------------------------------
# Training one run.


def train_run(final: str, overrides: Sequence[str], env: Optional[Mapping[str, str]] = None,
              study_overrides: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Trains ``conf/config.yaml`` composed with ``overrides`` into ``final + ".partial"`` through the
    training API in a process of its own (``python -m recsys_hdet.api CONFIG RUN_DIR``: the config is
    composed here, once, and written with its overrides into the run's ``.hydra/``, as the training
    command writes them; ``env`` is the process's environment, where the data root's interpolation is
    resolved), its console in ``train.log``; once it has a summary (exit 0, or 3: diverged) moves it to
    ``final`` with ``ablation_run.json`` (the overrides, exit status, process seconds, the commit and
    whether the tree was clean: what :func:`record_from_run_dir` reads; the overrides recorded there are
    ``study_overrides``, those a study compares a finished run by, default all of them). A crashed attempt
    is started over. Returns {"exit_status", "process_seconds", "finished", "log", "commit", "clean"}."""
    import shutil
    import subprocess
    import time

    from recsys_hdet.api import TrainResult, compose_config
    from recsys_hdet.run_dir import write_job_config

    info = {**code_state(), "overrides": list(overrides if study_overrides is None else study_overrides)}
    partial = final + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)  # a crashed attempt: start over
    config = write_job_config(partial, compose_config(list(overrides)), list(overrides))
    cmd = [sys.executable, "-m", "recsys_hdet.api", config, partial]
    start = time.time()
    with open(RunDir(partial).path(RunDir.TRAIN_LOG), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                               env=None if env is None else dict(env))
    seconds = time.time() - start
    result = TrainResult.load(partial, code)
    if code in (0, 3) and result.summary is not None:
        with open(RunDir(partial).path(RunDir.STUDY_RUN), "w") as f:
            json.dump({"command": cmd, **info, "exit_status": code, "process_seconds": seconds}, f, indent=2)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(partial, final)
        return {"exit_status": code, "process_seconds": seconds, "finished": True,
                "log": RunDir(final).path(RunDir.TRAIN_LOG), "commit": info["commit"], "clean": info["clean"]}
    return {"exit_status": code, "process_seconds": seconds, "finished": False,
            "log": RunDir(partial).path(RunDir.TRAIN_LOG), "commit": info["commit"], "clean": info["clean"]}


# ----------------------------------------------------------------------------------------------
# Converting run directories.


def finished_run_dirs(runs: str) -> List[str]:
    """Every finished run directory under ``runs`` (one with a summary.json, not a .partial), sorted."""
    found = []
    for root, dirs, files in os.walk(runs):
        dirs[:] = sorted(d for d in dirs if not d.endswith(".partial") and not d.startswith("."))
        if RunDir.SUMMARY in files:
            found.append(root)
            dirs[:] = []
    return sorted(found)


def convert(runs: str, results: str) -> int:
    """Appends the line of every finished run under ``runs`` not yet in ``results``; returns how many."""
    done = load(results)
    added = 0
    for path in finished_run_dirs(runs):
        name = os.path.relpath(path, runs).replace(os.sep, "/")
        if name not in done:
            append(results, record_from_run_dir(path, name))
            added += 1
    return added


# ----------------------------------------------------------------------------------------------
# Running a study's training runs (every study trains through run_one)


@dataclass(frozen=True)
class AblationConfig:
    name: str                   # row name (and run directory)
    preset: str                 # conf/experiment preset
    what: str                   # one line for the table
    paper_avg_lr: Optional[str]
    paper_train_loss: Optional[str]



def run_dir(out: str, config: str, seed: int) -> str:
    return os.path.join(out, "runs", config, f"seed{seed}")


def run_dir_finished(path: str) -> bool:
    """A run directory holds its ``summary.json`` (completed or diverged: both are results)."""
    return RunDir(path).finished()


def recorded_overrides(path: str) -> Optional[List[str]]:
    """The overrides a finished study run was launched with (its ``ablation_run.json``); None when the
    run has no record."""
    recorded = RunDir(path).path(RunDir.STUDY_RUN)
    if not os.path.isfile(recorded):
        return None
    info = read_json(recorded)
    return list(info.get("overrides", info["command"][6:]))  # older records: the command's tail


def run_one(study: StudyFiles, cfg: AblationConfig, seed: int, extra_overrides: Sequence[str],
            report_only: bool = False, contract: Any = "study") -> Dict[str, Any]:
    """Trains one (config, seed) unless its line is in the study's results file, and appends its line.
    The run trains under the study's fairness contract (``contract``: "study" for ``study.contract``,
    or None for a run that is part of a contender's procedure rather than a contender, e.g. an LR
    range test): its overrides come first. The line is stamped with the commit the run trained from.
    Returns {"skipped", "record"} (record None: not run yet, with ``report_only``, or crashed) and,
    for a run trained now, "exit_status", "process_seconds" and, if it crashed, "crashed" and "log"."""
    contract = study.contract if contract == "study" else contract
    if contract is not None:
        extra_overrides = contract.apply(extra_overrides)
    name = run_name(cfg.name, seed)
    if is_finished(study.results, name):
        record = study.results[name]
        previous = study_overrides(record)
        if previous != list(extra_overrides) and not report_only:  # a report reads what the line records
            raise StudyMismatch(f"{name}: finished with overrides {previous}, not {list(extra_overrides)} "
                                f"({study.results_path}); use another --out, or delete its line to redo it")
        return {"skipped": True, "record": record}
    if report_only:
        return {"skipped": True, "record": None}
    final = run_dir(study.work, cfg.name, seed)
    if run_dir_finished(final):  # trained, but its line was not appended (a crash in between): record it now
        previous = recorded_overrides(final)
        if previous is not None and previous != list(extra_overrides):
            raise StudyMismatch(f"{final}: finished with overrides {previous}, not {list(extra_overrides)}; "
                                "use another --out, or delete that run to redo it")
        return {"skipped": True, "record": study.add(record_from_run_dir(final, name))}
    run = train_run(final, [f"+experiment={cfg.preset}", f"seed={seed}", *extra_overrides],
                    study_overrides=extra_overrides)
    if run["finished"]:
        record = study.add(record_from_run_dir(final, name))
        return {"skipped": False, "exit_status": run["exit_status"], "process_seconds": run["process_seconds"],
                "record": record}
    return {"skipped": False, "exit_status": run["exit_status"], "process_seconds": run["process_seconds"],
            "crashed": True, "record": None, "log": run["log"]}


# Fields of a results line that measure the machine, not the run: left out of --verify's comparison.
VOLATILE = ("name", "commit", "clean", "examples_per_sec", "fraction_of_train")


def differences(recorded: Any, fresh: Any, where: str = "") -> List[str]:
    """Where two results lines differ, bit for bit (floats by ==), timings and stamps aside (:data:`VOLATILE`,
    every key ending in ``seconds``). A field only the retrained line has (recorded before the lines had it)
    is not a difference; one only the recorded line has is."""
    if isinstance(recorded, dict) and isinstance(fresh, dict):
        out: List[str] = []
        for k in sorted(set(recorded) | set(fresh), key=str):
            if k in VOLATILE or str(k).endswith("seconds"):
                continue
            if k not in fresh:
                out.append(f"{where}{k}: only in the recorded line")
            elif k not in recorded:
                continue  # a field added to the lines after this one was recorded: nothing to compare with
            else:
                out += differences(recorded[k], fresh[k], f"{where}{k}.")
        return out
    if isinstance(recorded, list) and isinstance(fresh, list):
        if len(recorded) != len(fresh):
            return [f"{where.rstrip('.')}: {len(recorded)} values recorded, {len(fresh)} retrained"]
        return [d for i, (a, b) in enumerate(zip(recorded, fresh)) for d in differences(a, b, f"{where}{i}.")]
    same = recorded == fresh and type(recorded) is type(fresh) or (
        isinstance(recorded, (int, float)) and isinstance(fresh, (int, float)) and not isinstance(recorded, bool)
        and float(recorded) == float(fresh))
    return [] if same else [f"{where.rstrip('.')}: recorded {recorded!r}, retrained {fresh!r}"]


def verify(study: StudyFiles, name: str) -> Dict[str, Any]:
    """Retrains the recorded run ``name`` from its line (preset, seed, overrides) with today's checkout into
    ``<work>/verify/<name>`` and compares the new line with the recorded one (:func:`differences`).

    The intra-op thread count changes float results (reductions split differently): a run trained with
    2 threads per worker differs from the same run with 1 from the first logged interval. So the retrained
    run is pinned to the recorded ``layout.threads_per_worker`` (where the line has it; older lines
    do not, and then the machine's own thread policy decides: 1 per worker on 2 cores with 4 workers).
    Returns {"reproduced", "differences", "recorded_commit", "commit", "record"}."""
    record = study.results.get(name)
    if record is None or not is_finished(study.results, name):
        raise StudyMismatch(f"{name}: no finished run of that name in {study.results_path}")
    overrides = study_overrides(record)
    threads = (record.get("layout") or {}).get("threads_per_worker")
    pin = [f"trainer.threads_per_worker={threads}"] if threads and not any(
        o.startswith("trainer.threads_per_worker=") for o in overrides) else []
    final = os.path.join(study.work, "verify", name)
    run = train_run(final, [f"+experiment={record['preset']}", f"seed={record['seed']}", *overrides, *pin],
                    study_overrides=overrides)
    out = {"recorded_commit": record.get("commit"), "commit": run["commit"], "clean": run["clean"], "record": None}
    if not run["finished"]:
        return {**out, "reproduced": False,
                "differences": [f"the retrained run crashed (exit status {run['exit_status']}): see {run['log']}"]}
    fresh = json.loads(dumps(record_from_run_dir(final, name)))
    fresh["overrides"] = [o for o in fresh["overrides"] if o not in pin]  # the pin is verify's, not the run's
    if "threads_per_worker" not in (record.get("layout") or {}):
        fresh.get("layout", {}).pop("threads_per_worker", None)  # an older line that did not record it
    diffs = differences(record, fresh)
    return {**out, "reproduced": not diffs, "differences": diffs, "record": fresh}


def print_verification(name: str, result: Mapping[str, Any]) -> int:
    """--verify's output; its exit status: 0 reproduced, 1 not."""
    head = (f"{name}: recorded at {result['recorded_commit'] or 'no commit'}, retrained at {result['commit']}"
            f"{'' if result['clean'] else ' (dirty tree)'}: ")
    if result["reproduced"]:
        r = result["record"]
        print(head + f"reproduced bit for bit (status {r['status']}, {r['steps']} steps, mean NE {r['mean_ne']!r})")
        return 0
    print(head + f"NOT reproduced, {len(result['differences'])} differences:")
    for d in result["differences"][:20]:
        print(f"  {d}")
    return 1


def add_study_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every study's command has for its results file's provenance."""
    ap.add_argument("--verify", metavar="RUN", default=None,
                    help="retrain the recorded run RUN (its name in results.jsonl) and report whether it reproduces "
                         "bit for bit (exit 0) or not (exit 1); nothing else is trained or written")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="train from a tree with uncommitted changes: the runs are recorded under outputs/dirty/, "
                         "never in the committed results file")


def run_schedules(path: str, steps: int) -> Dict[str, Any]:
    """A run directory's OneCycle per group (its resolved config) over ``steps`` steps."""
    from recsys_hdet.components.lr_scheduler import build_one_cycle

    cfg = RunDir(path).config()
    return {g: build_one_cycle(cfg.optim.schedule, float(cfg.optim.lr[g]), steps) for g in GROUPS}



def write_reports(directory: str, stem: str, result: Dict[str, Any], markdown: str) -> None:
    """A study's ``<stem>.json`` and ``<stem>.md`` in ``directory``, each written atomically."""
    os.makedirs(directory, exist_ok=True)
    write_json_atomic(os.path.join(directory, f"{stem}.json"), result)
    write_text_atomic(os.path.join(directory, f"{stem}.md"), markdown)


def fmt(x: Optional[float], digits: int = 4) -> str:
    """A number for a study table; "-" for a missing one."""
    return "-" if x is None else f"{x:.{digits}f}"


def machine_line() -> str:
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"


# ----------------------------------------------------------------------------------------------
# Paired differences (every study compares contenders on paired seeds)

# Two-sided 95% quantiles of Student's t by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    """The quantile for ``dof`` degrees of freedom (the nearest tabulated dof below: conservative)."""
    return T95[max(k for k in T95 if k <= dof)] if dof <= 30 else 1.96


def paired(diffs: Sequence[float]) -> Optional[Dict[str, Any]]:
    """Mean of paired differences and its 95% t-interval (None for the interval with one pair)."""
    if not diffs:
        return None
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    half = t95(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(diffs)}


def paired_ci95(diffs: Sequence[float]) -> Optional[Tuple[float, float, float]]:
    """(mean, low, high) of :func:`paired`; None with fewer than 2 pairs."""
    p = paired(diffs)
    return None if p is None or p["ci95"] is None else (p["mean"], *p["ci95"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--convert", nargs=2, metavar=("RUNS_DIR", "RESULTS"), required=True,
                    help="record every finished run directory under RUNS_DIR (named by its path there) in RESULTS")
    args = ap.parse_args(argv)
    runs, results = args.convert
    added = convert(runs, results)
    print(f"{results}: {added} runs added, {len(load(results))} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
