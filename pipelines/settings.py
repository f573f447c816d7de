"""What a version was trained with, and the check that the next day trains as the published version
did: a changed setting between days is refused (exit 2, the keys named) unless ``allow_config_change=true``.

Two things are compared with the current version's:
- the job's settings that shape a model (:data:`SETTING_KEYS`), recorded in its manifest as ``settings``;
- the day's resolved training config (the preset's content, so an edited preset or a code update that
  changes a default counts) against the version's saved config (``RunDir.CONFIG``), leaving out the keys the job
  sets itself (:data:`JOB_KEYS`: the day window, the warm start, the holdout, checked on their own; the
  max LRs too when ``carry_lr`` carries them). Between runs of one experiment, and against an adopted
  version (``adopt``: the adopted run's recorded config is the registry's settings, whatever preset it was
  trained with); a cold start trained with ``cold_start_experiment`` is compared on the settings alone when the
  daily ``experiment`` differs (a preset chosen for the first run on purpose). A version adopted with
  ``freeze_lr=true`` (its manifest's ``lr_frozen``) is compared by the config its ``lr_frozen.config`` file holds:
  the run's with the frozen max LRs and ``hdet=disabled`` (:mod:`pipelines.lr_freeze`).

A difference in a key of :data:`EXECUTION_KEYS` (how the run executes, logs and checkpoints) does not refuse
the day: it is returned as a note, which the job logs (an ``overrides`` entry of such a key likewise). Every
other difference refuses it, the worker count included (:data:`REFUSED_LAYOUT` says why in the refusal).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from recsys_hdet.config import recorded_config
from recsys_hdet.run_dir import RunDir

FROZEN = "lr_frozen"  # an adopted version's manifest key: the max LRs adopt froze (freeze_lr=true), pipelines.lr_freeze
SETTING_KEYS = ("experiment", "cold_start_experiment", "overrides", "carry_lr", "carry_lr_clamp", "seed")
# (experiment_name: the preset's label, not a setting; what the preset sets is compared key by key)
JOB_KEYS = ("data.until", "data.skip_days", "data.train_days", "data.eval_days", "data.holdout", "data.root",
            "data.generator", "seed", "trainer.warm_start", "trainer.warm_start_preset", "trainer.resume", "hydra",
            "experiment_name")
# Training-config keys that change how a day's run executes, logs and checkpoints, not what it computes: no
# model shape, no data contract, no optimizer step (CPU threads, evaluation batch, logging cadence, checkpoint
# cadence, timeouts, restarts, TensorBoard, profiling, compiled or eager: the same computation). Changing one
# between days is not a new model, so the day trains, the change logged as a note naming the key and both
# values. Left out on purpose: trainer.checkpoint (the next day warm-starts from the final checkpoint),
# trainer.stop_at_step and trainer.branch_from (they change what is trained), data.read and
# model.sharding_types (which rows each rank reads, how the sparse optimizer's state is split).
EXECUTION_KEYS = ("trainer.threads_per_worker", "trainer.eval_batch_size", "trainer.log_every",
                  "trainer.metrics_every", "trainer.periodic_checkpoint", "trainer.collective_timeout_s",
                  "trainer.max_restarts", "trainer.tensorboard", "trainer.profile", "model.compile_dense", "tracking")
# Layout keys that look like execution but change the optimizer's semantics: refused like any setting, the
# reason stated in the refusal (to move a registry to another worker count, pass allow_config_change=true once).
REFUSED_LAYOUT = {
    "trainer.nproc": "data.batch_size is per worker, so the worker count sets the global batch of every "
                     "optimizer step and the steps per day",
    "trainer.sharding_group_size": "trainer.nproc / trainer.sharding_group_size is the number of embedding "
                                   "replicas, each updated on its own rows and averaged every "
                                   "trainer.embedding_sync_every steps",
}


@dataclass
class SettingsComparison:
    """A day's settings against the published version's, each difference as ``key: old -> new``."""

    refused: List[str] = field(default_factory=list)  # refuse the day unless allow_config_change
    noted: List[str] = field(default_factory=list)    # EXECUTION_KEYS: the day trains, the job logs them


def job_settings(cfg: DictConfig) -> Dict[str, Any]:
    return {k: OmegaConf.to_container(cfg[k]) if OmegaConf.is_config(cfg[k]) else cfg[k] for k in SETTING_KEYS}


def settings_hash(settings: Mapping[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=16).hexdigest()


def _flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, dict):
        out: Dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def changed_settings(cfg: DictConfig, parent: Mapping[str, Any], parent_dir: str, training: DictConfig,
                     experiment: str) -> SettingsComparison:
    """Every setting and training-config key that differs from the current version's (``parent``: its
    manifest, ``parent_dir``: its directory), as refusals and notes; ``training``: the day's composed
    training config, ``experiment``: the preset it was composed from."""
    found = SettingsComparison()
    old = parent.get("settings")
    if old is not None:  # versions from before settings were recorded have nothing to compare
        new = job_settings(cfg)
        for k in SETTING_KEYS:
            if old.get(k) == new[k]:
                continue
            line = f"{k}: {old.get(k)!r} -> {new[k]!r}"
            # overrides that differ only in entries of EXECUTION_KEYS: their effect is a note, not a new model
            only_execution = k == "overrides" and _model_overrides(old.get(k) or []) == _model_overrides(new[k])
            (found.noted if only_execution else found.refused).append(line)
    comparable = parent.get("experiment") == experiment or parent.get("adopted_from") is not None
    reference = reference_config(parent, parent_dir)
    if not comparable or not os.path.isfile(reference):
        return found
    parent_run = RunDir(parent_dir)
    recorded = parent_run.overrides() if os.path.isfile(parent_run.path(RunDir.OVERRIDES)) else []
    config = config_differences(OmegaConf.load(reference), training, bool(cfg.carry_lr), recorded, parent_dir)
    found.refused += config.refused
    found.noted += config.noted
    return found


def reference_config(parent: Mapping[str, Any], parent_dir: str) -> str:
    """The file of the training config a day is compared with: the version's run's (``RunDir.CONFIG``), or for a
    version adopted with ``freeze_lr=true`` the one its manifest's :data:`FROZEN` names (the run's config with
    the frozen max LRs and ``hdet=disabled``, as its days train)."""
    frozen = (parent.get(FROZEN) or {}).get("config")
    return os.path.join(parent_dir, frozen) if frozen else RunDir(parent_dir).path(RunDir.CONFIG)


def _job_key(key: str, skip: Sequence[str] = JOB_KEYS) -> bool:
    return any(key == s or key.startswith(s + ".") for s in skip)


def _override_key(override: Any) -> str:
    return str(override).lstrip("+~").split("=", 1)[0]


def _model_overrides(overrides: Sequence[Any]) -> List[str]:
    """The overrides less those of :data:`EXECUTION_KEYS`."""
    return [str(o) for o in overrides if not _job_key(_override_key(o), EXECUTION_KEYS)]


def _config_diff(was: Dict[str, Any], now: DictConfig, carry_lr: bool) -> Dict[str, str]:
    """``{key: "key: old -> new"}`` for every key of two resolved training configs that differs, leaving out the
    keys the job sets itself (:data:`JOB_KEYS`; the max LRs too when ``carry_lr`` carries them)."""
    skip = JOB_KEYS + (("optim.lr",) if carry_lr else ())
    old = _flat(was)
    new = _flat(OmegaConf.to_container(now, resolve=True))
    return {key: f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
            for key in sorted(set(old) | set(new))
            if not _job_key(key, skip) and old.get(key, "<absent>") != new.get(key, "<absent>")}


def config_differences(was: DictConfig, now: DictConfig, carry_lr: bool, was_overrides: Sequence[str] = (),
                       where: str = "") -> SettingsComparison:
    """Every key of two resolved training configs that differs, leaving out :data:`JOB_KEYS` (the max LRs too
    when ``carry_lr`` carries them), as ``key: old -> new``: a key of :data:`EXECUTION_KEYS` noted, any other
    refused (a key of :data:`REFUSED_LAYOUT` with its reason). ``was`` is read in today's shape
    (:func:`recsys_hdet.config.recorded_config`, with its run's overrides ``was_overrides``); a config recorded
    before the HDET forms had their own schemas is noted, naming ``where`` it was recorded."""
    found = SettingsComparison()
    was, notice = recorded_config(OmegaConf.to_container(was, resolve=True), was_overrides)
    if notice:
        found.noted.append(f"{where or 'the recorded config'}: {notice}")
    for key, line in _config_diff(was, now, carry_lr).items():
        if _job_key(key, EXECUTION_KEYS):
            found.noted.append(line)
        else:
            found.refused.append(line + (f" ({REFUSED_LAYOUT[key]})" if key in REFUSED_LAYOUT else ""))
    return found


def config_changes(was: DictConfig, now: DictConfig, carry_lr: bool) -> List[str]:
    """The refused differences of :func:`config_differences` (what changes what the run trains)."""
    return config_differences(was, now, carry_lr).refused


def run_overrides(recorded: Sequence[str]) -> List[str]:
    """A training run's own overrides (its ``RunDir.OVERRIDES``) that every day's run of the job must repeat to
    train as it did (``adopt``): all but the preset (``+experiment=``: the job's ``experiment``) and those of
    the keys the job sets itself (:data:`JOB_KEYS`: the day window, the data set, the seed, the warm start)."""
    kept = []
    for o in recorded:
        key = _override_key(o)
        if key != "experiment" and not _job_key(key):
            kept.append(str(o))
    return kept
