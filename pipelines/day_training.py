"""The retraining job's training run for a day.

Its config, as overrides of ``conf/config.yaml`` (:func:`training_overrides`: the day's experiment,
days, holdout, warm start and carried LRs), and the run itself (:func:`train`): through
:mod:`recsys_hdet.api` in a process of its own, which a killed job takes along and which resumes from
its last checkpoint when the job runs again.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from omegaconf import DictConfig

from pipelines.day_plan import DayPlan
from recsys_hdet.api import TrainResult
from recsys_hdet.run_dir import RunDir, write_job_config


def training_overrides(cfg: DictConfig, plan: DayPlan, all_days: Sequence[str], warm: Optional[str],
                       lrs: Dict[str, float]) -> List[str]:
    """The day's training config as overrides of ``conf/config.yaml`` (composed once, by :func:`train`)."""
    experiment = cfg.cold_start_experiment if plan.cold_start else cfg.experiment
    out = [f"+experiment={experiment}", f"data.root={os.path.abspath(str(cfg.data.root))}", "data.generator=null",
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
    outcome is read from the run's ``RunDir.SUMMARY``."""
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
