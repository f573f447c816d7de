"""One day of the retraining job (:func:`process_day`).

Before training, the day is checked against the published version (:func:`setup_day`: the same
holdout, the same settings unless ``allow_config_change`` (a change of how the run executes only is logged,
:mod:`pipelines.settings`), a controller to carry LRs from, a training config the run accepts); then the
candidate trains (:mod:`pipelines.day_training`), it and the published model score the day's
held-out rows, the gate decides (:mod:`pipelines.gate`) and the version is recorded
(:mod:`pipelines.version_manifest`): published, ``current`` repointed; or rejected.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipelines.day_plan import DayPlan, RetrainError, version_name
from pipelines.day_training import train, training_overrides
from pipelines.gate import evaluate_models, gate
from pipelines.lr_carry import clamp_carried, preset_lrs
from pipelines.registry import Registry
from pipelines.settings import SettingsComparison, changed_settings
from pipelines.version_manifest import day_manifest, version_files, write_version_report
from recsys_hdet.hdet.form import hdet_form
from recsys_hdet.api import compose_config
from recsys_hdet.run_dir import RunDir

# Fault injection for the crash-safety tests: "kill_before_current" SIGKILLs the job after a
# version's directory is renamed into place and before ``current`` is repointed.
FAULT_ENV = "RECSYS_HDET_RETRAIN_FAULT"
# What composing the day's config raises for an unknown key or a bad value in the job's overrides.
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException)


class SettingsChanged(RetrainError):
    """The day's settings refuse it before it trains (exit status 2): they differ from the published version's,
    or (the subclasses) they cannot work as given; rerunning with the same settings changes nothing."""



class CarryWithoutController(SettingsChanged):
    """``carry_lr=true`` for a day that trains plain: there are no controller rates to carry (exit status 2)."""


class BadDayConfig(SettingsChanged):
    """The day's training config is one its run would refuse before its workers start (exit status 2)."""



@dataclass
class DaySetup:
    """What a day trains from and with, decided (and checked) before it trains."""

    current: Optional[str]  # the published version (the parent), None on the first run
    current_dir: Optional[str]
    warm: Optional[str]  # the checkpoint the day warm-starts from (None: cold start)
    preset: Dict[str, float]  # the experiment's static max LRs
    carried: Dict[str, float]  # the max LRs carried from the parent's controller (empty: the preset's)
    run_dir: str
    overrides: List[str]
    composed: DictConfig
    experiment: str
    notes: List[str]  # settings changed since the published version that do not refuse the day: logged


def process_day(cfg: DictConfig, registry: Registry, plan: DayPlan, all_days: Sequence[str],
                log) -> str:
    """Trains, evaluates, gates and records one day. Returns "published" or "rejected"; raises
    RetrainError when the day fails (nothing is written to the registry then)."""
    day = setup_day(cfg, registry, plan, all_days)
    for note in day.notes:
        log(note)
    lr_source = f"carried from {day.current}" if day.carried else "the preset's static config"
    what = "cold start" if plan.cold_start else f"warm start from {day.current}"
    log(f"day {plan.day}: training on {plan.train_days[0]}..{plan.train_days[-1]} ({what}; LRs: {lr_source}) "
        f"in {day.run_dir}")
    summary, candidate, published = _train_and_score(cfg, plan, day, log)
    decision = gate(cfg, summary, candidate, published)
    number = len(registry.list_versions()) + 1
    version = version_name(number)
    manifest = day_manifest(cfg, plan, parent=day.current, run_dir=day.run_dir, summary=summary, decision=decision,
                            candidate=candidate, carried=day.carried, preset=day.preset, experiment=day.experiment,
                            overrides=day.overrides)
    try:
        write_version_report(day.run_dir, manifest, version)
    except Exception as e:  # noqa: BLE001 - a report failure fails the day, named
        raise RetrainError(f"day {plan.day}: the version's report failed: {type(e).__name__}: {e}") from e
    from recsys_hdet.tracking import log_gate, tracked_run

    mlflow_run = tracked_run(day.run_dir)  # read before _record removes the day's run directory
    _record(cfg, registry, plan, day, version, manifest, decision)
    log_gate(mlflow_run, plan.day, decision, version)  # on the day's MLflow run (overrides=[tracking=mlflow])
    _log_outcome(plan, version, day.current, decision, log)
    return decision["decision"]


