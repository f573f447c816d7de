"""Training a study's runs: one training job in a process of its own (:func:`train_run`; :func:`train_record`
returns its results line), a study's run trained under its fairness contract unless its results line exists
(:func:`run_one`, through which every contender-comparing study trains), ``--verify RUN`` (:func:`verify`:
retrain one recorded run and tell whether it reproduces bit for bit), and recording run directories trained
earlier (:func:`convert`, the command ``python -m studies.harness --convert``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from data_tools.fileio import read_json
from recsys_hdet.hdet.config import recorded_hdet
from recsys_hdet.run_dir import RunDir
from studies.contract import StudyMismatch
from studies.provenance import REPO, code_state
from studies.record import record_from_run_dir
from studies.results import (StudyFiles, append, current_spelling, dumps, is_finished, load, run_name,
                             study_overrides)


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


class StudyError(RuntimeError):
    """A study that cannot go on (named: which start, which run, why)."""


def train_record(work: str, name: str, overrides: Sequence[str], data_cache: Optional[str] = None) -> Dict[str, Any]:
    """Trains run ``name`` into ``work/name`` (:func:`train_run`, ``data_cache`` the data root) and returns its
    results line; StudyError when the job failed without a summary."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **({"RECSYS_HDET_DATA": data_cache} if data_cache else {})}
    final = os.path.join(work, name)
    run = train_run(final, overrides, env)
    if not run["finished"]:
        raise StudyError(f"{name}: the job failed (exit status {run['exit_status']}) without a summary; "
                         f"see {run['log']}")
    return record_from_run_dir(final, name)


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
    """A run directory holds its ``RunDir.SUMMARY`` (completed or diverged: both are results)."""
    return RunDir(path).finished()


def recorded_overrides(path: str) -> Optional[List[str]]:
    """The overrides a finished study run was launched with (its ``ablation_run.json``); None when the
    run has no record of them."""
    recorded = RunDir(path).path(RunDir.STUDY_RUN)
    info = (read_json(recorded) or {}) if os.path.isfile(recorded) else {}
    overrides = info.get("overrides")
    return None if overrides is None else current_spelling(list(overrides), info.get("commit"))


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
    recorded = {**record, "overrides": current_spelling(list(record["overrides"]), record.get("commit"))}
    if "config" in (record.get("hdet") or {}):  # the hdet config as today's form records it (the keys it reads)
        hdet, notice = recorded_hdet(record["hdet"]["config"], record["overrides"])
        recorded["hdet"] = {**record["hdet"], "config": hdet}
        if notice:
            print(f"{name}: {notice}", flush=True)
    diffs = differences(recorded, fresh)  # the overrides in today's spelling, as the run was retrained
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


def finished_run_dirs(runs: str) -> List[str]:
    """Every finished run directory under ``runs`` (one with a RunDir.SUMMARY, not a .partial), sorted."""
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


def measurement_parser(prog: str, doc: str, out: str) -> argparse.ArgumentParser:
    """The command line of a measurement (a study without contenders: ``studies.range_probes``,
    ``studies.range_replicas``): ``--out``, ``--data-cache``, ``--report-only``."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    ap.add_argument("--out", default=out)
    ap.add_argument("--data-cache", help="data directory (RECSYS_HDET_DATA)")
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from results.jsonl")
    return ap


def train_missing(files: StudyFiles, runs: Sequence[Any], data_cache: Optional[str], say: Any) -> None:
    """Trains each ``(name, overrides)`` of ``runs`` that has no line in ``files`` yet and records its line, in
    order (a rerun resumes); ``say(name, line)`` is its console line."""
    for name, overrides in runs:
        if is_finished(files.results, name):
            continue
        record = files.add(train_record(files.work, name, overrides, data_cache))
        print(say(name, record), flush=True)
