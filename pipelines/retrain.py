"""``python -m pipelines.retrain``: the scheduled retraining job (cron, a systemd timer, an Airflow task).

For each day that arrived after the last day a version was trained on, in order:

1. **Train**: warm-start from the published model (``registry/current``), one pass over the day
   (``experiment``, plain by default: docs/results/retrain_compare/retraining.md); the first run (empty registry) trains
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
and ``current``'s is finished by the next run); ``until=DAY`` backfills every missing day up to
DAY in order; ``dry_run=true`` prints the plan, makes every check the run makes before it trains and writes
nothing (no lock either); ``rollback
[to=VERSION]`` repoints ``current``; ``status [json=true]`` prints the lineage (neither needs ``data.root``).
Failures go to stderr. Exit statuses (:class:`data_tools.exit_status.ExitStatus`): OK (the newest day
published), NOTHING_TO_DO (``nothing_to_do_exit``, 5 by default: 99 for Airflow's skip, 0 where
nothing new is success; ``dry_run=true`` exits OK when the run would train and with it when not),
REJECTED, FAILED, BUSY, USAGE (also: no data set at ``data.root``; no registry at ``registry=``, unless
``create=true`` on the first run; a file the day's run would read is missing or damaged, checked before
anything trains, :func:`pipelines.day_plan.check_inputs`; days missing from the data set before a new day,
unless ``allow_gaps=true``, :func:`pipelines.day_plan.check_gaps`; the day's settings differ from the published
version's, :mod:`pipelines.settings`, unless ``allow_config_change=true``; the day's training config would be
refused by its run), DAMAGED (the version in service, the warm start, is damaged: a file it holds or its
manifest, verified before any worker starts, :func:`pipelines.day_plan.check_warm_start`; the line names the
rollback). ``status | head`` ends quietly.

Limits: one machine (flock and rename on a local filesystem); the day's training runs as a
subprocess of this job, so a scheduler should kill the job's whole process group (systemd does).

Modules: :mod:`pipelines.day_plan` (which days, the registry's checks), :mod:`pipelines.retrain_day`
(one day: its checks, training, scoring, gate and version), :mod:`pipelines.day_training` (the day's
training run), :mod:`pipelines.lr_carry` (carried LRs), :mod:`pipelines.gate` (scoring and the gate),
:mod:`pipelines.version_manifest` (what a version holds and records), :mod:`pipelines.registry`
(versions and ``current``), :mod:`pipelines.registry_commands` (``status``, ``rollback``, ``adopt``);
this one holds the command: its arguments, and the run over the days.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from pipelines.day_plan import (BadInput, DamagedVersion, DayPlan, RetrainError, check_gaps, check_inputs,
                                check_registry, check_warm_start, finish_interrupted_publish, interrupted_publish,
                                plan_days, trained_days)
from pipelines.registry import Registry, RegistryBusy, RegistryError
from pipelines.registry_commands import adopt, no_registry, rollback, status
from pipelines.retrain_day import SettingsChanged, process_day, setup_day
from data_tools import contract
from data_tools.exit_status import ExitStatus


# ----------------------------------------------------------------------------------------------
# The run over the days


def stopped(e: Exception) -> Tuple[int, str, str]:
    """How a day that cannot be trained ends the job, the same in the run and its dry run: (exit status, the
    line's label, the event logged). Bad input (a day file, a gap in the days) and refused settings or config
    are usage (2: a rerun changes nothing); a damaged version in service is DAMAGED (6: a rollback repairs it);
    any other failure is 1 (a rerun may get further: a failed training run resumes)."""
    if isinstance(e, BadInput):
        return ExitStatus.USAGE, "BAD INPUT before training", "bad_input"
    if isinstance(e, SettingsChanged):
        return ExitStatus.USAGE, "REFUSED", "refused"
    if isinstance(e, DamagedVersion):
        return ExitStatus.DAMAGED, "DAMAGED", "damaged"
    return ExitStatus.FAILED, "FAILED", "failed"


def check_plans(cfg: DictConfig, registry: Registry, plans: List[DayPlan], root: str, current: Optional[str]) -> List[str]:
    """The checks of the plan made before anything trains, the same in the run and its dry run: the days
    missing before a planned day (:func:`pipelines.day_plan.check_gaps`) and every file of the version the
    first day warm-starts from (:func:`pipelines.day_plan.check_warm_start`). Returns the notes to log."""
    notes = check_gaps(registry, plans, root, bool(cfg.allow_gaps))
    if current is not None and not plans[0].cold_start:
        note = check_warm_start(registry, current)
        notes += [note] if note else []
    return notes


def run_job(cfg: DictConfig, until: Optional[str], dry_run: bool, force: bool) -> int:
    from recsys_hdet.components.dataset import DatasetMeta

    registry = Registry(str(cfg.registry))
    log = lambda msg: print(f"[retrain] {msg}", flush=True)
    fail = lambda msg: print(f"[retrain] {msg}", file=sys.stderr, flush=True)
    root = os.path.abspath(str(cfg.data.root))
    if not contract.has_meta(root):
        fail(f"BAD INPUT: data.root={root}: no processed data set there ({contract.META_FILE} missing); nothing was "
             "trained")
        return ExitStatus.USAGE
    if not registry.exists() and not cfg.create:
        fail(no_registry(registry, create_hint=True))
        return ExitStatus.USAGE
    try:
        check_inputs(root, days=())  # the meta file, read to plan the days (the day files: once there is work)
    except BadInput as e:
        fail(f"BAD INPUT: {e}; nothing was trained")
        return ExitStatus.USAGE
    all_days = list(DatasetMeta.load(root).days)
    if until is not None and str(until) not in all_days:
        fail(f"FAILED: until={until}: not a day of {root} (days {all_days[0]}..{all_days[-1]})")
        return ExitStatus.FAILED
    if dry_run:
        return dry_run_job(cfg, registry, root, all_days, until, force, log, fail)
    os.makedirs(registry.versions, exist_ok=True)  # create=true, on a path that holds no registry: it does now
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
            outcome, day = None, plans[0].day
            try:
                for note in check_plans(cfg, registry, plans, root, registry.current()):
                    log(note)
                check_inputs(root)  # every file the days' runs will read, before anything trains
                for p in plans:
                    day = p.day
                    outcome = process_day(cfg, registry, p, all_days, log)
            except (RetrainError, RegistryError) as e:
                code, label, event = stopped(e)
                fail(f"{label}: {e}" + ("; the registry is unchanged" if code == ExitStatus.USAGE else ""))
                registry.log_event({"event": event, "day": day, "reason": str(e)})
                return code
            work = os.path.join(registry.root, "work")
            if os.path.isdir(work) and not os.listdir(work):
                os.rmdir(work)
            return ExitStatus.OK if outcome == "published" else ExitStatus.REJECTED
    except RegistryBusy as e:
        fail(f"BUSY: {e}; exiting without doing anything")
        return ExitStatus.BUSY
    except (RetrainError, RegistryError) as e:  # the registry's checks, or finishing an interrupted publish
        code, label, _ = stopped(e)
        fail(f"{label}: {e}")
        return code


def dry_run_job(cfg: DictConfig, registry: Registry, root: str, all_days: List[str], until: Optional[str],
                force: bool, log, fail) -> int:
    """``dry_run=true``: the plan, and every check the run makes before it trains: the registry's, the gaps in
    the days, the files of the version it warm-starts from, the files the days' runs will read, and the first
    day's setup (holdout, settings against the published version, carried LRs, its training config), reading
    only (no lock, no file written). Exits as the run would: OK when it would train, ``nothing_to_do_exit``
    when not, else the status of the check that fails.

    Only the first day's setup is checked: a later day of a backfill starts from the version the day
    before it publishes (trained with these settings), or from the same published version when that one
    is rejected, so its comparison is the first day's. Limits: a gate rejection or a failed training
    cannot be foreseen; a plan can differ from the run's if another job runs in between."""
    exists = registry.exists()
    try:
        if exists:
            check_registry(registry)  # the run's own check of the registry
        pending = interrupted_publish(registry) if exists else None
        if pending:
            log(f"would finish the interrupted publish of {pending}: current -> {pending}")
        current = pending or registry.current()
        plans = plan_days(registry, all_days, until, force, current=current)
        if not plans:
            log(f"nothing to do: every day up to {until or all_days[-1]} was trained on")
            return int(cfg.nothing_to_do_exit)
        for p in plans:
            start = "cold start" if p.cold_start else "warm start from the version current then"
            log(f"would train day {p.day} on {p.train_days[0]}..{p.train_days[-1]} ({start}), gate on its "
                f"held-out rows, publish or reject")
        for note in check_plans(cfg, registry, plans, root, current):
            log(note)
        check_inputs(root)
        for note in setup_day(cfg, registry, plans[0], all_days, current=current).notes:
            log(note)
    except (RetrainError, RegistryError) as e:
        code, label, _ = stopped(e)
        fail(f"{label}: {e}")
        return code
    return ExitStatus.OK



# ----------------------------------------------------------------------------------------------
# Command line

USAGE = ("usage: python -m pipelines.retrain [run] registry=DIR data.root=DIR [until=DAY] [dry_run=true] [force=true] "
         "[allow_gaps=true] [create=true] [key=value ...]\n"
         "       python -m pipelines.retrain status registry=DIR [json=true]\n"
         "       python -m pipelines.retrain rollback registry=DIR [to=VERSION]\n"
         "       python -m pipelines.retrain adopt registry=DIR run_dir=RUN [data.root=DIR] [freeze_lr=true]")

COMMANDS = ("run", "status", "rollback", "adopt")
# Each command's own options (keys of conf/retrain.yaml that no other command reads).
OPTIONS = {"until": "run", "dry_run": "run", "force": "run", "allow_gaps": "run", "create": "run", "to": "rollback",
           "json": "status", "freeze_lr": "adopt"}
# The spellings before the one convention (key=value, no dashes), each refused naming the new one.
OLD_SPELLINGS = {"data_root=": "data.root=DIR", "--until": "until=DAY", "--dry-run": "dry_run=true",
                 "--force": "force=true", "--to": "to=VERSION", "--json": "json=true"}


def compose(overrides: Sequence[str], needs_data: bool = True, command: str = "run") -> DictConfig:
    """The job's config; ``needs_data``: ``data.root`` is required (``status`` and ``rollback``
    read the registry only; ``adopt`` defaults it to the run's); ``command``: whose options may be given.
    A composition error (an unknown key, ``+`` included, a wrong type) exits 2 in one line
    (:func:`recsys_hdet.config.check_composition`); a missing or misplaced key raises ValueError."""
    from data_tools.cli_args import known_plus
    from recsys_hdet.config import SCHEMAS, check_composition

    cfg = check_composition(known_plus(overrides, SCHEMAS["retrain"]), "retrain")
    if OmegaConf.is_missing(cfg, "registry"):
        raise ValueError("config registry: missing (pass registry=DIR)")
    if needs_data and cfg.data.root is None:
        raise ValueError("config data.root: missing (pass data.root=DIR)")
    for key, owner in OPTIONS.items():
        if owner != command and cfg[key] not in (None, False):
            raise ValueError(f"config {key}: an option of `{owner}`, not of `{command}`")
    OmegaConf.to_object(cfg)  # the schema's checks of each value (RetrainConfig, recsys_hdet/job_schema.py)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(argv)
    except SystemExit as e:  # a usage error (data_tools.cli_args.usage_error) said its line: its status returned
        return int(e.code or 0)
    except BrokenPipeError:  # the reader went away (``status | head``): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return ExitStatus.OK


def _main(argv: Optional[Sequence[str]] = None) -> int:
    from data_tools.cli_args import HELP, old_spelling, usage_error

    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args and args[0] in COMMANDS else "run"
    if any(a in HELP for a in args):
        from recsys_hdet.config import command_usage

        print(command_usage(
            "python -m pipelines.retrain (recsys-hdet-retrain): the scheduled retraining job. For each new day:\n"
            "warm-start from the published model, train, evaluate candidate and published model on the day's\n"
            "held-out rows, gate, publish atomically (docs/operations.md).\nExit status: 0 published, 1 failed, "
            "2 usage, 4 rejected by the gate, 5 nothing to do (nothing_to_do_exit), 6 the version in service is damaged "
            "(roll back), 75 busy.", USAGE, "retrain"))
        return ExitStatus.OK
    problem = old_spelling(args, OLD_SPELLINGS)
    if problem is None:
        other = [a for a in args if a.startswith("-") or "=" not in a]
        problem = other and (f"unknown option {other[0]} (arguments are key=value)" if other[0].startswith("-") else
                             f"{other[0]}: expected key=value, or a command first ({', '.join(COMMANDS)})")
    if problem:
        usage_error(problem)
    try:
        cfg = compose(args, needs_data=command == "run", command=command)
    except ValueError as e:  # ours, and the schema's value checks (ConfigError)
        usage_error(str(e))
    if command == "status":
        return status(cfg, bool(cfg.json))
    if command == "rollback":
        return rollback(cfg, cfg.to)
    if command == "adopt":
        return adopt(cfg, overrides_given=any(a.lstrip("+").startswith("overrides") for a in args))
    return run_job(cfg, None if cfg.until is None else str(cfg.until), bool(cfg.dry_run), bool(cfg.force))


if __name__ == "__main__":
    sys.exit(main())
