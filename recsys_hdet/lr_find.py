"""``python -m recsys_hdet.lr_find +experiment=NAME [run_dir=DIR] [overrides]``: max learning rates from LR range tests.

The LR range test (Smith 2017, arXiv 1506.01186; fastai's ``lr_find``, Lightning's ``Tuner.lr_find``),
run as the recovery study's ``lr_finder`` contender runs it (docs/results/lr_recovery/lr_recovery.md): one short plain run
per axis, first the embedding group, then the dense groups together. In a sweep the axis's groups
rise geometrically from their max LR x ``low`` to x ``high`` over ``steps`` steps
(``optim.schedule.range_test``: 100 steps, x0.001 to x10000 by default: seven decades, so that a suggestion
can reach x1000 and a rate set 100x too low or too high is found inside the range, not at its ceiling;
fastai sweeps eight in 100 steps) while the other axis is held at its max LR x ``low``, so that each sweep
measures its own groups; the loss is logged every step. The suggestion is fastai's classic rule
(:mod:`recsys_hdet.hdet.range_test.rule`): the loss smoothed by an exponential moving average (0.98,
bias-corrected) and cut where it exceeds 4x its minimum, the multiplier at the smoothed minimum / 10; a
suggestion within one sweep step of an end of the range is flagged (``range_edge``) and warned about.

The command prints the overrides to train with (each group's max LR x its axis's multiplier: the dense
groups keep their ratios) and writes ``lr_find.json`` into its run directory
(``run_dir``, default ``outputs/lr_find/<experiment_name>/<YYYY-MM-DD_HH-MM-SS>/``; the sweeps in ``sweep_embedding/`` and ``sweep_dense/``).
The console shows one line per sweep (its LRs, how it ended, its seconds), each sweep's step lines going to its
own ``train.log``, then the suggestion per axis and the command's cost in seconds (in all and per sweep).

The sweeps run one after the other on one launch of the workers (:func:`run_sweeps`), so that their start-up
(the workers' imports and process group, the data check) is paid once; each sweep is an ordinary
:class:`~recsys_hdet.trainer.Trainer` run from a fresh build (``Trainer.build`` seeds it from the config), so
its curve is bit for bit that of a run of its own (compared on the demo and tiny data: tests/test_lr_find.py).

Limits: the sweeps train the first ``steps`` steps of the pass on the config's data and layout, so
their cost is 2 x ``steps`` steps (in the recovery study 200 steps beside a 960-step pass), each one's loss
logged (``trainer.log_every=1``; the training metrics, whose computation every step made a sweep's step about
4x a pass's, once at the end: ``trainer.metrics_every``);
rollback is off and the divergence check at its default, so a sweep ends where its loss explodes, as a
range test does (said as "loss exploded ... (expected)", not as a failure). The suggestion is for the
config's schedule (one-cycle), from its start: HDET and the parameter-free dense optimizers (Prodigy,
Schedule-Free) set their step sizes themselves and are refused.
Exit status: 0 with a suggestion (a warning when it lies at an end of the range), 2 for a bad config or data
(nothing written) or a run directory that already holds a range test, 1 when a sweep failed or logged no loss.
"""

from __future__ import annotations

import time

# The command's cost is counted from here, its imports included (Python's start and the package's import come
# before: 1 to 2 s).
_STARTED = time.monotonic()

import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import hydra
import torchrec  # noqa: F401 - before Hydra sets up logging (as in recsys_hdet.train)
from omegaconf import DictConfig, OmegaConf

from recsys_hdet.hdet.range_test.rule import CLASSIC_SMOOTHING, curve_record, range_edge
from recsys_hdet.constants import LR_AXES
from recsys_hdet.config import (CONF_DIR, NO_OWN_DECAY, ConfigError, remove_hydra_leftovers, run_dir_argument,
                                run_hydra_command)
from data_tools.exit_status import ExitStatus

# How a sweep may end and still be read: stopped after its steps, or diverged where its loss exploded.
SWEEP_ENDS = (ExitStatus.OK, ExitStatus.DIVERGED)
_config_composed = False


def range_test_curve(metrics: Sequence[Dict[str, Any]]) -> tuple[List[int], List[float]]:
    """A range-test run's logged curve from its ``RunDir.METRICS`` records: the steps trained at each record
    and the loss logged there (what :func:`~recsys_hdet.hdet.range_test.rule.curve_record` reads)."""
    logged = [m for m in metrics if "loss" in m and "step" in m]
    return [int(m["step"]) for m in logged], [m["loss"]["avg"] for m in logged]


