"""Training as a typed API: ``train(config, run_dir) -> TrainResult``.

The command (``python -m recsys_hdet.train``), the retraining job and the studies all train through
:func:`train`; a job that wants a process of its own for isolation runs ``python -m recsys_hdet.api
CONFIG_FILE RUN_DIR`` on a resolved config file and reads the run's ``RunDir.SUMMARY`` (:meth:`TrainResult.load`),
never the console.

:func:`train` validates the config, prepares the data and the warm start (ConfigError / DataError: bad
config or data, nothing written), takes the run directory's lock, then launches ``trainer.nproc`` local
workers (or runs as one rank under torchrun), resuming a run the directory holds and restarting failed
workers up to ``trainer.max_restarts`` times; the console is copied into ``train.log``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from recsys_hdet.config import ConfigError, validate_config
from recsys_hdet.config_schema import TrainConfig, structured
from recsys_hdet.config_values import plain
from data_tools.exit_status import ExitStatus
from data_tools.fileio import abs_path
from recsys_hdet.job_inputs import prepare_data, stale_warm_start
from recsys_hdet.resume import FINISHED, resolve_branch, resolve_resume
from recsys_hdet.run_dir import RunDir, RunDirInUse, run_dir_lock


@dataclass(frozen=True)
class TrainResult:
    """What a training job left: its run directory, exit status and ``RunDir.SUMMARY`` (None when the
    job ended without one: a failure, or a usage error after the run directory was taken)."""

    run_dir: str
    exit_status: int
    summary: Optional[Dict[str, Any]]

    @property
    def status(self) -> str:
        """The run's status ("completed", "diverged", "stopped"), else "failed" (no summary)."""
        return str(self.summary["status"]) if self.summary else "failed"

    @property
    def steps(self) -> Optional[int]:
        return int(self.summary["steps"]) if self.summary else None

    @property
    def files(self) -> RunDir:
        """The run directory's files."""
        return RunDir(self.run_dir)

    @property
    def metrics(self) -> Dict[str, Dict[str, float]]:
        """The held-out metrics per task (``RunDir.SUMMARY``'s ``eval``; empty unless completed)."""
        return dict((self.summary or {}).get("eval") or {})

    def lr_trajectories(self) -> Dict[str, List[tuple]]:
        """Each parameter group's LR over the pass, ``[(step, lr), ...]``, from ``RunDir.METRICS``."""
        out: Dict[str, List[tuple]] = {}
        for record in self.files.metrics():
            for group, lr in (record.get("lr") or {}).items():
                out.setdefault(group, []).append((int(record["step"]), float(lr)))
        return out

    @classmethod
    def load(cls, run_dir: str, exit_status: int) -> "TrainResult":
        """The result of a job that trained into ``run_dir`` (in another process): its RunDir.SUMMARY."""
        return cls(os.path.abspath(run_dir), int(exit_status), RunDir(run_dir).summary())


def worker(cfg: TrainConfig, record: Dict[str, Any], run_dir: str, job_start: float) -> int:
    """One rank of the job: ``cfg`` the typed config, ``record`` its plain values as each checkpoint's
    manifest records them (``trainer.resume_from`` included: the checkpoint this attempt resumes)."""
    from recsys_hdet.distributed import quiet_library_warnings

    quiet_library_warnings()
    import torch
    import torch.distributed as dist

    from recsys_hdet.distributed import init_process_groups, threads_per_worker
    from recsys_hdet.trainer import Trainer

    torch.set_num_threads(threads_per_worker(cfg.trainer.threads_per_worker, int(os.environ["LOCAL_WORLD_SIZE"])))
    pgs = init_process_groups(int(cfg.trainer.sharding_group_size), float(cfg.trainer.collective_timeout_s))
    try:
        return Trainer(cfg, record, run_dir, pgs, job_start).run()
    finally:
        dist.destroy_process_group()


def run_record(cfg: DictConfig, typed: TrainConfig, root: str, warm_start: Optional[str]) -> Dict[str, Any]:
    """``cfg``'s plain values as the checkpoints' manifests record them, with the paths the run resolved (the data
    set ``root``, the ``warm_start`` checkpoint, the checkpoint ``trainer.branch_from`` names), set on ``typed``
    (the workers' config) too."""
    record = plain(cfg)
    record["data"]["root"] = typed.data.root = root
    record["trainer"]["warm_start"] = typed.trainer.warm_start = warm_start
    if typed.trainer.branch_from:
        record["trainer"]["branch_from"] = typed.trainer.branch_from = resolve_branch(record)
    return record


def record_config(cfg: DictConfig, run_dir: str, root: str, warm_start: Optional[str]) -> None:
    """Writes the run's saved config (``RunDir.CONFIG``: what evaluation, export and resume read) with the paths as
    the run resolved them, absolute, so that the run can be evaluated or exported from any directory.
    Built from ``cfg``, never read back: under torchrun only rank 0 writes it (cli() keeps the other
    ranks' Hydra from writing ``.hydra/``), and a file another process may be writing is no input."""
    from data_tools.fileio import write_text_atomic

    saved = RunDir(run_dir).path(RunDir.CONFIG)
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    record = OmegaConf.create(OmegaConf.to_container(cfg))
    record.data.root = root
    if warm_start:
        record.trainer.warm_start = warm_start
    write_text_atomic(saved, OmegaConf.to_yaml(record))


