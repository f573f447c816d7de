"""``python -m pipelines.retrain``: the scheduled retraining job (cron, a systemd timer, an Airflow task).

For each day that arrived after the last day a version was trained on, in order:

1. **Train**: warm-start from the published model (``registry/current``), one pass over the day
   (``experiment``, plain by default: docs/retraining.md); the first run (empty registry) trains
   ``cold_start_experiment`` on every day up to the newest instead. With ``carry_lr`` each group's
   max LR starts from the per-group bases the published model's HDET controller ended with (HDET on)
   (``hdet_bases`` in its manifest) instead of the preset's static values.
2. **Evaluate**: the candidate and the published model score the same rows: the **held-out slice
   of the day just trained on** (``holdout``: a fixed random slice of every day, by file position,
   that no run of this job ever trains on; the recsys_hdet evaluation code).
3. **Gate**: published only if the run completed, and for every task the candidate's NE is at most
   the published model's plus ``gate.ne_tolerance``, below ``gate.max_ne`` (1.0 = no better than
   the rows' positive rate: a day of shuffled labels) and its calibration within
   ``gate.calibration``. Otherwise the version is kept as ``rejected`` with the reasons; the next
   day warm-starts from the published model again (a rejected day is not retried unless forced).
4. **Publish**: ``registry/versions/<version>/`` is written whole and renamed into place
   (:class:`pipelines.registry.Registry`), then ``current`` is repointed by an atomic rename.

Operations: one job at a time (the registry's lock: a second job exits with :attr:`ExitStatus.BUSY`);
idempotent (a day some version was trained on is skipped, and a rerun with nothing new says so);
crash-safe (a day's run trains in ``registry/work/<day>/`` with periodic checkpoints and resumes
there; a version appears whole or not at all; a publish interrupted between the version's rename
and ``current``'s is finished by the next run); ``--until DAY`` backfills every missing day up to
DAY in order; ``--dry-run`` prints the plan and writes nothing (no lock either); ``rollback [--to
VERSION]`` repoints ``current``; ``status [--json]`` prints the lineage (neither needs ``data_root``).
Failures go to stderr. Exit statuses (:class:`data_tools.exit_status.ExitStatus`): OK (the newest day
published), NOTHING_TO_DO (``nothing_to_do_exit``, 5 by default: 99 for Airflow's skip, 0 where
nothing new is success; ``--dry-run`` exits OK when the run would train and with it when not),
REJECTED, FAILED, BUSY, USAGE (also: the day's settings differ from the published version's,
:mod:`pipelines.settings`, unless ``allow_config_change=true``). ``status | head`` ends quietly.

Limits: one machine (flock and rename on a local filesystem); the day's training runs as a
subprocess of this job, so a scheduler should kill the job's whole process group (systemd does).

Modules: :mod:`pipelines.day_plan` (which days, the registry's checks), :mod:`pipelines.lr_carry`
(carried LRs), :mod:`pipelines.gate` (scoring and the gate), :mod:`pipelines.registry` (versions and
``current``); this one trains, publishes and holds the command.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from pipelines.day_plan import (DayPlan, RetrainError, check_registry, finish_interrupted_publish, interrupted_publish,
                                plan_days, trained_days, version_name)
from pipelines.gate import evaluate_models, gate
from pipelines.lr_carry import clamp_carried, final_hdet_bases, preset_lrs
from pipelines.registry import Registry, RegistryBusy, RegistryError
from pipelines.settings import changed_settings, job_settings, settings_hash
from recsys_hdet.api import TrainResult, compose_config
from recsys_hdet.run_dir import RunDir, write_job_config
from data_tools import contract
from data_tools.exit_status import ExitStatus
from recsys_hdet.provenance import code_version

# Fault injection for the crash-safety tests: "kill_before_current" SIGKILLs the job after a
# version's directory is renamed into place and before ``current`` is repointed.
FAULT_ENV = "RECSYS_HDET_RETRAIN_FAULT"
# Files of a finished run copied into its version directory (when present).
VERSION_FILES = (RunDir.CHECKPOINT, RunDir.EXPORT, RunDir.HYDRA, RunDir.SUMMARY, RunDir.EVAL, RunDir.REPORT, RunDir.HDET,
                 RunDir.METRICS, RunDir.PUBLISHED_EVAL, RunDir.TRAIN_LOG)


# ----------------------------------------------------------------------------------------------
# Reading the registry and the data


def data_fingerprint(root: str, days: Sequence[str]) -> str:
    """blake2b of the training day files' bytes (the exact data a version was trained on)."""
    meta = contract.read_meta(root)
    h = hashlib.blake2b(digest_size=16)
    for d in days:
        h.update(d.encode())
        with open(os.path.join(root, meta["days"][d]["file"]), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# One day


def training_overrides(cfg: DictConfig, plan: DayPlan, all_days: Sequence[str], warm: Optional[str],
                       lrs: Dict[str, float]) -> List[str]:
    """The day's training config as overrides of ``conf/config.yaml`` (composed once, by :func:`train`)."""
    experiment = cfg.cold_start_experiment if plan.cold_start else cfg.experiment
    out = [f"+experiment={experiment}", f"data.root={os.path.abspath(str(cfg.data_root))}", "data.generator=null",
           f"data.until={plan.day}", f"data.skip_days={all_days.index(plan.train_days[0])}",
           f"data.train_days={len(plan.train_days)}", "data.eval_days=1",
           f"data.holdout.fraction={float(cfg.holdout.fraction)}", f"data.holdout.seed={int(cfg.holdout.seed)}",
           f"seed={int(cfg.seed)}", "trainer.resume=auto",
           *[str(o) for o in cfg.overrides]]
    if warm:
        out += [f"trainer.warm_start={warm}", "trainer.warm_start_preset=null"]
    out += [f"optim.lr.{g}={v:.8g}" for g, v in sorted(lrs.items())]
    return out


def _die_with_parent() -> None:  # a killed job takes its training run with it (Linux)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def train(cfg: DictConfig, overrides: List[str], run_dir: str, composed: DictConfig) -> TrainResult:
    """Runs (or resumes) the day's training through :mod:`recsys_hdet.api` in a process of its own (a
    killed job takes it along): the config is composed here, once, and written resolved into the run
    directory's config (``RunDir.CONFIG``, with ``RunDir.OVERRIDES``), which the training process reads; the
    outcome is read from the run's ``summary.json``."""
    if RunDir(run_dir).finished():  # trained before the job was interrupted
        return TrainResult.load(run_dir, 0)
    config = write_job_config(run_dir, composed, overrides, resolve=True)
    cmd = [sys.executable, "-m", "recsys_hdet.api", config, run_dir]
    timeout = int(cfg.train_timeout_s) or None
    with open(RunDir(run_dir).path(RunDir.TRAIN_LOG), "a") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -signal.SIGKILL
    return TrainResult.load(run_dir, code)


def process_day(cfg: DictConfig, registry: Registry, plan: DayPlan, all_days: Sequence[str],
                log) -> str:
    """Trains, evaluates, gates and records one day. Returns "published" or "rejected"; raises
    RetrainError when the day fails (nothing is written to the registry then)."""
    current = registry.current()
    current_dir = registry.version_dir(current) if current else None
    parent_manifest = registry.manifest(current) if current else {}
    if current and parent_manifest.get("holdout") != OmegaConf.to_container(cfg.holdout):
        raise RetrainError(f"holdout={OmegaConf.to_container(cfg.holdout)} differs from the published version "
                           f"{current}'s {parent_manifest.get('holdout')}: the gate's rows would include rows that "
                           f"model trained on; keep the holdout of the registry (or start a new registry)")
    warm = RunDir(current_dir).path(RunDir.CHECKPOINT) if current_dir and not plan.cold_start else None
    preset = preset_lrs(cfg, cfg.cold_start_experiment if plan.cold_start else cfg.experiment)
    carried = clamp_carried(parent_manifest.get("hdet_bases") or {}, preset, cfg.carry_lr_clamp) \
        if (cfg.carry_lr and warm) else {}
    lr_source = f"carried from {current}" if carried else "the preset's static config"
    run_dir = os.path.join(registry.root, "work", plan.day)
    overrides = training_overrides(cfg, plan, all_days, warm, carried)
    composed = compose_config(overrides)
    experiment = cfg.cold_start_experiment if plan.cold_start else cfg.experiment
    if cfg.carry_lr and not bool(composed.hdet.enabled):
        raise CarryWithoutController(
            f"day {plan.day}: carry_lr=true carries the rates HDET's controller ended with, but experiment="
            f"{experiment} trains plain (hdet.enabled=false): set carry_lr=false, or add 'hdet=enabled' to overrides")
    changes = changed_settings(cfg, parent_manifest, current_dir, composed, experiment) if current_dir else []
    if changes and not cfg.allow_config_change:
        raise SettingsChanged(f"day {plan.day}: the settings differ from the published version {current}'s: "
                              + "; ".join(changes) + ". Train with the published settings, or pass "
                              "allow_config_change=true to train this day with the new ones")
    what = "cold start" if plan.cold_start else f"warm start from {current}"
    log(f"day {plan.day}: training on {plan.train_days[0]}..{plan.train_days[-1]} ({what}; LRs: {lr_source}) "
        f"in {run_dir}")
    t0 = time.time()
    result = train(cfg, overrides, run_dir, composed)
    summary = result.summary
    if summary is None:
        raise RetrainError(f"day {plan.day}: training failed (exit status {result.exit_status}); see {run_dir}/train.log "
                           "(a rerun resumes it from its last checkpoint)")
    candidate = published = None
    if summary.get("status") == "completed":
        log(f"day {plan.day}: trained in {time.time() - t0:.0f} s; evaluating on the day's held-out rows")
        try:
            candidate, published = evaluate_models(cfg, run_dir, plan.day, current_dir)
        except Exception as e:  # noqa: BLE001 - any evaluation failure fails the day, named
            raise RetrainError(f"day {plan.day}: evaluation failed: {type(e).__name__}: {e}") from e
    decision = gate(cfg, summary, candidate, published)
    number = len(registry.list_versions()) + 1
    version = version_name(number)
    resolved = RunDir(run_dir).path(RunDir.CONFIG)
    manifest = {
        "status": decision["decision"],
        "parent": current,
        "day": plan.day,
        "train_days": plan.train_days,
        "cold_start": plan.cold_start,
        "gate": decision,
        "hdet_bases": final_hdet_bases(run_dir) if summary.get("status") == "completed" else {},
        "lr_start": {g: float(v) for g, v in carried.items()} or "static",
        "lr_preset": preset,
        "metrics": candidate["eval"] if candidate else {},
        "experiment": experiment,
        "settings": job_settings(cfg),
        "settings_hash": settings_hash(job_settings(cfg)),
        "overrides": overrides,
        "holdout": OmegaConf.to_container(cfg.holdout),
        "data": {"root": os.path.abspath(str(cfg.data_root)),
                 "fingerprint": data_fingerprint(str(cfg.data_root), plan.train_days)},
        "config_hash": hashlib.blake2b(open(resolved, "rb").read(), digest_size=16).hexdigest()
        if os.path.isfile(resolved) else None,
        "commit": code_version(),
        "train_seconds": summary.get("wall_seconds"),
    }
    if decision["decision"] == "published" and cfg.export_on_publish:
        from recsys_hdet.serving.artifact import export_run

        export_run(run_dir, RunDir(run_dir).path(RunDir.EXPORT), overwrite=True)  # registry/current/export: what serves
    files = {name: os.path.join(run_dir, name) for name in VERSION_FILES if os.path.exists(os.path.join(run_dir, name))}
    registry.add_version(version, files, manifest)
    if os.environ.get(FAULT_ENV) == "kill_before_current":  # tests: a job killed mid-publish
        os.kill(os.getpid(), signal.SIGKILL)
    if decision["decision"] == "published":
        registry.set_current(version)
    registry.log_event({"event": decision["decision"], "version": version, "day": plan.day, "parent": current,
                        "reasons": decision["reasons"],
                        "ne": {t: r.get("candidate_ne") for t, r in decision["tasks"].items()}})
    shutil.rmtree(run_dir, ignore_errors=True)
    ne = ", ".join(f"{t} {r['candidate_ne']:.4f}" + (f" (published {r['published_ne']:.4f})" if "published_ne" in r
                                                      else "") for t, r in decision["tasks"].items())
    if decision["decision"] == "published":
        log(f"day {plan.day}: PUBLISHED {version} (parent {current}); NE {ne}")
    else:
        log(f"day {plan.day}: REJECTED as {version}: " + "; ".join(decision["reasons"]) + (f"; NE {ne}" if ne else ""))
    return decision["decision"]


# ----------------------------------------------------------------------------------------------
# Commands


class SettingsChanged(RetrainError):
    """The day would train with other settings than the published version's (exit status 2)."""


class CarryWithoutController(SettingsChanged):
    """``carry_lr=true`` for a day that trains plain: there are no controller rates to carry (exit status 2)."""


def run_job(cfg: DictConfig, until: Optional[str], dry_run: bool, force: bool) -> int:
    from data_tools.errors import DataError
    from data_tools.validate import validate_processed
    from recsys_hdet.components.dataset import DatasetMeta

    registry = Registry(str(cfg.registry))
    log = lambda msg: print(f"[retrain] {msg}", flush=True)
    fail = lambda msg: print(f"[retrain] {msg}", file=sys.stderr, flush=True)
    root = os.path.abspath(str(cfg.data_root))
    if not contract.has_meta(root):
        fail(f"FAILED: data_root={root}: no processed data set there ({contract.META_FILE} missing)")
        return ExitStatus.FAILED
    all_days = list(DatasetMeta.load(root).days)
    if until is not None and str(until) not in all_days:
        fail(f"FAILED: --until {until}: not a day of {root} (days {all_days[0]}..{all_days[-1]})")
        return ExitStatus.FAILED
    if dry_run:  # exit as the run would have started: OK when there is work, else "nothing to do"
        return ExitStatus.OK if print_plan(registry, all_days, until, force, log) else int(cfg.nothing_to_do_exit)
    os.makedirs(registry.root, exist_ok=True)
    try:
        with registry.lock():
            check_registry(registry)
            finished = finish_interrupted_publish(registry)
            if finished:
                log(f"finished the interrupted publish of {finished}: current -> {finished}")
            plans = plan_days(registry, all_days, until, force)
            if not plans:
                done = trained_days(registry)
                log(f"nothing to do: every day up to {until or all_days[-1]} was trained on (last: "
                    f"{done[-1] if done else '-'}; current: {registry.current()})")
                registry.log_event({"event": "nothing_to_do", "until": until or all_days[-1]})
                return int(cfg.nothing_to_do_exit)
            try:  # the days about to be trained on, before anything trains
                validate_processed(root, {d for p in plans for d in p.train_days})
            except DataError as e:
                fail(f"FAILED before training: {e}; the registry is unchanged")
                registry.log_event({"event": "failed", "day": plans[0].day, "reason": str(e)})
                return ExitStatus.FAILED
            outcome = None
            for p in plans:
                try:
                    outcome = process_day(cfg, registry, p, all_days, log)
                except SettingsChanged as e:
                    fail(f"REFUSED: {e}; the registry is unchanged")
                    registry.log_event({"event": "refused", "day": p.day, "reason": str(e)})
                    return ExitStatus.USAGE
                except (RetrainError, RegistryError) as e:
                    fail(f"FAILED: {e}")
                    registry.log_event({"event": "failed", "day": p.day, "reason": str(e)})
                    return ExitStatus.FAILED
            work = os.path.join(registry.root, "work")
            if os.path.isdir(work) and not os.listdir(work):
                os.rmdir(work)
            return ExitStatus.OK if outcome == "published" else ExitStatus.REJECTED
    except RegistryBusy as e:
        fail(f"BUSY: {e}; exiting without doing anything")
        return ExitStatus.BUSY
    except RetrainError as e:
        fail(f"FAILED: {e}")
        return ExitStatus.FAILED


def print_plan(registry: Registry, all_days: List[str], until: Optional[str], force: bool, log) -> bool:
    """``--dry-run``: what the job would do, reading the registry only (no lock, no file written: a
    plan can differ from the run's if another job runs in between). Returns whether there is work."""
    pending = interrupted_publish(registry) if os.path.isdir(registry.root) else None
    if pending:
        log(f"would finish the interrupted publish of {pending}: current -> {pending}")
    plans = plan_days(registry, all_days, until, force)
    if not plans:
        log(f"nothing to do: every day up to {until or all_days[-1]} was trained on")
    for p in plans:
        start = "cold start" if p.cold_start else "warm start from the version current then"
        log(f"would train day {p.day} on {p.train_days[0]}..{p.train_days[-1]} ({start}), gate on its "
            f"held-out rows, publish or reject")
    return bool(plans or pending)


def status(cfg: DictConfig, as_json: bool = False) -> int:
    """The registry's lineage (``as_json``: one JSON object on stdout, for scripts and dashboards).
    Exit 0; 1 when the registry is damaged; 2 when there is no registry at that path."""
    registry = Registry(str(cfg.registry))
    if not os.path.isdir(registry.root):
        print(f"[retrain] registry={registry.root}: no registry there (the first run of the job creates it)",
              file=sys.stderr)
        return ExitStatus.USAGE
    lineage = registry.status()
    try:
        check_registry(registry)
        damaged = None
    except RetrainError as e:
        damaged = str(e)
    if as_json:
        print(json.dumps({"registry": registry.root, "current": registry.current(), "damaged": damaged,
                          "versions": [{"version": line["version"], "status": line["status"],
                                        "parent": line["parent"], "current": line["current"],
                                        "train_days": line["train_days"], **{k: line["manifest"].get(k) for k in (
                                            "day", "lr_start", "lr_preset", "hdet_bases")},
                                        "candidate_ne": {t: r.get("candidate_ne") for t, r in
                                                         line["manifest"].get("gate", {}).get("tasks", {}).items()},
                                        "reasons": line["manifest"].get("gate", {}).get("reasons", [])}
                                       for line in lineage]}, indent=1))
        return ExitStatus.FAILED if damaged else ExitStatus.OK
    print(f"registry {registry.root}: {len(lineage)} version(s), current: {registry.current()}")
    for line in lineage:
        m = line["manifest"]
        ne = " ".join(f"{t}={r['candidate_ne']:.4f}" for t, r in m.get("gate", {}).get("tasks", {}).items()
                      if r.get("candidate_ne") is not None)
        bases = " ".join(f"{g}={x:.3g}" for g, x in (m.get("hdet_bases") or {}).items())
        start, preset = m.get("lr_start"), m.get("lr_preset") or {}
        started = (" | started from preset" if start == "static" else
                   " | started from carried " + " ".join(
                       f"{g}={x:.3g}" + (f" (x{x / preset[g]:.2f} preset)" if g in preset else "")
                       for g, x in start.items()) if isinstance(start, dict) else "")
        days = line["train_days"] or []
        print(f"{'*' if line['current'] else ' '} {line['version']} {line['status'] or '?':9s} parent={line['parent']} "
              f"days={days[0] if days else '-'}..{days[-1] if days else '-'} NE {ne or '-'}"
              + started + (f" | ended with {bases}" if bases else ""))
        for r in m.get("gate", {}).get("reasons", []):
            print(f"      rejected: {r}")
    if damaged:
        print(f"DAMAGED: {damaged}", file=sys.stderr)
        return ExitStatus.FAILED
    return ExitStatus.OK


def adopt(cfg: DictConfig) -> int:
    """``adopt run_dir=DIR``: an existing completed run becomes version 1 of an empty registry, after
    scoring it on its held-out days and passing the gate's checks that need no published model
    (completed, NE below ``gate.max_ne``, calibration within ``gate.calibration``). The next job run
    trains the days after its training days, warm-started from it: train the run with the daily
    ``experiment`` (its model must fit the warm start)."""
    from recsys_hdet.evaluate import evaluate_run
    from recsys_hdet.evaluation import EvaluationError, load_run

    registry = Registry(str(cfg.registry))
    fail = lambda msg, status: print(f"[retrain] {msg}", file=sys.stderr) or status
    if cfg.run_dir is None:
        return fail("adopt needs run_dir=DIR (a completed training run)", ExitStatus.USAGE)
    if os.path.isdir(registry.root) and registry.list_versions():
        return fail(f"registry={registry.root} has versions already; adopt starts a registry (use an empty one)",
                    ExitStatus.USAGE)
    try:
        run = load_run(str(cfg.run_dir), None, os.path.abspath(str(cfg.data_root)))
        candidate = evaluate_run(run.run_dir, data_root=os.path.abspath(str(cfg.data_root)), nproc=int(cfg.eval_nproc))
    except EvaluationError as e:
        return fail(f"run_dir={cfg.run_dir}: {e}", ExitStatus.USAGE)
    decision = gate(cfg, run.summary, candidate, None)
    if decision["decision"] != "published":
        return fail("not adopted: " + "; ".join(decision["reasons"]) + "; the registry is unchanged", ExitStatus.REJECTED)
    overrides_path = run.files.path(RunDir.OVERRIDES)
    manifest = {
        "status": "published", "parent": None, "day": run.train_days[-1], "train_days": run.train_days,
        "cold_start": True, "adopted_from": run.run_dir, "gate": decision, "hdet_bases": final_hdet_bases(run.run_dir),
        "lr_start": "static", "lr_preset": {g: float(run.cfg.optim.lr[g]) for g in run.cfg.optim.lr},
        "metrics": candidate["eval"], "experiment": str(run.cfg.experiment_name),
        "overrides": [str(o) for o in OmegaConf.load(overrides_path)] if os.path.isfile(overrides_path) else [],
        "holdout": OmegaConf.to_container(cfg.holdout), "settings": job_settings(cfg),
        "settings_hash": settings_hash(job_settings(cfg)),
        "data": {"root": run.meta.root, "fingerprint": data_fingerprint(run.meta.root, run.train_days)},
        "commit": run.summary.get("code", "unknown"), "train_seconds": run.summary.get("wall_seconds"),
    }
    os.makedirs(registry.root, exist_ok=True)
    try:
        with registry.lock():
            files = {n: os.path.join(run.run_dir, n) for n in VERSION_FILES if os.path.exists(os.path.join(run.run_dir, n))}
            version = version_name(1)
            registry.add_version(version, files, manifest)
            registry.set_current(version)
            registry.log_event({"event": "adopted", "version": version, "run_dir": run.run_dir})
    except RegistryBusy as e:
        return fail(f"BUSY: {e}", ExitStatus.BUSY)
    print(f"[retrain] adopted {run.run_dir} as {version} (trained on {run.train_days[0]}..{run.train_days[-1]}); "
          f"current: {version}")
    return ExitStatus.OK


def rollback(cfg: DictConfig, to: Optional[str]) -> int:
    registry = Registry(str(cfg.registry))
    try:
        with registry.lock():
            before = registry.current()
            now = registry.rollback(to)
    except RegistryBusy as e:
        print(f"[retrain] BUSY: {e}", file=sys.stderr)
        return ExitStatus.BUSY
    except RegistryError as e:
        print(f"[retrain] FAILED: {e}", file=sys.stderr)
        return ExitStatus.FAILED
    print(f"[retrain] current: {before} -> {now}")
    return ExitStatus.OK


# ----------------------------------------------------------------------------------------------
# Command line

USAGE = ("usage: python -m pipelines.retrain [--until DAY] [--dry-run] [--force] registry=DIR data_root=DIR "
         "[key=value ...]\n"
         "       python -m pipelines.retrain status [--json] registry=DIR\n"
         "       python -m pipelines.retrain rollback [--to VERSION] registry=DIR\n"
         "       python -m pipelines.retrain adopt registry=DIR data_root=DIR run_dir=RUN")


def compose(overrides: Sequence[str], needs_data: bool = True) -> DictConfig:
    """The job's config; ``needs_data``: ``data_root`` is required (``status`` and ``rollback``
    read the registry only)."""
    from recsys_hdet.config import compose as compose_config
    from recsys_hdet.config_schema import check

    cfg = compose_config("retrain", overrides)
    if OmegaConf.is_missing(cfg, "registry"):
        raise ValueError("config registry: missing (pass registry=DIR)")
    if needs_data and cfg.data_root is None:
        raise ValueError("config data_root: missing (pass data_root=DIR)")
    check(cfg)  # the schema's checks of each value (recsys_hdet/config_schema.py)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (``status | head``): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return ExitStatus.OK


def _main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args and args[0] in ("status", "rollback", "run", "adopt") else "run"
    flags: Dict[str, Any] = {"until": None, "to": None, "dry_run": False, "force": False, "json": False}
    overrides: List[str] = []
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print("python -m pipelines.retrain (recsys-hdet-retrain): the scheduled retraining job. For each new day:\n"
                  "warm-start from the published model, train, evaluate candidate and published model on the day's\n"
                  "held-out rows, gate, publish atomically (docs/operations.md; keys: conf/retrain.yaml).\n\n"
                  f"{USAGE}\n\nExit status: 0 published, 1 failed, 2 usage, 4 rejected by the gate, 5 nothing to do "
                  "(nothing_to_do_exit), 75 busy.")
            return ExitStatus.OK
        if a in ("--until", "--to"):
            if not args:
                print(f"{a} needs a value\n{USAGE}", file=sys.stderr)
                return ExitStatus.USAGE
            flags[a[2:]] = args.pop(0)
        elif a in ("--dry-run", "--force") or (a == "--json" and command == "status"):
            flags[a[2:].replace("-", "_")] = True
        elif a.startswith("--"):
            print(f"unknown option {a}\n{USAGE}", file=sys.stderr)
            return ExitStatus.USAGE
        else:
            overrides.append(a)
    try:
        cfg = compose(overrides, needs_data=command in ("run", "adopt"))
    except Exception as e:  # noqa: BLE001 - Hydra's and ours: a config error, named
        from recsys_hdet.config import compose_error
        from recsys_hdet.job_schema import RetrainConfig

        print(f"[retrain] config error: {compose_error(e, RetrainConfig) or e}\n{USAGE}", file=sys.stderr)
        return ExitStatus.USAGE
    if command == "status":
        return status(cfg, flags["json"])
    if command == "rollback":
        return rollback(cfg, flags["to"])
    if command == "adopt":
        return adopt(cfg)
    return run_job(cfg, flags["until"], flags["dry_run"], flags["force"])


if __name__ == "__main__":
    sys.exit(main())
