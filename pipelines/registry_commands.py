"""The retraining job's commands on the registry besides the daily run.

``status [json=true]`` (the lineage, for people or for scripts and dashboards), ``rollback
[to=VERSION]`` (repoints ``current``) and ``adopt run_dir=RUN`` (an existing completed run becomes
version 1 of an empty registry, with the training overrides its recorded config was composed with;
``freeze_lr=true``: with the max LRs its range test committed, :mod:`pipelines.lr_freeze`).
``status`` and ``rollback`` read the registry only (no ``data.root``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from pipelines.day_plan import DamagedVersion, RetrainError, check_registry, check_warm_start, version_name
from pipelines.gate import gate
from pipelines.lr_freeze import FROZEN_CONFIG, committed_rates, freeze_record, frozen_config, frozen_overrides
from pipelines.registry import UNCHECKED, Registry, RegistryBusy, RegistryError
from pipelines.settings import FROZEN
from pipelines.version_manifest import adopted_manifest, version_files, write_version_report
from recsys_hdet.run_dir import RunDir
from data_tools.exit_status import ExitStatus


def no_registry(registry: Registry, create_hint: bool = False) -> str:
    """The line for a path that holds no registry (:meth:`Registry.exists`): nothing is created there."""
    return (f"registry={registry.root}: no registry there (nothing was created): create one with `python -m "
            f"pipelines.retrain adopt run_dir=RUN registry={registry.root}`"
            + (", or let the first run cold-start one with create=true" if create_hint else "")
            + "; or check the path")


def status(cfg: DictConfig, as_json: bool = False) -> int:
    """The registry's lineage, every version verified file by file (:meth:`Registry.status`; ``as_json``: one
    JSON object on stdout, for scripts and dashboards). Exit 0 (a damaged version that is not current is
    listed, not an error: nothing serves it); DAMAGED when the current version is damaged (its manifest or a
    file); 1 when the registry is (``current`` not pointing at a complete version); 2 when there is no
    registry at that path."""
    registry = Registry(str(cfg.registry))
    if not registry.exists():
        print(f"error: {no_registry(registry)}", file=sys.stderr)
        return ExitStatus.USAGE
    lineage = registry.status()
    code, damaged = ExitStatus.OK, None
    try:
        check_registry(registry)
        current = next((line for line in lineage if line["current"] and line["damage"]), None)
        if current:
            check_warm_start(registry, current["version"])
    except DamagedVersion as e:
        code, damaged = ExitStatus.DAMAGED, str(e)
    except RetrainError as e:
        code, damaged = ExitStatus.FAILED, str(e)
    if as_json:
        print(json.dumps({"registry": registry.root, "current": registry.current(), "damaged": damaged,
                          "versions": [{"version": line["version"], "status": line["status"],
                                        "parent": line["parent"], "current": line["current"],
                                        "train_days": line["train_days"], **{k: line["manifest"].get(k) for k in (
                                            "day", "lr_start", "lr_preset", "hdet_bases", "lr_frozen")},
                                        "candidate_ne": {t: r.get("candidate_ne") for t, r in
                                                         line["manifest"].get("gate", {}).get("tasks", {}).items()},
                                        "reasons": line["manifest"].get("gate", {}).get("reasons", []),
                                        "files": line["files"], "damage": line["damage"]}
                                       for line in lineage]}, indent=1))
        return code
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
        frozen = m.get("lr_frozen") or {}
        frozen = (" | LRs frozen from " + str(frozen.get("from_run")) + ": "
                  + " ".join(f"{g}={x:.3g}" for g, x in (frozen.get("rates") or {}).items())) if frozen else ""
        print(f"{'*' if line['current'] else ' '} {line['version']} {line['status'] or '?':9s} parent={line['parent']} "
              f"days={days[0] if days else '-'}..{days[-1] if days else '-'} NE {ne or '-'}"
              + started + frozen + (f" | ended with {bases}" if bases else "")
              + (f" | files {UNCHECKED}" if line["files"] == UNCHECKED else ""))
        for r in m.get("gate", {}).get("reasons", []):
            print(f"      rejected: {r}")
        if line["damage"]:
            print(f"      damaged: {line['damage']}")
    if damaged:
        print(f"DAMAGED: {damaged}", file=sys.stderr)
    return code



def adopt(cfg: DictConfig, overrides_given: bool = False) -> int:
    """``adopt run_dir=DIR``: an existing completed run becomes version 1 of an empty registry, after
    scoring it on its held-out days and passing the gate's checks that need no published model
    (completed, NE below ``gate.max_ne``, calibration within ``gate.calibration``). The next job run
    trains the days after its training days, warm-started from it: train the run with the daily
    ``experiment`` (its model must fit the warm start). The version's ``overrides`` setting is the run's
    own (:func:`adopted_overrides`: its data preset and layout, read from its recorded config) unless
    ``overrides_given``; ``data.root`` defaults to the run's data set. ``freeze_lr``: the max LRs the run's range
    test committed replace its HDET and max-LR overrides (:mod:`pipelines.lr_freeze`; refused, exit 2 and nothing
    written, for a run that committed none), the version recording them (``lr_frozen``) and the config its days
    are compared with (:data:`pipelines.lr_freeze.FROZEN_CONFIG`)."""
    from recsys_hdet.evaluate import evaluate_run
    from recsys_hdet.evaluation import EvaluationError, load_run

    registry = Registry(str(cfg.registry))
    # bad input (exit 2) says error: as every command's; the job's other ends keep its [retrain] log lines
    fail = lambda msg, status: print(f"{'error:' if status == ExitStatus.USAGE else '[retrain]'} {msg}",
                                     file=sys.stderr) or status
    if cfg.run_dir is None:
        return fail("adopt needs run_dir=DIR (a completed training run)", ExitStatus.USAGE)
    if os.path.isdir(registry.root) and registry.list_versions():
        return fail(f"registry={registry.root} has versions already; adopt starts a registry (use an empty one)",
                    ExitStatus.USAGE)
    data_root = None if cfg.data.root is None else os.path.abspath(str(cfg.data.root))
    try:
        run = load_run(str(cfg.run_dir), None, data_root)
        commit = committed_rates(run) if cfg.freeze_lr else None  # before anything is written
        unfrozen, cfg.overrides, reference = adopted_settings(cfg, run, overrides_given, commit)
        candidate = evaluate_run(run.run_dir, data_root=run.meta.root, nproc=int(cfg.eval_nproc))
    except (EvaluationError, RetrainError) as e:
        named = str(e).startswith(f"run_dir={cfg.run_dir}")  # the message names the key already
        return fail(str(e) if named else f"run_dir={cfg.run_dir}: {e}", ExitStatus.USAGE)
    decision = gate(cfg, run.summary, candidate, None)
    if decision["decision"] != "published":
        return fail("not adopted: " + "; ".join(decision["reasons"]) + "; the registry is unchanged", ExitStatus.REJECTED)
    manifest = adopted_manifest(cfg, run, decision, candidate)
    if commit:
        manifest[FROZEN] = freeze_record(run, commit, unfrozen, list(cfg.overrides))
    os.makedirs(registry.root, exist_ok=True)
    try:
        with registry.lock(), tempfile.TemporaryDirectory(prefix="recsys-hdet-adopt-") as scratch:
            files = version_files(run.run_dir)
            if commit:  # the config the days are compared with: the run's, at the frozen rates, hdet=disabled
                files[FROZEN_CONFIG] = os.path.join(scratch, FROZEN_CONFIG)
                OmegaConf.save(reference, files[FROZEN_CONFIG])
            version = version_name(1)
            # The version's report names its lineage; the adopted run's own report.html is left as it is.
            report = write_version_report(run.run_dir, manifest, version, os.path.join(scratch, RunDir.REPORT))
            if report:
                files[RunDir.REPORT] = report
            registry.add_version(version, files, manifest)
            registry.set_current(version)
            registry.log_event({"event": "adopted", "version": version, "run_dir": run.run_dir,
                                **({FROZEN: commit["committed"]} if commit else {})})
    except RegistryBusy as e:
        return fail(f"BUSY: {e}", ExitStatus.BUSY)
    print(f"[retrain] adopted {run.run_dir} as {version} (trained on {run.train_days[0]}..{run.train_days[-1]}); "
          f"current: {version}")
    if commit:
        print("[retrain] froze the max LRs its range test committed: "
              + " ".join(f"{g}={v:.6g}" for g, v in sorted(commit["committed"].items()))
              + "; the days train plain at them (no sweep) with overrides=[" + ",".join(f"'{o}'" for o in cfg.overrides)
              + "] (to sweep again: docs/operations.md, \"Adopting a run\")")
    return ExitStatus.OK



def adopted_overrides(cfg: DictConfig, run, given: bool, commit: Optional[Dict[str, Any]] = None) -> List[str]:
    """:func:`adopted_settings`'s overrides."""
    return adopted_settings(cfg, run, given, commit)[1]