def sweep_config(cfg: DictConfig, axis: str) -> DictConfig:
    """The range test of one axis: ``cfg`` with the range-test schedule for the axis's groups, the other
    axis's max LRs x ``low``, a stop after ``steps`` steps, the loss logged every step (the training NE, AUC
    and calibration once, at the end: ``trainer.metrics_every``), no checkpoints,
    no rollback, and a fresh run directory (``trainer.resume=never``)."""
    rt = cfg.optim.schedule.range_test
    sweep = OmegaConf.create(OmegaConf.to_container(cfg))
    for other, groups in LR_AXES.items():
        if other != axis:
            for g in groups:
                sweep.optim.lr[g] = float(cfg.optim.lr[g]) * float(rt.low)
    # A group's own decay (optim.schedule.groups) shapes the pass after the peak the sweep finds, not the sweep.
    if "groups" in sweep.optim.schedule:
        OmegaConf.update(sweep, "optim.schedule.groups", NO_OWN_DECAY, merge=False)
    for key, value in {"optim.schedule.name": "range_test", "optim.schedule.range_test.groups": list(LR_AXES[axis]),
                       "trainer.stop_at_step": int(rt.steps), "trainer.log_every": 1,
                       "trainer.metrics_every": int(rt.steps),
                       "trainer.rollback.max_rollbacks": 0, "trainer.periodic_checkpoint.every_steps": 0,
                       "trainer.resume": "never",
                       "trainer.checkpoint": False, "trainer.tensorboard": False}.items():
        OmegaConf.update(sweep, key, value, merge=False)
    return sweep


def check_config(cfg: DictConfig) -> None:
    """Refuses what a range test of the one-cycle's max LRs cannot serve (ConfigError, exit 2)."""
    if cfg.hdet.enabled:
        raise ConfigError("hdet.enabled=true: lr_find sweeps a plain run, one axis after the other; drop the hdet "
                          "override (hdet=enabled runs the same test on the replicas inside the training run)")
    dense = str(cfg.optim.dense.type)
    if dense not in ("adam", "adamw"):
        raise ConfigError(f"optim.dense.type={dense}: sets its own step size; the LR range test serves adam or adamw")
    if str(cfg.optim.schedule.name) != "one_cycle":
        raise ConfigError(f"optim.schedule.name={cfg.optim.schedule.name}: the suggestion is for the one-cycle "
                          "schedule's max LRs (leave optim.schedule.name at one_cycle)")


def sweep_heading(cfg: DictConfig, axis: str) -> str:
    """What a sweep's console line says before it runs: its groups and their LRs from first to last step."""
    rt = cfg.optim.schedule.range_test
    by_start: Dict[float, List[str]] = {}
    for g in LR_AXES[axis]:
        by_start.setdefault(float(cfg.optim.lr[g]), []).append(g)

    def span(lr: float) -> str:
        return f"{lr * float(rt.low):.4g} -> {lr * float(rt.high):.4g}"

    ranges = (span(next(iter(by_start))) if len(by_start) == 1
              else ", ".join(f"{span(lr)} ({', '.join(gs)})" for lr, gs in by_start.items()))
    groups = "" if list(LR_AXES[axis]) == [axis] else f": {', '.join(LR_AXES[axis])}"
    return f"({axis}{groups}): lr {ranges} over {int(rt.steps)} steps"


def sweep_outcome(status: str, metrics: Sequence[Dict[str, Any]], diverge_loss: float) -> str:
    """How a sweep ended, for its console line. A diverged sweep is a range test reaching its end (its loss
    exploded, as it should at the top of the range); the trainer's divergence check stopped it on a non-finite
    loss, an average loss above ``trainer.diverge_loss`` (said as its multiple of the best logged one), or a
    collapse to the base-rate predictor (``trainer.collapse``)."""
    if status != "diverged":
        return {"stopped": "done", "completed": "done (the pass ended before the sweep)"}.get(status, status)
    steps, losses = range_test_curve(metrics)
    if not steps:  # the check follows a record (one every step): not met in practice
        return "range test: stopped by the divergence check (expected)"
    # An interval without a finite step is logged with NaN losses (records from before: 0.0, the mean over none).
    last = next(m["loss"] for m in reversed(metrics) if "loss" in m and "step" in m)
    if not math.isfinite(losses[-1]) or all(v == 0.0 for v in last.values()):
        return f"range test: loss exploded at step {steps[-1]} (non-finite) (expected)"
    if losses[-1] > diverge_loss:
        best = min(x for x in losses if math.isfinite(x))
        return (f"range test: loss exploded at x{losses[-1] / best:.3g} of its best, step {steps[-1]} "
                f"(above trainer.diverge_loss={diverge_loss:g}) (expected)")
    return f"range test: the model collapsed to the base rate at step {steps[-1]} (trainer.collapse) (expected)"