def train(cfg: DictConfig, run_dir: str, *, job_start: Optional[float] = None) -> TrainResult:
    """Trains ``cfg`` (a composed config) into ``run_dir``. Raises ConfigError or DataError (from
    data_tools.errors) for bad config or data before anything is written; every other outcome is a
    TrainResult (exit status 2 when another job holds the run directory, or when its run cannot be resumed
    with this config: the error is printed)."""
    from recsys_hdet.components.console_log import ConsoleLog
    from recsys_hdet.distributed import launch, torchrun_follower, under_torchrun

    job_start = time.time() if job_start is None else job_start
    typed = validate_config(cfg)  # the config typed once: the workers read its sections
    root = abs_path(typed.data.root) if torchrun_follower() else prepare_data(typed)
    warm_start = ensure_warm_start(typed)
    cfg_dict = run_record(cfg, typed, root, warm_start)
    os.makedirs(run_dir, exist_ok=True)
    if not torchrun_follower():
        record_config(cfg, run_dir, root, warm_start)
    try:
        lock = run_dir_lock(run_dir)  # held (the open file) until the job ends: a second job refuses to start
    except RunDirInUse as e:
        print(f"error: {e}", file=sys.stderr)
        return TrainResult(os.path.abspath(run_dir), ExitStatus.USAGE, None)
    # the console, workers included, is copied into the run's train.log (torchrun keeps its own logs)
    console = contextlib.nullcontext() if under_torchrun() else ConsoleLog(RunDir(run_dir).path(RunDir.TRAIN_LOG))
    code = 0
    with lock or contextlib.nullcontext(), console:
        print(f"run directory: {run_dir}", flush=True)
        max_restarts = 0 if under_torchrun() else int(typed.trainer.max_restarts)  # torchrun restarts on its own
        for attempt in range(max_restarts + 1):
            try:
                resume_from = resolve_resume(cfg_dict, run_dir)
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                return TrainResult.load(run_dir, ExitStatus.USAGE)
            if resume_from == FINISHED:
                break
            cfg_dict["trainer"]["resume_from"] = resume_from
            code = launch(worker, (typed, cfg_dict, run_dir, job_start), int(typed.trainer.nproc))
            if code in (0, ExitStatus.DIVERGED, ExitStatus.USAGE) or attempt == max_restarts:
                break
            print(f"the job failed (exit status {code}): restart {attempt + 1} of trainer.max_restarts={max_restarts}, "
                  "from the newest complete checkpoint", file=sys.stderr, flush=True)
    result = TrainResult.load(run_dir, code)
    if not torchrun_follower():  # one writer: the launcher (rank 0's under torchrun), never a worker
        from recsys_hdet.tracking import log_training

        log_training(cfg, run_dir, code, result.summary)
    return result


def ensure_warm_start(cfg: TrainConfig) -> str | None:
    """The absolute warm-start checkpoint path; trains it first with ``trainer.warm_start_preset``
    when it is missing (once: concurrent jobs wait on a lock), so a preset is self-contained."""
    from data_tools.fileio import file_lock

    from recsys_hdet.distributed import launch, under_torchrun

    if not cfg.trainer.warm_start:
        return None
    path = abs_path(cfg.trainer.warm_start)
    preset = cfg.trainer.warm_start_preset
    stale = stale_warm_start(path, str(cfg.data.root))
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
        pre = compose_config([f"+experiment={preset}", *cfg.trainer.warm_start_overrides])
        if pre.trainer.warm_start:
            raise ConfigError(f"config trainer.warm_start_preset={preset}: that preset needs a warm start itself")
        pre_typed = validate_config(pre)
        pre_dict = plain(pre)
        pre_dict["data"]["root"] = pre_typed.data.root = prepare_data(pre_typed)
        print(f"warm start {path} is missing: training it first with +experiment={preset}", flush=True)
        os.makedirs(run_dir, exist_ok=True)
        code = launch(worker, (pre_typed, pre_dict, run_dir, time.time()), int(pre_typed.trainer.nproc))
        if code or not ready():
            raise ConfigError(f"config trainer.warm_start_preset={preset}: the pre-training run into {run_dir} "
                              f"failed (exit status {code})")
    return path




def compose_config(overrides: List[str]) -> DictConfig:
    """The training config: ``conf/config.yaml`` composed with ``overrides`` (:func:`recsys_hdet.config.compose`)."""
    from recsys_hdet.config import compose

    return compose("config", overrides)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m recsys_hdet.api CONFIG_FILE RUN_DIR``: trains a resolved config file (a job's own
    process); the exit status is the run's (docs/operations.md)."""
    from data_tools.errors import DataError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m recsys_hdet.api CONFIG_FILE RUN_DIR", file=sys.stderr)
        return ExitStatus.USAGE
    try:
        cfg = structured(OmegaConf.load(args[0]))
        return train(cfg, args[1]).exit_status
    except (ConfigError, DataError, ValueError) as e:
        print(f"error: {args[0]}: {e}", file=sys.stderr)
        return ExitStatus.USAGE


if __name__ == "__main__":
    sys.exit(main())
