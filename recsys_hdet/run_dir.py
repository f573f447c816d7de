"""The run directory a job trains into, and its one owner: :class:`RunDir` names every file and
folder a run directory holds (docs/outputs.md) and reads them back; every writer and reader of a
run directory (the trainer and its components, evaluation, export, the retraining job, the studies,
the benchmarks) takes its paths from it. Also here: the directory's lock (one job at a time), resuming
the run it holds (``trainer.resume``: which keys a resumed run may change), and branching from another
run's checkpoint (``trainer.branch_from``: which keys must match). Errors are ConfigError, naming the keys.

Import-light (no torch), and it never reaches ``hdet/`` (not even through a function's import), so that
``components/`` may use it (pyproject.toml's import contracts).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from recsys_hdet.components.metrics_log import read_json, read_jsonl, sync_records
from data_tools.fileio import abs_path
from recsys_hdet.config_values import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig


class RunDir:
    """A run directory, ``RunDir(path)``: the names of what it holds (``RunDir.SUMMARY``, ...: each file
    and folder, named here only), their paths (:meth:`path`) and readers of the run's config, summary and
    records. Writers write through their own code (the bytes are theirs); only the names are here."""

    # What Hydra writes (or a job that composes the config itself: write_job_config, api._record_config)
    HYDRA = ".hydra"
    CONFIG = os.path.join(HYDRA, "config.yaml")        # the composed config: what evaluation, export, resume read
    OVERRIDES = os.path.join(HYDRA, "overrides.yaml")  # the overrides it was composed with
    # What the training job writes
    LOCK = ".lock"                     # held while a job uses the directory
    TRAIN_LOG = "train.log"            # the console
    METRICS = "metrics.jsonl"          # one record per trainer.log_every steps
    HDET = "hdet.jsonl"                # one record per HDET sync (and rollback event lines)
    SUMMARY = "summary.json"           # the outcome: a finished run has one
    CHECKPOINT = "checkpoint"          # the final model, and the periodic step-<N>/ checkpoints
    TENSORBOARD = "tensorboard"        # TensorBoard's event files
    PROFILE = "profile.txt"            # trainer.profile's operator table
    RANGE_TEST = "range_test.json"     # HDET's range test on the replicas (hdet.range_test)
    # What recsys_hdet.evaluate writes
    EVAL = "eval.json"
    PREDICTIONS = "predictions.parquet"
    REPORT = "report.html"
    # What the retraining job adds (pipelines/retrain.py: a registry version holds them)
    EXPORT = "export"                  # the serving artifact
    PUBLISHED_EVAL = "published_eval.json"  # the published model scored on the candidate's held-out rows
    # What a study run adds (studies/runs.train_run)
    STUDY_RUN = "ablation_run.json"    # the command, overrides, exit status, seconds, commit

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"RunDir({self.root!r})"

    def path(self, name: str) -> str:
        """``root/name`` for one of the names above."""
        return os.path.join(self.root, name)

    def finished(self) -> bool:
        """The run wrote its ``summary.json`` (completed, diverged or stopped: every outcome with a result)."""
        return os.path.isfile(self.path(self.SUMMARY))

    def summary(self) -> Optional[Dict[str, Any]]:
        """``summary.json``; None when the run has none (not finished, or failed)."""
        return read_json(self.path(self.SUMMARY))

    def evaluation(self) -> Optional[Dict[str, Any]]:
        """``eval.json`` (recsys_hdet.evaluate's); None before the run is evaluated."""
        return read_json(self.path(self.EVAL))

    def metrics(self) -> List[Dict[str, Any]]:
        """``metrics.jsonl``'s records; empty when there are none."""
        return read_jsonl(self.path(self.METRICS))

    def syncs(self) -> List[Dict[str, Any]]:
        """``hdet.jsonl``'s sync records (its event lines left out); empty for a plain run."""
        return sync_records(self.path(self.HDET))

    def config(self) -> "DictConfig":
        """``.hydra/config.yaml``, as saved (interpolations unresolved). FileNotFoundError when absent."""
        from omegaconf import OmegaConf

        return OmegaConf.load(self.path(self.CONFIG))

    def overrides(self) -> List[str]:
        """``.hydra/overrides.yaml``: the overrides the config was composed with, as written.
        FileNotFoundError when absent."""
        import yaml

        with open(self.path(self.OVERRIDES)) as f:
            return [str(o) for o in yaml.safe_load(f) or []]


class RunDirInUse(Exception):
    """Another job holds the run directory's lock."""


def run_dir_lock(run_dir: str):
    """An exclusive lock on ``run_dir/.lock`` held for the job's life (the open file; None on a rank other
    than 0 under torchrun, where rank 0's process holds it). RunDirInUse when another job holds it."""
    from recsys_hdet.distributed import torchrun_follower
    from data_tools.fileio import LockHeld, try_exclusive_lock

    if torchrun_follower():
        return None
    try:
        return try_exclusive_lock(RunDir(run_dir).path(RunDir.LOCK))
    except LockHeld as e:
        raise RunDirInUse(f"{run_dir} is in use by another training job ({e.holder}); wait for it, or use another "
                          "hydra.run.dir") from None


def write_job_config(run_dir: str, cfg: Any, overrides: List[str], *, resolve: bool = False) -> str:
    """Writes the composed ``cfg`` and the ``overrides`` it was composed with where the training command's
    Hydra puts them (``run_dir/.hydra/config.yaml`` and ``overrides.yaml``: what evaluation, the studies and
    a resume read), for a job that composes the config itself and trains it through ``python -m
    recsys_hdet.api CONFIG RUN_DIR``. ``resolve=False`` keeps interpolations (``${oc.env:...}``) for the
    training process to resolve, as Hydra does. Returns the config file's path."""
    from omegaconf import OmegaConf

    from data_tools.fileio import write_text_atomic

    files = RunDir(run_dir)
    config = files.path(RunDir.CONFIG)
    os.makedirs(os.path.dirname(config), exist_ok=True)
    write_text_atomic(config, OmegaConf.to_yaml(cfg, resolve=resolve))
    write_text_atomic(files.path(RunDir.OVERRIDES),
                      OmegaConf.to_yaml(OmegaConf.create([str(o) for o in overrides])))
    return config


FINISHED = "finished"
# Config keys a resumed run may change: how it logs, evaluates and checkpoints, not what it trains.
RESUME_SAFE_KEYS = ("trainer.log_every", "trainer.eval_batch_size", "trainer.profile", "trainer.checkpoint",
                    "trainer.periodic_checkpoint", "trainer.resume", "trainer.resume_from", "trainer.max_restarts",
                    "trainer.tensorboard", "trainer.threads_per_worker", "trainer.branch_from", "trainer.stop_at_step",
                    "model.compile_dense")  # compiled or eager: the same computation


def _flatten(d: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: Dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(saved: Dict[str, Any], now: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """(keys that change what a checkpoint means, keys that only change logging/eval/checkpointing)."""
    # a key added since the checkpoint was written reads as its default there (ADDED_KEYS)
    a, b = {**ADDED_KEYS, **_flatten(saved)}, {**ADDED_KEYS, **_flatten(now)}
    changed = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    safe = [k for k in changed if k.startswith(RESUME_SAFE_KEYS)]
    return [k for k in changed if k not in safe], safe


def resolve_resume(cfg_dict: Dict[str, Any], run_dir: str) -> Optional[str]:
    """``trainer.resume`` -> the periodic checkpoint to continue from (None: start at step 0), or
    FINISHED when the run directory holds a finished run. ConfigError when it cannot be resumed."""
    from recsys_hdet.components.checkpoint import CheckpointError, check_step_checkpoint, latest_step_checkpoint

    mode = str(cfg_dict["trainer"].get("resume", "auto"))
    files = RunDir(run_dir)
    holds_a_run = any(os.path.exists(files.path(f)) for f in (RunDir.METRICS, RunDir.SUMMARY, RunDir.CHECKPOINT))
    if mode == "never":
        if holds_a_run:
            raise ConfigError(f"config trainer.resume=never: {run_dir} already holds a run (metrics.jsonl, "
                              "summary.json or checkpoint/); use another hydra.run.dir, or trainer.resume=auto")
        return None
    if files.finished():
        status = files.summary().get("status")
        print(f"{run_dir} holds a finished run (status {status}): nothing to do (trainer.resume={mode})", flush=True)
        return FINISHED
    if mode == "auto":
        found = latest_step_checkpoint(files.path(RunDir.CHECKPOINT), run_dir)
        if found is None:
            if holds_a_run:
                print(f"resume: no complete checkpoint in {run_dir}/checkpoint: starting from step 0", flush=True)
            return None
        path, manifest = found
    else:
        path = abs_path(mode)
        try:
            manifest = check_step_checkpoint(path)
        except CheckpointError as e:
            raise ConfigError(f"config trainer.resume={mode}: {e}") from None
    meaning, safe = config_changes(manifest.get("config", {}), {**cfg_dict, "trainer": {
        **cfg_dict["trainer"], "resume_from": manifest.get("config", {}).get("trainer", {}).get("resume_from")}})
    if meaning:
        raise ConfigError(f"config: cannot resume from {path}: these keys change what it means: "
                          + ", ".join(f"{k} ({_flatten(manifest['config']).get(k, '<absent>')!r} -> "
                                      f"{_flatten(cfg_dict).get(k, '<absent>')!r})" for k in meaning))
    if safe:
        print(f"resume: changed since the checkpoint (allowed): {', '.join(safe)}", flush=True)
    print(f"resume: continuing from {path} (step {manifest['step']})", flush=True)
    return path


# What a branch (trainer.branch_from) must share with the run it branches from: the rest (LRs, HDET,
# logging, checkpoints) is what a study varies from a point of a pass.
BRANCH_FIXED_KEYS = ("data.", "model.", "tasks.", "loss.", "seed", "optim.dense.", "optim.embedding.",
                     "optim.schedule.", "trainer.nproc", "trainer.sharding_group_size", "trainer.embedding_sync_every")


# Keys added to the config schema after checkpoints were written without them, with the value that
# reproduces what those checkpoints trained (a resume or a branch reads an absent key as this).
ADDED_KEYS = {"optim.dense.d0": 1e-6, "model.compile_dense": False}


def resolve_branch(cfg_dict: Dict[str, Any]) -> str:
    """``trainer.branch_from`` -> the checkpoint's absolute path; ConfigError naming what is wrong (not
    a complete checkpoint, or a key that must match the run it was written by)."""
    from recsys_hdet.components.checkpoint import CheckpointError, check_step_checkpoint

    given = str(cfg_dict["trainer"]["branch_from"])
    path = abs_path(given)
    try:
        manifest = check_step_checkpoint(path)
    except CheckpointError as e:
        raise ConfigError(f"config trainer.branch_from={given}: {e}") from None
    saved, now = {**ADDED_KEYS, **_flatten(manifest.get("config", {}))}, _flatten(cfg_dict)
    differ = sorted(k for k in set(saved) | set(now) if k.startswith(BRANCH_FIXED_KEYS)
                    and saved.get(k, "<absent>") != now.get(k, "<absent>"))
    if differ:
        raise ConfigError(f"config trainer.branch_from={given}: the branch must train what that run trained; these "
                          "keys differ: " + ", ".join(f"{k} ({saved.get(k, '<absent>')!r} -> {now.get(k, '<absent>')!r})"
                                                      for k in differ))
    return path
