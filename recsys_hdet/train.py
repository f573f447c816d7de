"""``python -m recsys_hdet.train +experiment=NAME [overrides]``.

The launching process resolves the Hydra config, validates it and the data (generating the
built-in synthetic data set on first use), then starts ``trainer.nproc`` local workers, or, under
torchrun, runs as one rank of the job. Bad config or data fail here, before any worker starts,
with a message naming the field or file (exit status 2); a diverged run exits with 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import hydra
import torchrec  # noqa: F401 - before Hydra sets up logging: fbgemm logs each library it loads at INFO
from omegaconf import DictConfig, OmegaConf

from recsys_hdet.components.console_log import ConsoleLog
from recsys_hdet.config import CONF_DIR, ConfigError, compose_error, run_hydra_command, validate_config
from recsys_hdet.exit_status import ExitStatus

# Set once Hydra has composed the config and entered main(): an exit before that is Hydra's own
# report of a config it cannot compose (unknown preset or group option, malformed override).
_config_composed = False


def _worker(cfg_dict: Dict[str, Any], run_dir: str, job_start: float) -> int:
    from recsys_hdet.distributed import quiet_library_warnings

    quiet_library_warnings()
    import torch
    import torch.distributed as dist

    from recsys_hdet.distributed import init_process_groups, threads_per_worker
    from recsys_hdet.trainer import Trainer

    cfg = OmegaConf.create(cfg_dict)
    torch.set_num_threads(threads_per_worker(cfg.trainer.get("threads_per_worker"), int(os.environ["LOCAL_WORLD_SIZE"])))
    pgs = init_process_groups(int(cfg.trainer.sharding_group_size), float(cfg.trainer.collective_timeout_s))
    try:
        return Trainer(cfg, run_dir, pgs, job_start).run()
    finally:
        dist.destroy_process_group()


def _abs_path(path: object) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def prepare_data(cfg: DictConfig) -> str:
    """Makes sure the processed data set exists (generating the synthetic one if configured) and is valid."""
    from data_tools.prepare import ensure_dataset
    from data_tools.validate import validate_processed

    root = _abs_path(cfg.data.root)
    if cfg.data.get("generator") is not None:
        ensure_dataset(root, OmegaConf.to_container(cfg.data.generator), OmegaConf.to_container(cfg.data.min_count))
    validate_processed(root)
    _check_days_and_steps(cfg, root)
    return root


def _check_days_and_steps(cfg: DictConfig, root: str) -> None:
    """The day split and the pass length, checked before workers start (same arithmetic as theirs)."""
    from recsys_hdet.components.dataloader import DatasetMeta, RowHoldout, day_rows, split_for

    meta = DatasetMeta.load(root)
    exposure = str(cfg.data.get("train_exposure", "all"))
    try:
        train_days, _ = split_for(meta, cfg.data)
        # "standard": the rows without random exposure; data.holdout: the rows not held out
        per_day = day_rows(meta, train_days, exposure, RowHoldout.from_config(cfg.data))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    from recsys_hdet.config import probe_rows

    global_batch = int(cfg.data.batch_size) * int(cfg.trainer.nproc)
    rows = sum(per_day.values())
    kind = " standard-exposure" if exposure == "standard" else ""
    if rows < global_batch:
        raise ConfigError(f"config data.batch_size={cfg.data.batch_size} x trainer.nproc={cfg.trainer.nproc}: "
                          f"the training days of {root} hold {rows}{kind} rows, less than one global batch")
    reserved = probe_rows(cfg)
    smallest = min(per_day.values())
    if reserved and smallest - reserved < global_batch:
        raise ConfigError(f"config hdet.probe_rows={reserved}: the smallest training day of {root} has {smallest}"
                          f"{kind} rows; with the probe rows reserved it cannot fill one global batch of {global_batch}")


def _stale_warm_start(path: str, data_root: str) -> str:
    """Why the checkpoint at ``path`` does not fit the data set's model inputs ('' if it does, or if
    it does not record them).

    Tables that only grow (every feature kept, each table at least as large as recorded, the same
    dense features: the data set's vocabularies gained ids since) fit: the warm start loads the
    checkpoint's rows into the first rows of each table and the new rows start fresh
    (recsys_hdet.components.checkpoint.load_model); one line names the grown tables. A feature
    added or removed, a table that shrinks, or other dense features do not."""
    from recsys_hdet.components.dataloader import DatasetMeta, model_inputs

    try:
        with open(os.path.join(path, "meta.json")) as f:
            recorded = json.load(f).get("model_inputs")
    except (OSError, ValueError):
        return ""
    if recorded is None:
        return "it records no model inputs: trained before they were recorded"
    now = model_inputs(DatasetMeta.load(data_root))
    diff = sorted(k for k in set(now["sparse"]) | set(recorded["sparse"])
                  if now["sparse"].get(k) != recorded["sparse"].get(k))
    tables = []  # what a warm start cannot load: a table added, removed or smaller than recorded
    for k in diff:
        if k not in recorded["sparse"]:
            tables.append(f"{k} added")
        elif k not in now["sparse"]:
            tables.append(f"{k} removed")
        elif now["sparse"][k] < recorded["sparse"][k]:
            tables.append(f"{k} shrinks {recorded['sparse'][k]} -> {now['sparse'][k]} rows")
    why = ([f"embedding tables differ ({', '.join(tables)}; a warm start can only grow a table)"] if tables else []) + \
          (["dense features differ"] if now["dense"] != recorded["dense"] else [])
    if why:
        return "; ".join(why)
    if diff and os.environ.get("RANK", "0") == "0":
        grown = ", ".join(f"{k} {recorded['sparse'][k]} -> {now['sparse'][k]} "
                          f"(+{now['sparse'][k] - recorded['sparse'][k]} rows)" for k in diff)
        print(f"warm start {path}: the data set's vocabularies grew since it was trained; embedding tables grow: "
              f"{grown}", flush=True)
    return ""


def ensure_warm_start(cfg: DictConfig) -> str | None:
    """The absolute warm-start checkpoint path; trains it first with ``trainer.warm_start_preset``
    when it is missing (once: concurrent jobs wait on a lock), so a preset is self-contained."""
    from recsys_hdet.fileio import file_lock

    from recsys_hdet.distributed import launch, under_torchrun

    if not cfg.trainer.get("warm_start"):
        return None
    path = _abs_path(cfg.trainer.warm_start)
    preset = cfg.trainer.get("warm_start_preset")
    stale = _stale_warm_start(path, str(cfg.data.root))
    if stale and preset and not under_torchrun():
        # A checkpoint the preset trained on an earlier version of the data set (its inputs differ):
        # derived data, so it is retrained rather than loaded into a model it does not fit.
        print(f"warm start {path} was trained on other model inputs ({stale}): retraining it", flush=True)
        import shutil

        shutil.rmtree(path)
    elif stale:
        raise ConfigError(f"config trainer.warm_start={path}: trained on other model inputs than {cfg.data.root} "
                          f"has ({stale})")
    ready = lambda: os.path.isfile(os.path.join(path, ".metadata"))
    if ready():
        return path
    if not preset or under_torchrun():
        raise ConfigError(f"config trainer.warm_start={path}: no checkpoint there (no .metadata)"
                          + ("" if preset else " and no trainer.warm_start_preset to produce it"))
    run_dir = os.path.dirname(path)
    with file_lock(run_dir + ".lock"):
        if ready():
            return path
        pre = hydra.compose(config_name="config",
                            overrides=[f"+experiment={preset}", *cfg.trainer.get("warm_start_overrides", [])])
        if pre.trainer.get("warm_start"):
            raise ConfigError(f"config trainer.warm_start_preset={preset}: that preset needs a warm start itself")
        validate_config(pre)
        pre_dict = OmegaConf.to_container(pre, resolve=True, enum_to_str=True)
        pre_dict["data"]["root"] = prepare_data(pre)
        print(f"warm start {path} is missing: training it first with +experiment={preset}", flush=True)
        os.makedirs(run_dir, exist_ok=True)
        code = launch(_worker, (pre_dict, run_dir, time.time()), int(pre.trainer.nproc))
        if code or not ready():
            raise ConfigError(f"config trainer.warm_start_preset={preset}: the pre-training run into {run_dir} "
                              f"failed (exit status {code})")
    return path


def _run_dir_lock(run_dir: str):
    """An exclusive lock on ``run_dir/.lock`` held for the job's life (the open file). Under
    torchrun, rank 0's process holds it. Exits with status 2 when another job holds it."""
    from recsys_hdet.fileio import LockHeld, try_exclusive_lock

    from recsys_hdet.distributed import under_torchrun

    if under_torchrun() and os.environ.get("RANK", "0") != "0":
        return None
    try:
        return try_exclusive_lock(os.path.join(run_dir, ".lock"))
    except LockHeld as e:
        print(f"error: {run_dir} is in use by another training job ({e.holder}); wait for it, or use another "
              "hydra.run.dir", file=sys.stderr)
        sys.exit(ExitStatus.USAGE)


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
    summary = os.path.join(run_dir, "summary.json")
    holds_a_run = any(os.path.exists(os.path.join(run_dir, f)) for f in ("metrics.jsonl", "summary.json", "checkpoint"))
    if mode == "never":
        if holds_a_run:
            raise ConfigError(f"config trainer.resume=never: {run_dir} already holds a run (metrics.jsonl, "
                              "summary.json or checkpoint/); use another hydra.run.dir, or trainer.resume=auto")
        return None
    if os.path.isfile(summary):
        with open(summary) as f:
            status = json.load(f).get("status")
        print(f"{run_dir} holds a finished run (status {status}): nothing to do (trainer.resume={mode})", flush=True)
        return FINISHED
    if mode == "auto":
        found = latest_step_checkpoint(os.path.join(run_dir, "checkpoint"), run_dir)
        if found is None:
            if holds_a_run:
                print(f"resume: no complete checkpoint in {run_dir}/checkpoint: starting from step 0", flush=True)
            return None
        path, manifest = found
    else:
        path = _abs_path(mode)
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
    path = _abs_path(given)
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


def _remove_hydra_leftovers(run_dir: str) -> None:
    """A run that fails validation trains and writes nothing: Hydra has already written ``.hydra/``
    and an empty job log into the run directory, so those go, and the directory too if that leaves
    it empty (a directory that held anything else is kept), and so do the empty parents Hydra made
    for it inside the working directory (outputs/<experiment>/)."""
    import shutil

    shutil.rmtree(os.path.join(run_dir, ".hydra"), ignore_errors=True)
    log = os.path.join(run_dir, "train.log")
    if os.path.isfile(log) and os.path.getsize(log) == 0:
        os.remove(log)
    path, cwd = os.path.abspath(run_dir), os.getcwd()
    while True:
        try:
            os.rmdir(path)
        except OSError:
            break  # not empty: it held something before this run
        path = os.path.dirname(path)
        if not path.startswith(cwd + os.sep):
            break


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from data_tools.errors import DataError

    from recsys_hdet.distributed import launch, under_torchrun

    global _config_composed
    _config_composed = True
    job_start = time.time()
    run_dir = hydra.core.hydra_config.HydraConfig.get().runtime.output_dir
    try:
        validate_config(cfg)
        if not under_torchrun() or os.environ.get("RANK") == "0":
            root = prepare_data(cfg)
        else:
            root = _abs_path(cfg.data.root)
        warm_start = ensure_warm_start(cfg)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        _remove_hydra_leftovers(run_dir)
        sys.exit(ExitStatus.USAGE)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # plain values for the workers
    cfg_dict["data"]["root"] = root
    cfg_dict["trainer"]["warm_start"] = warm_start
    if cfg_dict["trainer"].get("branch_from"):
        try:
            cfg_dict["trainer"]["branch_from"] = resolve_branch(cfg_dict)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            _remove_hydra_leftovers(run_dir)
            sys.exit(ExitStatus.USAGE)
    lock = _run_dir_lock(run_dir)  # a second job on the same run directory refuses to start
    # the console, workers included, is copied into the run's train.log (torchrun keeps its own logs)
    console = contextlib.nullcontext() if under_torchrun() else ConsoleLog(os.path.join(run_dir, "train.log"))
    with console:
        print(f"run directory: {run_dir}", flush=True)
        max_restarts = 0 if under_torchrun() else int(cfg.trainer.max_restarts)  # torchrun restarts on its own
        for attempt in range(max_restarts + 1):
            try:
                resume_from = resolve_resume(cfg_dict, run_dir)
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(ExitStatus.USAGE)
            if resume_from == FINISHED:
                return
            cfg_dict["trainer"]["resume_from"] = resume_from
            code = launch(_worker, (cfg_dict, run_dir, job_start), int(cfg.trainer.nproc))
            if code in (0, ExitStatus.DIVERGED, ExitStatus.USAGE) or attempt == max_restarts:
                break
            print(f"the job failed (exit status {code}): restart {attempt + 1} of trainer.max_restarts={max_restarts}, "
                  "from the newest complete checkpoint", file=sys.stderr, flush=True)
        if code:
            sys.exit(code)


def _check_composition(overrides: List[str]) -> None:
    """Composes the config once before Hydra's own run, so that an unknown key, a wrong type or a
    bad choice is reported in one line naming the key and what is allowed (exit 2). Hydra reports
    every other composition error itself (flags such as --help or -m are left to it)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            compose(config_name="config", overrides=overrides)
    except ConfigCompositionException as e:
        message = compose_error(e)
        if message:
            print(f"error: {message}", file=sys.stderr)
            sys.exit(ExitStatus.USAGE)


def _preset_summary(path: str) -> str:
    """A preset's first sentence, from the comment lines that open its file."""
    words: List[str] = []
    with open(path) as f:
        for line in f:
            if line.startswith("# @package"):
                continue
            if not line.startswith("#"):
                break
            words.append(line[1:].strip())
    text = " ".join(words).split(". ")[0].rstrip(".")
    return text if len(text) <= 80 else text[:80].rsplit(" ", 1)[0] + " ..."


def usage() -> str:
    """``--help``: what the command does, the presets a user runs (files starting with ``_`` are
    fragments the presets share, not presets) and the config groups, read from conf/."""
    lines = ["python -m recsys_hdet.train (recsys-hdet-train): train the multi-task ranker on local workers or as one",
             "rank under torchrun; HDET when the config enables it. Writes a run directory (docs/outputs.md).",
             "", "usage: python -m recsys_hdet.train [+experiment=PRESET] [group=option ...] [key=value ...]", "",
             "presets (+experiment=NAME):"]
    folder = os.path.join(CONF_DIR, "experiment")
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".yaml") and not n.startswith("_")):
        lines.append(f"  {name[:-5]:<24}{_preset_summary(os.path.join(folder, name))}")
    lines += ["", "config groups (group=option):"]
    for group in sorted(g for g in os.listdir(CONF_DIR) if os.path.isdir(os.path.join(CONF_DIR, g)) and g != "experiment"):
        options = sorted(n[:-5] for n in os.listdir(os.path.join(CONF_DIR, group)) if n.endswith(".yaml"))
        lines.append(f"  {group:<10}{', '.join(options)}")
    lines += ["", "Every key, its type and allowed values: recsys_hdet/config_schema.py; the composed config: --cfg job;",
              "Hydra's own flags: --hydra-help.",
              "Exit status: 0 completed, 1 failed, 2 bad config or data (nothing written), 3 diverged (docs/operations.md)."]
    return "\n".join(lines)


def cli() -> None:
    """``python -m recsys_hdet.train`` and the ``recsys-hdet-train`` command."""
    overrides = sys.argv[1:]
    if not any(a.startswith("-") for a in overrides):
        _check_composition(overrides)
    run_hydra_command(main, lambda: _config_composed, usage)


if __name__ == "__main__":
    cli()
