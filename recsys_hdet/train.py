"""``python -m recsys_hdet.train +experiment=NAME [run_dir=DIR] [overrides]``: the training command.

Hydra composes the config (once); :func:`recsys_hdet.api.train` validates it and the data
(generating the built-in synthetic data set on first use), then starts ``trainer.nproc`` local
workers, or, under torchrun, runs as one rank of the job. Bad config or data fail before any worker
starts, with a message naming the field or file (exit status 2; Hydra's leftovers removed); a
diverged run exits with 3.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Optional

import hydra
import torchrec  # noqa: F401 - before Hydra sets up logging: fbgemm logs each library it loads at INFO
from hydra.types import RunMode
from omegaconf import DictConfig

from recsys_hdet.config import (CONF_DIR, ConfigError, remove_hydra_leftovers, run_dir_argument,
                                run_hydra_command)
from recsys_hdet.run_dir import RunDir
from data_tools.exit_status import ExitStatus

# Set once Hydra has composed the config and entered main(): an exit before that is Hydra's own
# report of a config it cannot compose (unknown preset or group option, malformed override).
_config_composed = False


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> Optional[float]:
    """Trains; returns the held-out NE, mean over tasks (what a Hydra sweeper minimizes: ``-m
    hydra/sweeper=optuna``, docs/training.md). A run that did not complete exits with its status; in a
    multirun it returns inf instead, so that the sweep goes on and the sweeper ranks it last."""
    from data_tools.errors import DataError

    from recsys_hdet.api import train

    global _config_composed
    _config_composed = True
    job_start = time.time()
    run_dir = hydra.core.hydra_config.HydraConfig.get().runtime.output_dir
    try:
        result = train(cfg, run_dir, job_start=job_start)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        remove_hydra_leftovers(run_dir, RunDir.TRAIN_LOG)
        sys.exit(ExitStatus.USAGE)
    ne = [m["ne"] for m in (result.summary or {}).get("eval", {}).values()]
    scored = bool(ne) and all(x is not None and math.isfinite(x) for x in ne)
    if hydra.core.hydra_config.HydraConfig.get().mode != RunMode.MULTIRUN:
        if result.exit_status:
            sys.exit(result.exit_status)
        return sum(ne) / len(ne) if scored else None  # a run stopped early (trainer.stop_at_step) has no NE
    if result.exit_status or not scored:
        print(f"{run_dir}: exit status {result.exit_status}, held-out NE {ne or 'none'}: inf for the sweeper",
              file=sys.stderr)
        return float("inf")
    return sum(ne) / len(ne)


def usage() -> str:
    """``--help``: what the command does, the presets, the config groups and every key with its type, default
    and meaning (:func:`recsys_hdet.config.command_usage`)."""
    from recsys_hdet.config import command_usage, training_sections
    from recsys_hdet.run_dir import TIME_SHOWN

    return command_usage(
        "python -m recsys_hdet.train (recsys-hdet-train): train the multi-task ranker on local workers or as one\n"
        "rank under torchrun; HDET when the config enables it. Writes a run directory (docs/outputs.md).\n"
        "Exit status: 0 completed, 1 failed, 2 bad config or data (nothing written), 3 diverged (docs/operations.md).\n"
        "The composed config: --cfg job; Hydra's own flags: --hydra-help.",
        "usage: python -m recsys_hdet.train [+experiment=PRESET] [run_dir=DIR] [group=option ...] [key=value ...]\n"
        f"  run_dir=DIR: the run directory (default outputs/<experiment_name>/{TIME_SHOWN})", "config",
        training_sections())


def cli() -> None:
    """``python -m recsys_hdet.train`` and the ``recsys-hdet-train`` command."""
    run_dir_argument()  # run_dir=DIR -> Hydra's hydra.run.dir=DIR
    from recsys_hdet.distributed import torchrun_follower

    if torchrun_follower():
        # Under torchrun every rank runs this command into one run directory: Hydra's .hydra/ and the
        # run's config record are rank 0's alone (written by two processes at once, a reader saw an
        # empty file: tests/test_resume.py::test_torchrun_max_restarts_resumes_and_completes).
        sys.argv.append("hydra.output_subdir=null")
    run_hydra_command(main, lambda: _config_composed, usage)


if __name__ == "__main__":
    cli()