# One sweep for the workers: its typed config, the config's plain values, its run directory, its console heading.
Sweep = Tuple[Any, Dict[str, Any], str, str]


def sweep_worker(sweeps: Sequence[Sweep]) -> int:
    """One rank of the range tests: the sweeps one after the other, each a :class:`~recsys_hdet.trainer.Trainer`
    run as :func:`recsys_hdet.api.worker` runs one, on one process group. Each sweep's output goes to its own
    ``train.log``; rank 0 writes one console line per sweep. A failed sweep (it raises) ends the job, the
    sweeps after it unrun. A sweep's ``wall_seconds`` (``RunDir.SUMMARY``) counts from its own start."""
    from recsys_hdet.distributed import quiet_library_warnings

    quiet_library_warnings()
    import torch
    import torch.distributed as dist

    from recsys_hdet.components.console_log import output_to
    from recsys_hdet.distributed import init_process_groups, threads_per_worker
    from recsys_hdet.run_dir import RunDir
    from recsys_hdet.trainer import Trainer

    trainer = sweeps[0][0].trainer  # the sweeps differ in their schedules and LRs alone
    torch.set_num_threads(threads_per_worker(trainer.threads_per_worker, int(os.environ["LOCAL_WORLD_SIZE"])))
    pgs = init_process_groups(int(trainer.sharding_group_size), float(trainer.collective_timeout_s))
    console = pgs.layout.rank == 0  # one line per sweep, from rank 0 (the rank that writes the run's files)
    try:
        for number, (typed, record, sweep_dir, heading) in enumerate(sweeps, 1):
            start, files = time.time(), RunDir(sweep_dir)
            if console:
                print(f"sweep {number}/{len(sweeps)} {heading} ...", end="", flush=True)
            try:
                with output_to(files.path(RunDir.TRAIN_LOG)):
                    print(f"run directory: {sweep_dir}", flush=True)
                    Trainer(typed, record, sweep_dir, pgs, start).run()
            except BaseException:
                if console:
                    print(f" failed after {time.time() - start:.1f} s: see {files.path(RunDir.TRAIN_LOG)}", flush=True)
                raise
            if console:
                outcome = sweep_outcome(str((files.summary() or {}).get("status")), files.metrics(),
                                        float(typed.trainer.diverge_loss))
                print(f" {outcome}{'' if outcome == 'done' else '; done'} in {time.time() - start:.1f} s", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def run_sweeps(sweeps: Dict[str, DictConfig], run_dir: str) -> Dict[str, Any]:
    """Trains each axis's sweep config into ``run_dir/sweep_<axis>`` and returns each one's
    :class:`~recsys_hdet.api.TrainResult` (exit status 0 stopped, 3 diverged, else the workers' failure).

    All sweeps run on one launch of ``trainer.nproc`` workers (:func:`sweep_worker`): started once, the workers
    (Python, torch and TorchRec imports, the process group) and the data check cost once, not per sweep. The job
    set-up is :func:`recsys_hdet.api.train`'s for a fresh run (``trainer.resume=never``: no resume, no restarts):
    the config checked and typed, the data prepared, the warm start resolved, each sweep's config recorded and its
    directory locked. Raises ConfigError or DataError for a bad config or data (before anything is written) or a
    sweep directory another job holds."""
    from recsys_hdet.api import TrainResult, ensure_warm_start, record_config, run_record
    from recsys_hdet.config import validate_config
    from recsys_hdet.distributed import launch, torchrun_follower
    from recsys_hdet.job_inputs import prepare_data
    from recsys_hdet.run_dir import RunDir, RunDirInUse, run_dir_lock
    from data_tools.fileio import abs_path

    typed = {axis: validate_config(cfg) for axis, cfg in sweeps.items()}
    first = next(iter(typed.values()))
    root = abs_path(first.data.root) if torchrun_follower() else prepare_data(first)  # the same data for every sweep
    warm_start = ensure_warm_start(first)
    jobs: List[Sweep] = []
    locks = []
    for axis, cfg in sweeps.items():
        values = run_record(cfg, typed[axis], root, warm_start)  # as api.train records them
        values["trainer"]["resume_from"] = None
        jobs.append((typed[axis], values, os.path.join(run_dir, f"sweep_{axis}"), sweep_heading(cfg, axis)))
    try:
        for axis, (_, _, sweep_dir, _) in zip(sweeps, jobs):
            os.makedirs(sweep_dir, exist_ok=True)
            if not torchrun_follower():
                record_config(sweeps[axis], sweep_dir, root, warm_start)
            try:
                locks.append(run_dir_lock(sweep_dir))  # held until the workers end: a second job refuses to start
            except RunDirInUse as e:
                raise ConfigError(str(e)) from None
        print(f"lr_find: {len(jobs)} LR range tests on {int(first.trainer.nproc)} worker(s) into {run_dir} "
              f"(each sweep's log: sweep_<axis>/{RunDir.TRAIN_LOG})", flush=True)
        code = launch(sweep_worker, (jobs,), int(first.trainer.nproc))
    finally:
        for lock in locks:
            if lock is not None:
                lock.close()
    results = {}
    for axis, (_, _, sweep_dir, _) in zip(sweeps, jobs):
        status = (RunDir(sweep_dir).summary() or {}).get("status")  # none: the sweep failed, or one before it did
        exit_status = (ExitStatus.DIVERGED if status == "diverged" else ExitStatus.OK if status
                       else code or ExitStatus.FAILED)
        results[axis] = TrainResult.load(sweep_dir, exit_status)
    return results


def find(cfg: DictConfig, run_dir: str) -> Dict[str, Any]:
    """Runs the two sweeps into ``run_dir`` and returns the record ``lr_find.json`` holds:
    per axis its sweep's run, exit status, status, steps, seconds (from its own start, the workers' start-up
    aside), multiplier and ``range_edge``; ``lr``: the suggested max LR per group (absent when a sweep failed
    or gave no suggestion). A sweep that ends diverged is an ordinary range test (its loss exploded); any
    other failure stops the search."""
    from recsys_hdet.run_dir import RunDir

    check_config(cfg)
    if os.path.exists(os.path.join(run_dir, "lr_find.json")) or any(
            os.path.exists(os.path.join(run_dir, f"sweep_{axis}")) for axis in LR_AXES):
        raise ConfigError(f"run_dir={run_dir}: already holds an LR range test (lr_find.json or sweep_*); "
                          "use another directory")
    rt = cfg.optim.schedule.range_test
    low, high = float(rt.low), float(rt.high)
    record: Dict[str, Any] = {"range_test": {"steps": int(rt.steps), "low": low, "high": high,
                                             "smoothing": CLASSIC_SMOOTHING},
                              "start": {g: float(cfg.optim.lr[g]) for gs in LR_AXES.values() for g in gs}, "sweeps": {}}
    results = run_sweeps({axis: sweep_config(cfg, axis) for axis in LR_AXES}, run_dir)
    for axis, result in results.items():
        sweep: Dict[str, Any] = {"run_dir": result.run_dir, "exit_status": result.exit_status, "status": result.status,
                                 "steps": result.steps, "seconds": (result.summary or {}).get("wall_seconds"),
                                 "multiplier": None, "range_edge": None}
        record["sweeps"][axis] = sweep
        if result.exit_status not in SWEEP_ENDS:
            return record
        curve = range_test_curve(RunDir(result.run_dir).metrics())
        sweep["curve"] = curve_record(*curve, low, high, int(rt.steps))  # what lr_find.png draws
        sweep["multiplier"] = sweep["curve"]["multiplier"]  # fastai's rule, read once by curve_record
        if sweep["multiplier"] is None:
            return record
        sweep["range_edge"] = range_edge(sweep["multiplier"], low, high, int(rt.steps))
        sweep["off_map"] = sweep["curve"]["off_map"]
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
    record["seconds"] = time.monotonic() - _STARTED
    write_text_atomic(os.path.join(run_dir, "lr_find.json"), json.dumps(record, indent=1) + "\n")
    plot_curves(record, os.path.join(run_dir, "lr_find.png"))
    for axis, s in record["sweeps"].items():
        if s["multiplier"] is None:
            continue
        groups = LR_AXES[axis]
        print(f"{axis}: x{s['multiplier']:.3g} {'its max LR' if len(groups) == 1 else 'their max LRs'}"
              + (f": {overrides_line({g: record['lr'][g] for g in groups})}" if "lr" in record else ""), flush=True)
        if s["range_edge"] == "high":
            print(f"warning: the {axis} suggestion is the largest this range allows (the loss still fell at the "
                  "sweep's end): the rate may lie higher; raise optim.schedule.range_test.high", flush=True)
        elif s["range_edge"] == "low":
            print(f"warning: the {axis} suggestion is the smallest this range allows (the loss rose from the first "
                  "step): lower optim.schedule.range_test.low", flush=True)
        others = [f for f in s.get("off_map", []) if not f.startswith("range_edge")]
        if others:
            print(f"warning: the {axis} curve {' and '.join(o.replace('_', ' ') for o in others)}: its minimum may "
                  "say little about a rate; read lr_find.png before training with it", flush=True)
    if "lr" not in record:
        print(cost_line(record), flush=True)
        axis, s = next((a, s) for a, s in record["sweeps"].items() if s["multiplier"] is None)
        why = (f"its run failed (exit status {s['exit_status']}; its log: {os.path.join(s['run_dir'], 'train.log')})"
               if s["exit_status"] not in SWEEP_ENDS else "it logged no finite loss")
        print(f"error: no suggestion: the {axis} sweep in {s['run_dir']}: {why}", file=sys.stderr)
        sys.exit(ExitStatus.FAILED)
    print(f"suggested: {overrides_line(record['lr'])}")
    print(cost_line(record))
    print(f"lr_find: {os.path.join(run_dir, 'lr_find.json')}")


def plot_curves(record: Dict[str, Any], path: str) -> None:
    """``lr_find.png``: each sweep's curve as the evaluation report draws the range test's (the rule's smoothed
    loss, its minimum, its cut and the suggestion); nothing when no sweep logged a curve."""
    from recsys_hdet.evaluation.report_figures import plt, range_curves_figure

    axes = {axis: {**s["curve"], "multiplier": s["multiplier"] or 1.0} for axis, s in record["sweeps"].items()
            if s.get("curve")}
    if axes:
        fig = range_curves_figure(axes, "python -m recsys_hdet.lr_find: the LR range test, one sweep per axis")
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)


