"""``python -m recsys_hdet.lr_find +experiment=NAME [run_dir=DIR] [overrides]``: max learning rates from LR range tests.

The LR range test (Smith 2017, arXiv 1506.01186; fastai's ``lr_find``, Lightning's ``Tuner.lr_find``),
run as the recovery study's ``lr_finder`` contender runs it (docs/results/lr_recovery/lr_recovery.md): one short plain run
per axis, first the embedding group, then the dense groups together. In a sweep the axis's groups
rise geometrically from their max LR x ``low`` to x ``high`` over ``steps`` steps
(``optim.schedule.range_test``: 100 steps, x0.001 to x10000 by default: seven decades, so that a suggestion
can reach x1000 and a rate set 100x too low or too high is found inside the range, not at its ceiling;
fastai sweeps eight in 100 steps) while the other axis is held at its max LR x ``low``, so that each sweep
measures its own groups; the loss is logged every step. The suggestion is fastai's classic rule
(:mod:`recsys_hdet.components.range_rule`): the loss smoothed by an exponential moving average (0.98,
bias-corrected) and cut where it exceeds 4x its minimum, the multiplier at the smoothed minimum / 10; a
suggestion within one sweep step of an end of the range is flagged (``range_edge``) and warned about.

The command prints the overrides to train with (each group's max LR x its axis's multiplier: the dense
groups keep their ratios) and writes ``lr_find.json`` into its run directory
(``run_dir``, default ``outputs/lr_find/<experiment>/<time>/``; the sweeps in ``sweep_embedding/`` and ``sweep_dense/``).

Limits: the sweeps train the first ``steps`` steps of the pass on the config's data and layout, so
their cost is 2 x ``steps`` steps (in the recovery study 200 steps beside a 960-step pass); rollback is
off and the divergence check at its default, so a sweep ends where its loss explodes, as a range test
does. The suggestion is for the config's schedule (one-cycle), from its start: HDET and the
parameter-free dense optimizers (Prodigy, Schedule-Free) set their step sizes themselves and are refused.
Exit status: 0 with a suggestion (a warning when it lies at an end of the range), 2 for a bad config or data
(nothing written) or a run directory that already holds a range test, 1 when a sweep failed or logged no loss.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import hydra
import torchrec  # noqa: F401 - before Hydra sets up logging (as in recsys_hdet.train)
from omegaconf import DictConfig, OmegaConf

from recsys_hdet.components.range_rule import range_edge, suggest_multiplier
from recsys_hdet.constants import LR_AXES
from recsys_hdet.config import (CONF_DIR, ConfigError, check_composition, remove_hydra_leftovers, run_dir_argument,
                                run_hydra_command)
from data_tools.exit_status import ExitStatus

# How a sweep may end and still be read: stopped after its steps, or diverged where its loss exploded.
SWEEP_ENDS = (ExitStatus.OK, ExitStatus.DIVERGED)
_config_composed = False


def range_test_curve(metrics: Sequence[Dict[str, Any]]) -> tuple[List[int], List[float]]:
    """A range-test run's logged curve from its ``RunDir.METRICS`` records: the steps trained at each record
    and the loss logged there (what :func:`suggest_multiplier` reads)."""
    logged = [m for m in metrics if "loss" in m and "step" in m]
    return [int(m["step"]) for m in logged], [m["loss"]["avg"] for m in logged]


def sweep_config(cfg: DictConfig, axis: str) -> DictConfig:
    """The range test of one axis: ``cfg`` with the range-test schedule for the axis's groups, the other
    axis's max LRs x ``low``, a stop after ``steps`` steps, the loss logged every step, no checkpoints,
    no rollback, and a fresh run directory (``trainer.resume=never``)."""
    rt = cfg.optim.schedule.range_test
    sweep = OmegaConf.create(OmegaConf.to_container(cfg))
    for other, groups in LR_AXES.items():
        if other != axis:
            for g in groups:
                sweep.optim.lr[g] = float(cfg.optim.lr[g]) * float(rt.low)
    for key, value in {"optim.schedule.name": "range_test", "optim.schedule.range_test.groups": list(LR_AXES[axis]),
                       "trainer.stop_at_step": int(rt.steps), "trainer.log_every": 1,
                       "trainer.rollback.max_rollbacks": 0, "trainer.periodic_checkpoint.every_steps": 0,
                       "trainer.resume": "never",
                       "trainer.checkpoint": False, "trainer.tensorboard": False}.items():
        OmegaConf.update(sweep, key, value, merge=False)
    return sweep


def check_config(cfg: DictConfig) -> None:
    """Refuses what a range test of the one-cycle's max LRs cannot serve (ConfigError, exit 2)."""
    if cfg.hdet.enabled:
        raise ConfigError("hdet.enabled=true: the LR range test sweeps a plain run; drop hdet=enabled "
                          "(HDET's controller moves the base itself)")
    dense = str(cfg.optim.dense.type)
    if dense not in ("adam", "adamw"):
        raise ConfigError(f"optim.dense.type={dense}: sets its own step size; the LR range test serves adam or adamw")
    if str(cfg.optim.schedule.name) != "one_cycle":
        raise ConfigError(f"optim.schedule.name={cfg.optim.schedule.name}: the suggestion is for the one-cycle "
                          "schedule's max LRs (leave optim.schedule.name at one_cycle)")