def adopted_settings(cfg: DictConfig, run, given: bool,
             commit: Optional[Dict[str, Any]] = None) -> Tuple[List[str], List[str], DictConfig]:
    """The ``overrides`` every day's run trains with after ``adopt`` (the version's recorded setting, which the
    job's later runs must repeat): the run's own training overrides (``RunDir.OVERRIDES`` less the preset and
    the keys the job sets, :func:`pipelines.settings.run_overrides`), and its data preset (``data=NAME``, from
    its recorded config) when the job's ``experiment`` would compose another. ``given`` (``overrides=`` on
    the command line): ``cfg.overrides``, checked against the run's recorded config instead. RetrainError
    naming the keys when the job's ``experiment`` with these overrides would compose another config than the
    run's, a run of another preset included (the daily job refuses the next day the same way: the adopted run's
    config is the registry's settings; ``allow_config_change=true`` adopts it anyway, the keys noted).

    ``commit`` (``freeze_lr=true``, :func:`pipelines.lr_freeze.committed_rates`): the overrides are frozen
    (:func:`pipelines.lr_freeze.frozen_overrides`) and the run's config is compared at the frozen rates with
    ``hdet=disabled`` (:func:`pipelines.lr_freeze.frozen_config`); RetrainError when the frozen overrides would
    still compose a run that sweeps. Returns (the overrides before the freeze, the overrides, the config the
    days are compared with)."""
    from recsys_hdet.config import compose

    from pipelines.settings import config_changes, run_overrides

    recorded = run.cfg
    if given:
        overrides = [str(o) for o in cfg.overrides]
    else:
        overrides = run_overrides(run.files.overrides() if os.path.isfile(run.files.path(RunDir.OVERRIDES)) else [])
    training = compose("config", [f"+experiment={cfg.experiment}", *overrides])
    preset = str(recorded.data.name)
    if not given and training.data.name != preset:
        overrides.append(f"data={preset}")
        training = compose("config", [f"+experiment={cfg.experiment}", *overrides])
    unfrozen = list(overrides)
    if commit:
        overrides = frozen_overrides(overrides, commit["committed"])
        training = compose("config", [f"+experiment={cfg.experiment}", *overrides])
        if bool(training.hdet.enabled):
            raise RetrainError(f"freeze_lr=true: experiment={cfg.experiment} with overrides={overrides} still trains "
                               "with HDET on (hdet.enabled=true: the preset sets it), so every day would sweep or run "
                               "the controller; choose an experiment that trains plain with hdet=disabled")
        recorded = frozen_config(recorded, training, commit["committed"])
    # the daily job compares each day's config with the adopted run's, whatever preset the run was trained with
    changes = config_changes(recorded, training, bool(cfg.carry_lr))
    if changes and cfg.allow_config_change:
        print(f"[retrain] note: experiment={cfg.experiment} composes another config than the run's (the run's value "
              f"-> the job's): {'; '.join(changes)}; every day's run will be refused until it trains with the run's "
              "settings or with allow_config_change=true", file=sys.stderr)
    if changes and not cfg.allow_config_change:
        source = f"overrides={overrides}" if given else f"the run's own overrides {overrides}"
        raise RetrainError(f"experiment={cfg.experiment} with {source} composes another config than the run's "
                           f"({run.files.path(RunDir.CONFIG)}; the run's value -> the job's): {'; '.join(changes[:8])}"
                           + (f" (and {len(changes) - 8} more)" if len(changes) > 8 else "")
                           + ("; leave overrides out to take them from the run" if given else
                              "; every day's run would be refused the same way (allow_config_change=true allows it)"))
    return unfrozen, overrides, recorded


def rollback(cfg: DictConfig, to: Optional[str]) -> int:
    """``rollback [to=VERSION]``: repoints ``current`` (:meth:`pipelines.registry.Registry.rollback`; a damaged
    version is refused, exit 1, naming the file); exit 2 on a path that holds no registry."""
    registry = Registry(str(cfg.registry))
    if not registry.exists():  # before the lock: taking it would create the directory
        print(f"error: {no_registry(registry)}", file=sys.stderr)
        return ExitStatus.USAGE
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