def setup_day(cfg: DictConfig, registry: Registry, plan: DayPlan, all_days: Sequence[str],
              current: Optional[str] = None) -> DaySetup:
    """The day's parent, warm start, LRs and training config, checked against the published version:
    RetrainError when the holdout differs, CarryWithoutController when ``carry_lr`` has no controller
    rates to carry, SettingsChanged when the settings differ (unless ``allow_config_change``; a change of
    :data:`pipelines.settings.EXECUTION_KEYS` only is a note), BadDayConfig when the run would refuse its
    config (the checks it makes before its workers start). Reads only: a dry run calls it too, with
    ``current`` the version the run would start from (default the registry's)."""
    current = current or registry.current()
    current_dir = registry.version_dir(current) if current else None
    parent_manifest = registry.manifest(current) if current else {}
    if current and parent_manifest.get("holdout") != OmegaConf.to_container(cfg.holdout):
        raise RetrainError(f"holdout={OmegaConf.to_container(cfg.holdout)} differs from the published version "
                           f"{current}'s {parent_manifest.get('holdout')}: the gate's rows would include rows that "
                           f"model trained on; keep the holdout of the registry (or start a new registry)")
    warm = RunDir(current_dir).path(RunDir.CHECKPOINT) if current_dir and not plan.cold_start else None
    try:
        preset = preset_lrs(cfg, cfg.cold_start_experiment if plan.cold_start else cfg.experiment)
    except COMPOSE_ERRORS as e:
        raise _not_composing(plan, e) from None
    carried = clamp_carried(parent_manifest.get("hdet_bases") or {}, preset, cfg.carry_lr_clamp) \
        if (cfg.carry_lr and warm) else {}
    run_dir = os.path.join(registry.root, "work", plan.day)
    overrides = training_overrides(cfg, plan, all_days, warm, carried)
    composed = _checked_config(plan, overrides)
    experiment = cfg.cold_start_experiment if plan.cold_start else cfg.experiment
    if cfg.carry_lr and hdet_form(composed.hdet) == "plain":
        raise CarryWithoutController(
            f"day {plan.day}: carry_lr=true carries the rates the published model's HDET run trained at (its "
            f"controller's last, or its range test's commit), but experiment={experiment} trains plain "
            "(hdet=disabled): set carry_lr=false, or add 'hdet=enabled' or 'hdet=controller' to overrides")
    found = changed_settings(cfg, parent_manifest, current_dir, composed, experiment) if current_dir \
        else SettingsComparison()
    if found.refused and not cfg.allow_config_change:
        raise SettingsChanged(f"day {plan.day}: the settings differ from the published version {current}'s: "
                              + "; ".join(found.refused) + ". Train with the published settings, or pass "
                              "allow_config_change=true to train this day with the new ones")
    notes = [f"day {plan.day}: trains with settings changed since the published version {current}'s "
             f"(allow_config_change=true): " + "; ".join(found.refused)] if found.refused else []
    if found.noted:
        notes.append(f"day {plan.day}: note: changed since the published version {current}'s, allowed (how the run "
                     f"executes, not what it trains): " + "; ".join(found.noted))
    return DaySetup(current=current, current_dir=current_dir, warm=warm, preset=preset, carried=carried,
                    run_dir=run_dir, overrides=overrides, composed=composed, experiment=experiment, notes=notes)


def _not_composing(plan: DayPlan, e: Exception) -> BadDayConfig:
    from recsys_hdet.config import compose_error

    return BadDayConfig(f"day {plan.day}: its training config does not compose: "
                        + " ".join(str(compose_error(e) or e).split()))  # Hydra's message runs over lines