def cost_line(record: Dict[str, Any]) -> str:
    """The command's time in all and each sweep's (what is left: Python's start and imports, the data check and
    the workers' start, once for all sweeps)."""
    sweeps = ", ".join(f"{axis} {s['seconds']:.1f} s" for axis, s in record["sweeps"].items() if s["seconds"])
    return f"cost: {record['seconds']:.1f} s in all (sweeps: {sweeps or 'none finished'}; the rest starting up)"


def usage() -> str:
    """``--help``: what the command does, then the training config's presets, groups and keys (it takes them all)."""
    from recsys_hdet.config import command_usage, training_sections
    from recsys_hdet.run_dir import TIME_SHOWN

    return command_usage(
        "python -m recsys_hdet.lr_find (recsys-hdet-lr-find): LR range tests (one per axis: embedding, dense) of a\n"
        "training config; prints the max LRs to train with and writes lr_find.json (docs/training.md).\n"
        "Exit status: 0 suggested, 1 a sweep gave no suggestion, 2 bad config or data.",
        "usage: python -m recsys_hdet.lr_find [+experiment=PRESET] [run_dir=DIR] [group=option ...] [key=value ...]\n"
        f"  run_dir=DIR: where lr_find.json and the sweeps go (default outputs/lr_find/<experiment_name>/{TIME_SHOWN})\n"
        "  optim.schedule.range_test.steps, .low, .high: each sweep's length and range (x max LR)", "config",
        training_sections())


def cli() -> None:
    """``python -m recsys_hdet.lr_find`` and the ``recsys-hdet-lr-find`` command."""
    run_dir_argument()  # run_dir=DIR -> Hydra's hydra.run.dir=DIR
    overrides = sys.argv[1:]
    if not any(a.lstrip("+").startswith("hydra.run.dir=") for a in overrides):
        from recsys_hdet.run_dir import TIME_FORMAT

        sys.argv.append(f"hydra.run.dir=outputs/lr_find/${{experiment_name}}/${{now:{TIME_FORMAT}}}")
    run_hydra_command(main, lambda: _config_composed, usage)


if __name__ == "__main__":
    cli()
