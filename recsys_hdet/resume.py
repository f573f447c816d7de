"""Resuming the run a run directory holds (``trainer.resume``: which keys a resumed run may change) and
branching from another run's checkpoint (``trainer.branch_from``: which keys must match). Errors are
ConfigError, naming the keys. The run directory's files: :class:`recsys_hdet.run_dir.RunDir`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from data_tools.fileio import abs_path
from recsys_hdet.config_values import ConfigError, flatten
from recsys_hdet.constants import PARAM_GROUPS
from recsys_hdet.hdet.range_test.config import ADDED_KEYS as RANGE_TEST_ADDED_KEYS
from recsys_hdet.run_dir import RunDir

FINISHED = "finished"
# Config keys a resumed run may change: how it logs, evaluates and checkpoints, not what it trains.
RESUME_SAFE_KEYS = ("trainer.log_every", "trainer.metrics_every", "trainer.eval_batch_size", "trainer.profile",
                    "trainer.checkpoint", "trainer.periodic_checkpoint", "trainer.resume", "trainer.resume_from", "trainer.max_restarts",
                    "trainer.tensorboard", "trainer.threads_per_worker", "trainer.branch_from", "trainer.stop_at_step",
                    "model.compile_dense",  # compiled or eager: the same computation
                    "tracking")  # where the run is also logged


def config_changes(saved: Dict[str, Any], now: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """(keys that change what a checkpoint means, keys that only change logging/eval/checkpointing)."""
    # a key added since the checkpoint was written reads as its default there (ADDED_KEYS)
    a, b = {**ADDED_KEYS, **flatten(saved)}, {**ADDED_KEYS, **flatten(now)}
    changed = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    safe = [k for k in changed if k.startswith(RESUME_SAFE_KEYS)]
    return [k for k in changed if k not in safe], safe


def resolve_resume(cfg_dict: Dict[str, Any], run_dir: str) -> Optional[str]:
    """``trainer.resume`` -> the periodic checkpoint to continue from (None: start at step 0), or
    FINISHED when the run directory holds a finished run. ConfigError when it cannot be resumed."""
    from recsys_hdet.components.checkpoint import CheckpointError, check_step_checkpoint, latest_step_checkpoint

    mode = str(cfg_dict["trainer"]["resume"])
    files = RunDir(run_dir)
    holds_a_run = any(os.path.exists(files.path(f)) for f in (RunDir.METRICS, RunDir.SUMMARY, RunDir.CHECKPOINT))
    if mode == "never":
        if holds_a_run:
            raise ConfigError(f"config trainer.resume=never: {run_dir} already holds a run ({RunDir.METRICS}, "
                              f"{RunDir.SUMMARY} or {RunDir.CHECKPOINT}/); use another run_dir=DIR, or trainer.resume=auto")
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
    from recsys_hdet.config import recorded_config

    saved, notice = recorded_config(manifest.get("config", {}))
    if notice:
        print(f"resume: {path}: {notice}", flush=True)
    manifest = {**manifest, "config": saved}
    meaning, safe = config_changes(saved, {**cfg_dict, "trainer": {
        **cfg_dict["trainer"], "resume_from": manifest.get("config", {}).get("trainer", {}).get("resume_from")}})
    if meaning:
        raise ConfigError(f"config: cannot resume from {path}: these keys change what it means: "
                          + ", ".join(f"{k} ({flatten(manifest['config']).get(k, '<absent>')!r} -> "
                                      f"{flatten(cfg_dict).get(k, '<absent>')!r})" for k in meaning))
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
ADDED_KEYS = {"optim.dense.d0": 1e-6, "model.compile_dense": False,
              **{f"hdet.range_test.{k}": v for k, v in RANGE_TEST_ADDED_KEYS.items()},
              **{f"optim.schedule.groups.{g}.{k}": None for g in PARAM_GROUPS for k in ("decay_start", "anneal_strategy")}}


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
    saved, now = {**ADDED_KEYS, **flatten(manifest.get("config", {}))}, flatten(cfg_dict)
    differ = sorted(k for k in set(saved) | set(now) if k.startswith(BRANCH_FIXED_KEYS)
                    and saved.get(k, "<absent>") != now.get(k, "<absent>"))
    if differ:
        raise ConfigError(f"config trainer.branch_from={given}: the branch must train what that run trained; these "
                          "keys differ: " + ", ".join(f"{k} ({saved.get(k, '<absent>')!r} -> {now.get(k, '<absent>')!r})"
                                                      for k in differ))
    _check_branch_commitment(cfg_dict, manifest, given)
    return path


def _check_branch_commitment(cfg_dict: Dict[str, Any], manifest: Dict[str, Any], given: str) -> None:
    """A branch under the range test (``hdet=enabled``) trains at the rates the run it branches from committed:
    it starts at that run's step, where no sweep from step 0 can run. ConfigError when that run committed none, or
    committed with other sweep settings or configured rates."""
    from recsys_hdet.hdet.form import hdet_form

    if hdet_form(cfg_dict.get("hdet")) != "range_test":
        return
    from omegaconf import OmegaConf

    from recsys_hdet.hdet.range_test.job import commitment_differs
    from recsys_hdet.lr_control import COMMITMENT

    commitment = manifest.get(COMMITMENT)
    if not commitment:
        raise ConfigError(f"config trainer.branch_from={given} with hdet=enabled: that run committed no range-test "
                          "rates (a plain or controller run, or one checkpointed before commits were recorded), and a "
                          "branch starts mid-pass where no sweep can run: branch with hdet=disabled and set optim.lr.*, "
                          "or from a range-test run's checkpoint")
    differs = commitment_differs(OmegaConf.create(cfg_dict), commitment)
    if differs:
        raise ConfigError(f"config trainer.branch_from={given} with hdet=enabled: that run's commit was made with other "
                          "settings, so it is not this config's to reuse: " + ", ".join(
                              f"hdet.range_test.{k} ({a!r} -> {b!r})" if k != "start" else f"optim.lr ({a} -> {b})"
                              for k, (a, b) in differs.items()))
