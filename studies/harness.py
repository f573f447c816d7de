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
    steps           steps trained; total_steps: the pass's planned steps (train.log)
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

Run as a tool, ``python -m studies.harness --convert RUNS_DIR RESULTS`` records every
finished run directory under RUNS_DIR (how the committed studies' run directories were replaced).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from recsys_hdet.components.metrics import read_json
from recsys_hdet.constants import PARAM_GROUPS as GROUPS, TASKS
from recsys_hdet.fileio import write_json_atomic, write_text_atomic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "results.jsonl"
FINISHED = ("completed", "diverged", "stopped")
SIG = 6
LOSS_SIG = 10  # the replicas' losses differ by ~1e-4 at ~0.2: their noise needs the digits


class ResultsError(ValueError):
    """A results file that cannot be read (an unreadable line that is not the last one)."""


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
    """A study's results file (``<out>/results.jsonl``), as loaded, and its working directory."""

    out: str
    work: str
    results: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, out: str, work: Optional[str] = None) -> "StudyFiles":
        out = os.path.abspath(out)
        return cls(out, os.path.abspath(work) if work else work_dir(out), load(os.path.join(out, RESULTS)))

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
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base=None):
            cfg = compose(config_name="config", overrides=[f"+experiment={preset}"])
        _PRESET_LRS[preset] = {g: float(cfg.optim.lr[g]) for g in GROUPS}
    return dict(_PRESET_LRS[preset])


def planned_steps(path: str) -> Optional[int]:
    """The pass's length as the run's train.log states it ("training N steps x ..."), if it does."""
    log = os.path.join(path, "train.log")
    if not os.path.isfile(log):
        return None
    with open(log, errors="replace") as f:
        m = re.search(r"^training (\d+) steps x", f.read(), re.M)
    return int(m.group(1)) if m else None


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
    hdet.jsonl, ablation_run.json, train.log), named ``name`` within its study."""
    import yaml
    from omegaconf import OmegaConf

    from recsys_hdet.components.metrics import read_json, read_jsonl

    summary = read_json(os.path.join(path, "summary.json"))
    if summary is None:
        raise FileNotFoundError(f"{path}: no summary.json (the run has not finished)")
    with open(os.path.join(path, ".hydra", "overrides.yaml")) as f:
        overrides = [str(o) for o in yaml.safe_load(f) or []]
    cfg = OmegaConf.load(os.path.join(path, ".hydra", "config.yaml"))
    run_info = read_json(os.path.join(path, "ablation_run.json")) or {}
    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("+experiment=")), None)
    total = planned_steps(path) or int(summary["steps"])
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
    r["schedule"] = schedule
    r["max_lr"] = max_lr
    r["preset_lr"] = base_lr
    r["lr_area"] = _round_tree(lr_area(read_jsonl(os.path.join(path, "metrics.jsonl")), schedule, base_lr, total))
    if cfg.hdet.get("enabled"):
        r["hdet"] = {"config": OmegaConf.to_container(cfg.hdet, resolve=True), **_round_tree(summary.get("hdet") or {})}
        syncs = [s for s in read_jsonl(os.path.join(path, "hdet.jsonl")) if "event" not in s]
        if syncs:
            r["syncs"] = compact_syncs(syncs)
    if summary.get("rollback"):
        r["rollback"] = _round_tree(summary["rollback"])
    return r


# ----------------------------------------------------------------------------------------------
# Training one run.


def train_run(final: str, command: Sequence[str], env: Optional[Mapping[str, str]] = None,
              info: Mapping[str, Any] = {}) -> Dict[str, Any]:  # noqa: B006 - read only
    """Runs ``command`` (a ``python -m recsys_hdet.train ...`` list without ``hydra.run.dir``) into
    ``final + ".partial"``, its output in ``train.log``, and moves it to ``final`` once it has a
    summary (exit 0, or 3: diverged), with ``ablation_run.json`` (command, exit status, process
    seconds: what :func:`record_from_run_dir` reads; plus ``info``). A crashed attempt is started over.
    Returns {"exit_status", "process_seconds", "finished", "log"}."""
    import shutil
    import subprocess
    import time

    partial = final + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)  # a crashed attempt: start over
    os.makedirs(partial)
    cmd = [*command, f"hydra.run.dir={partial}"]
    start = time.time()
    with open(os.path.join(partial, "train.log"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                               env=None if env is None else dict(env))
    seconds = time.time() - start
    if code in (0, 3) and os.path.isfile(os.path.join(partial, "summary.json")):
        with open(os.path.join(partial, "ablation_run.json"), "w") as f:
            json.dump({"command": cmd, **info, "exit_status": code, "process_seconds": seconds}, f, indent=2)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(partial, final)
        return {"exit_status": code, "process_seconds": seconds, "finished": True, "log": os.path.join(final, "train.log")}
    return {"exit_status": code, "process_seconds": seconds, "finished": False, "log": os.path.join(partial, "train.log")}


# ----------------------------------------------------------------------------------------------
# Converting run directories.


def finished_run_dirs(runs: str) -> List[str]:
    """Every finished run directory under ``runs`` (one with a summary.json, not a .partial), sorted."""
    found = []
    for root, dirs, files in os.walk(runs):
        dirs[:] = sorted(d for d in dirs if not d.endswith(".partial") and not d.startswith("."))
        if "summary.json" in files:
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



class StudyMismatch(ValueError):
    """A finished run in the study directory was made with other overrides than this invocation's."""


def run_dir(out: str, config: str, seed: int) -> str:
    return os.path.join(out, "runs", config, f"seed{seed}")


def run_dir_finished(path: str) -> bool:
    """A run directory holds its ``summary.json`` (completed or diverged: both are results)."""
    return os.path.isfile(os.path.join(path, "summary.json"))


def recorded_overrides(path: str) -> Optional[List[str]]:
    """The overrides a finished study run was launched with (its ``ablation_run.json``); None when the
    run has no record."""
    recorded = os.path.join(path, "ablation_run.json")
    if not os.path.isfile(recorded):
        return None
    info = read_json(recorded)
    return list(info.get("overrides", info["command"][6:]))  # older records: the command's tail


def run_one(study: StudyFiles, cfg: AblationConfig, seed: int, extra_overrides: Sequence[str],
            report_only: bool = False) -> Dict[str, Any]:
    """Trains one (config, seed) unless its line is in the study's results file, and appends its line.
    Returns {"skipped", "record"} (record None: not run yet, with ``report_only``, or crashed) and,
    for a run trained now, "exit_status", "process_seconds" and, if it crashed, "crashed" and "log"."""
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
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"+experiment={cfg.preset}", f"seed={seed}", *extra_overrides]
    run = train_run(final, cmd, info={"overrides": list(extra_overrides)})  # for the mismatch check
    if run["finished"]:
        record = study.add(record_from_run_dir(final, name))
        return {"skipped": False, "exit_status": run["exit_status"], "process_seconds": run["process_seconds"],
                "record": record}
    return {"skipped": False, "exit_status": run["exit_status"], "process_seconds": run["process_seconds"],
            "crashed": True, "record": None, "log": run["log"]}


def run_schedules(path: str, steps: int) -> Dict[str, Any]:
    """A run directory's OneCycle per group (its resolved config) over ``steps`` steps."""
    from omegaconf import OmegaConf

    from recsys_hdet.components.lr_scheduler import build_one_cycle

    cfg = OmegaConf.load(os.path.join(path, ".hydra", "config.yaml"))
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