def find(cfg: DictConfig, run_dir: str) -> Dict[str, Any]:
    """Runs the two sweeps into ``run_dir`` and returns the record ``lr_find.json`` holds:
    per axis its sweep's run, exit status, status, steps, multiplier and ``range_edge``; ``lr``: the
    suggested max LR per group (absent when a sweep failed or gave no suggestion). A sweep that ends
    diverged is an ordinary range test (its loss exploded); any other failure stops the search."""
    from recsys_hdet.api import train
    from recsys_hdet.run_dir import RunDir

    check_config(cfg)
    if os.path.exists(os.path.join(run_dir, "lr_find.json")) or any(
            os.path.exists(os.path.join(run_dir, f"sweep_{axis}")) for axis in LR_AXES):
        raise ConfigError(f"run_dir={run_dir}: already holds an LR range test (lr_find.json or sweep_*); "
                          "use another directory")
    rt = cfg.optim.schedule.range_test
    low, high = float(rt.low), float(rt.high)
    record: Dict[str, Any] = {"range_test": {"steps": int(rt.steps), "low": low, "high": high},
                              "start": {g: float(cfg.optim.lr[g]) for gs in LR_AXES.values() for g in gs}, "sweeps": {}}
    for axis in LR_AXES:
        sweep_dir = os.path.join(run_dir, f"sweep_{axis}")
        result = train(sweep_config(cfg, axis), sweep_dir)
        sweep: Dict[str, Any] = {"run_dir": sweep_dir, "exit_status": result.exit_status, "status": result.status,
                                 "steps": result.steps, "multiplier": None, "range_edge": None}
        record["sweeps"][axis] = sweep
        if result.exit_status not in SWEEP_ENDS:
            return record
        curve = range_test_curve(RunDir(sweep_dir).metrics())
        sweep["multiplier"] = suggest_multiplier(*curve, low, high, int(rt.steps))
        if sweep["multiplier"] is None:
            return record
        sweep["range_edge"] = range_edge(sweep["multiplier"], low, high, int(rt.steps))
    record["lr"] = {g: float(f"{record['start'][g] * record['sweeps'][axis]['multiplier']:.6g}")
                    for axis, gs in LR_AXES.items() for g in gs}
    return record


def overrides_line(lr: Dict[str, float]) -> str:
    return " ".join(f"optim.lr.{g}={v:.6g}" for g, v in lr.items())


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from data_tools.errors import DataError

    from data_tools.fileio import write_text_atomic

    global _config_composed
    _config_composed = True
    run_dir = hydra.core.hydra_config.HydraConfig.get().runtime.output_dir
    try:
        record = find(cfg, run_dir)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        remove_hydra_leftovers(run_dir, "lr_find.log")
        sys.exit(ExitStatus.USAGE)
    write_text_atomic(os.path.join(run_dir, "lr_find.json"), json.dumps(record, indent=1) + "\n")
    for axis, s in record["sweeps"].items():
        print(f"{axis}: sweep {s['status']} after {s['steps']} steps (exit status {s['exit_status']}), "
              f"multiplier {s['multiplier']}", flush=True)
        if s["range_edge"] == "high":
            print(f"warning: the {axis} suggestion is the largest this range allows (the loss still fell at the "
                  "sweep's end): the rate may lie higher; raise optim.schedule.range_test.high", flush=True)
        elif s["range_edge"] == "low":
            print(f"warning: the {axis} suggestion is the smallest this range allows (the loss rose from the first "
                  "step): lower optim.schedule.range_test.low", flush=True)
    if "lr" not in record:
        axis, s = next((a, s) for a, s in record["sweeps"].items() if s["multiplier"] is None)
        why = (f"its run failed (exit status {s['exit_status']})" if s["exit_status"] not in SWEEP_ENDS
               else "it logged no finite loss")
        print(f"error: no suggestion: the {axis} sweep in {s['run_dir']}: {why}", file=sys.stderr)
        sys.exit(ExitStatus.FAILED)
    print(f"suggested: {overrides_line(record['lr'])}")
    print(f"lr_find: {os.path.join(run_dir, 'lr_find.json')}")


def usage() -> str:
    return "\n".join([
        "python -m recsys_hdet.lr_find (recsys-hdet-lr-find): LR range tests (one per axis: embedding, dense) of a",
        "training config; prints the max LRs to train with and writes lr_find.json (docs/training.md).", "",
        "usage: python -m recsys_hdet.lr_find [+experiment=PRESET] [run_dir=DIR] [overrides as for recsys_hdet.train]",
        "  run_dir=DIR: where lr_find.json and the sweeps go (default outputs/lr_find/<experiment_name>/<date>_<time>)",
        "  optim.schedule.range_test.steps=100 .low=0.001 .high=10000: each sweep's length and range (x max LR)", "",
        "Exit status: 0 suggested, 1 a sweep gave no suggestion, 2 bad config or data."])


def cli() -> None:
    """``python -m recsys_hdet.lr_find`` and the ``recsys-hdet-lr-find`` command."""
    run_dir_argument()  # run_dir=DIR -> Hydra's hydra.run.dir=DIR
    overrides = sys.argv[1:]
    if not any(a.lstrip("+").startswith("hydra.run.dir=") for a in overrides):
        sys.argv.append("hydra.run.dir=outputs/lr_find/${experiment_name}/${now:%Y-%m-%d_%H-%M-%S}")
    if not any(a.startswith("-") for a in overrides):
        check_composition(overrides)
    run_hydra_command(main, lambda: _config_composed, usage)


if __name__ == "__main__":
    cli()