def _checked_config(plan: DayPlan, overrides: List[str]) -> DictConfig:
    """The day's training config, composed, with the checks its run makes of it before the workers start (the
    schema's, :func:`recsys_hdet.config.validate_config`; the day split and the pass length,
    :func:`recsys_hdet.job_inputs.check_days_and_steps`): BadDayConfig naming the key, not a failed run."""
    from recsys_hdet.config import ConfigError, validate_config
    from recsys_hdet.job_inputs import check_days_and_steps

    try:
        composed = compose_config(overrides)
    except COMPOSE_ERRORS as e:
        raise _not_composing(plan, e) from None
    try:
        validate_config(composed)
        check_days_and_steps(composed, str(composed.data.root))
    except ConfigError as e:
        raise BadDayConfig(f"day {plan.day}: its training config would be refused: {e}") from None
    return composed


def _train_and_score(cfg: DictConfig, plan: DayPlan, day: DaySetup,
                     log) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """Trains (or resumes) the day's run; a completed run and the published model are then scored on the
    day's held-out rows. Returns the run's summary and the two scores (None when not scored)."""
    run_dir = day.run_dir
    t0 = time.time()
    result = train(cfg, day.overrides, run_dir, day.composed)
    summary = result.summary
    if summary is None:
        raise RetrainError(f"day {plan.day}: training failed (exit status {result.exit_status}); see {run_dir}/train.log "
                           "(a rerun resumes it from its last checkpoint)")
    candidate = published = None
    if summary.get("status") == "completed":
        log(f"day {plan.day}: trained in {time.time() - t0:.0f} s; evaluating on the day's held-out rows")
        try:
            candidate, published = evaluate_models(cfg, run_dir, plan.day, day.current_dir)
        except Exception as e:  # noqa: BLE001 - any evaluation failure fails the day, named
            raise RetrainError(f"day {plan.day}: evaluation failed: {type(e).__name__}: {e}") from e
    return summary, candidate, published


def _record(cfg: DictConfig, registry: Registry, plan: DayPlan, day: DaySetup, version: str,
            manifest: Dict[str, Any], decision: Dict[str, Any]) -> None:
    """Adds the version to the registry (exported first when it is published and ``export_on_publish``),
    repoints ``current`` when it is published, logs the event and removes the day's run directory."""
    run_dir, current = day.run_dir, day.current
    if decision["decision"] == "published" and cfg.export_on_publish:
        from recsys_hdet.serving.artifact import export_run

        export_run(run_dir, RunDir(run_dir).path(RunDir.EXPORT), overwrite=True)  # registry/current/export: what serves
    files = version_files(run_dir)
    registry.add_version(version, files, manifest)
    if os.environ.get(FAULT_ENV) == "kill_before_current":  # tests: a job killed mid-publish
        os.kill(os.getpid(), signal.SIGKILL)
    if decision["decision"] == "published":
        registry.set_current(version)
    registry.log_event({"event": decision["decision"], "version": version, "day": plan.day, "parent": current,
                        "reasons": decision["reasons"],
                        "ne": {t: r.get("candidate_ne") for t, r in decision["tasks"].items()}})
    shutil.rmtree(run_dir, ignore_errors=True)


def _log_outcome(plan: DayPlan, version: str, current: Optional[str], decision: Dict[str, Any], log) -> None:
    ne = ", ".join(f"{t} {r['candidate_ne']:.4f}" + (f" (published {r['published_ne']:.4f})" if "published_ne" in r
                                                      else "") for t, r in decision["tasks"].items())
    if decision["decision"] == "published":
        log(f"day {plan.day}: PUBLISHED {version} (parent {current}); NE {ne}")
    else:
        log(f"day {plan.day}: REJECTED as {version}: " + "; ".join(decision["reasons"]) + (f"; NE {ne}" if ne else ""))
