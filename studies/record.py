"""One run's results line: what a study records of a finished run directory (:func:`record_from_run_dir`),
and the readings of a line the studies share (its syncs back in hdet.jsonl's form, its mean NE).

The line is appended to the study's results file (:mod:`studies.results`) once the run finishes.

A line (JSON object, keys in this order; floats rounded to 6 significant digits except the
held-out NE, the mean NE and the average train loss, which the reports compute with and keep
exactly)::

    name            study-relative run name, e.g. "all_low/hdet/seed1", "grid/e3_d2/seed0"
    seed, preset    the run's seed and its +experiment preset
    overrides       the Hydra overrides it was launched with (.hydra/overrides.yaml, verbatim)
    status          "completed" | "diverged" (| "stopped" where the trainer says so)
    steps           steps trained; total_steps: the pass's planned steps (RunDir.SUMMARY)
    wall_seconds, train_seconds, process_seconds, exit_status, examples_per_sec
    eval            {task: {ne, auc, logloss, calibration}} (completed runs only)
    mean_ne         mean held-out NE over the tasks (completed runs only, else null)
    train_loss      {avg, <task>: ...}
    oracle          {task: {ne, logloss}} where the data has an oracle
    layout          {nproc, sharding_group_size}
    schedule        the run's optim.schedule (OneCycle's arguments; each group's own decay under ``groups``)
    max_lr          {group: the max LR the run was configured with}
    preset_lr       {group: the preset's own max LR} (the plain schedule the LR areas refer to)
    lr_area         {group: geometric mean over every logged step of the pass (RunDir.METRICS) of
                    the LR the run used / the preset's plain schedule at that step}: the pass's
                    mean log-multiplier, exactly max_lr / preset_lr for a plain run
    hdet            HDET runs only: the resolved ``hdet`` config section, and summary's
                    {syncs, seconds, fraction_of_train}
    syncs           HDET runs only, columns over hdet.jsonl's sync records: {"step": [...],
                    "losses": [[per rank]...] (10 significant digits: the signal's noise is ~1e-4),
                    "train_losses" (signal=probe runs: the window training losses, likewise),
                    "hparams": {"lr/<group>": {"base": [...], "next_base": [...],
                    "velocity": [...], "log_offset": [...], "mult": [[value / base per
                    replica]...]}}, "excluded": [[...]...] only where some sync excluded a rank}
    rollback        RunDir.SUMMARY's rollback record, where present
    rows            {data, reserve_rows, total_steps, examples_per_step}: what the run trained on (two runs
                    are paired only when these are equal: :func:`studies.contract.check_same_rows`)
    range_test      LR range-test runs only (optim.schedule.name=range_test): the sweep's settings and
                    {"step": [...], "loss": [...]}, the average task loss of every logged step
    commit, clean   the commit the run trained from, and whether the tree was clean (no change outside
                    docs/) when it started (:func:`studies.provenance.code_state`)
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from data_tools.fileio import read_json
from recsys_hdet.constants import PARAM_GROUPS as GROUPS, TASKS
from recsys_hdet.run_dir import RunDir
from studies.lr_area import lr_area, preset_lrs

SIG = 6
LOSS_SIG = 10  # the replicas' losses differ by ~1e-4 at ~0.2: their noise needs the digits


def sig(x: Optional[float], digits: int = SIG) -> Optional[float]:
    """``x`` rounded to ``digits`` significant digits (None and non-finite values pass through)."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{digits}g}")


def _round_tree(obj: Any, digits: int = SIG) -> Any:
    if isinstance(obj, float):
        return sig(obj, digits)
    if isinstance(obj, dict):
        return {k: _round_tree(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round_tree(v, digits) for v in obj]
    return obj


def compact_syncs(records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """hdet.jsonl's sync records as columns (see the module docstring); :func:`sync_records` inverts it."""
    names: List[str] = []
    for r in records:
        names += [k for k in (r.get("hparams") or {}) if k not in names]
    out: Dict[str, Any] = {"step": [r["step"] for r in records],
                           "losses": [_round_tree(r.get("losses"), LOSS_SIG) for r in records],
                           "hparams": {}}
    if any(r.get("train_losses") is not None for r in records):  # signal=probe: the window training losses too
        out["train_losses"] = [_round_tree(r.get("train_losses"), LOSS_SIG) for r in records]
    for k in names:
        col: Dict[str, List[Any]] = {"base": [], "next_base": [], "velocity": [], "log_offset": [], "mult": []}
        for r in records:
            h = (r.get("hparams") or {}).get(k)
            col["base"].append(sig(h["base"]) if h else None)
            col["next_base"].append(sig(h.get("next_base")) if h else None)
            col["velocity"].append(sig(h.get("velocity")) if h else None)
            col["log_offset"].append(sig(h.get("log_offset")) if h else None)
            col["mult"].append([sig(v / h["base"]) if h["base"] else sig(v) for v in h["values"]] if h else None)
        if all(v is None for v in col["log_offset"]):
            del col["log_offset"]
        out["hparams"][k] = col
    if any(r.get("excluded") for r in records):
        out["excluded"] = [r.get("excluded") or [] for r in records]
    return out


def sync_records(record: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A line's syncs back in hdet.jsonl's form ({step, losses, hparams: {k: {base, values, next_base,
    velocity[, log_offset]}}, excluded}), values and bases as recorded (6 significant digits)."""
    syncs = record.get("syncs")
    if not syncs:
        return []
    out = []
    for i, step in enumerate(syncs["step"]):
        hparams = {}
        for k, col in syncs["hparams"].items():
            if col["base"][i] is None:
                continue
            base = col["base"][i]
            h = {"base": base, "values": [m * base if base else m for m in col["mult"][i]],
                 "next_base": col["next_base"][i], "velocity": col["velocity"][i]}
            if "log_offset" in col:
                h["log_offset"] = col["log_offset"][i]
            hparams[k] = h
        out.append({"step": step, "losses": syncs["losses"][i], "hparams": hparams,
                    "excluded": syncs["excluded"][i] if "excluded" in syncs else []})
        if "train_losses" in syncs:
            out[-1]["train_losses"] = syncs["train_losses"][i]
    return out


def record_from_run_dir(path: str, name: str) -> Dict[str, Any]:
    """The results line of the finished run in ``path`` (RunDir.SUMMARY, .hydra/, RunDir.METRICS,
    hdet.jsonl, ablation_run.json), named ``name`` within its study."""
    from omegaconf import OmegaConf

    run = RunDir(path)
    summary = run.summary()
    if summary is None:
        raise FileNotFoundError(f"{path}: no {RunDir.SUMMARY} (the run has not finished)")
    overrides = run.overrides()
    cfg = run.config()
    run_info = read_json(run.path(RunDir.STUDY_RUN)) or {}
    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("+experiment=")), None)
    total = int(summary.get("total_steps") or summary["steps"])  # older summaries lack total_steps
    schedule = OmegaConf.to_container(cfg.optim.schedule, resolve=True)
    max_lr = {g: float(cfg.optim.lr[g]) for g in GROUPS}
    base_lr = preset_lrs(preset) if preset else dict(max_lr)
    completed = summary["status"] == "completed" and summary.get("eval")
    r: Dict[str, Any] = {
        "name": name, "seed": int(cfg.seed), "preset": preset, "overrides": overrides, "status": summary["status"],
        "steps": int(summary["steps"]), "total_steps": total,
        "wall_seconds": sig(summary.get("wall_seconds")), "train_seconds": sig(summary.get("train_seconds")),
        "process_seconds": sig(run_info.get("process_seconds")), "exit_status": run_info.get("exit_status"),
        "examples_per_sec": sig(summary.get("examples_per_sec")),
    }
    if completed:
        r["eval"] = {t: {"ne": m["ne"], **{k: sig(m[k]) for k in ("auc", "logloss", "calibration") if k in m}}
                     for t, m in summary["eval"].items()}
    r["mean_ne"] = statistics.fmean(summary["eval"][t]["ne"] for t in TASKS) if completed else None
    loss = summary.get("train_loss") or {}
    r["train_loss"] = {k: (v if k == "avg" else sig(v)) for k, v in loss.items()}
    if summary.get("oracle"):
        r["oracle"] = _round_tree(summary["oracle"])
    r["layout"] = {"nproc": int(cfg.trainer.nproc), "sharding_group_size": int(cfg.trainer.sharding_group_size)}
    if summary.get("threads_per_worker") is not None:  # the float results depend on it (see studies.runs.verify)
        r["layout"]["threads_per_worker"] = int(summary["threads_per_worker"])
    r["schedule"] = schedule
    r["max_lr"] = max_lr
    r["preset_lr"] = base_lr
    metrics = run.metrics()
    r["lr_area"] = _round_tree(lr_area(metrics, schedule, base_lr, total))
    if cfg.hdet.get("enabled"):
        r["hdet"] = {"config": OmegaConf.to_container(cfg.hdet, resolve=True), **_round_tree(summary.get("hdet") or {})}
        syncs = run.syncs()
        if syncs:
            r["syncs"] = compact_syncs(syncs)
    if summary.get("rollback"):
        r["rollback"] = _round_tree(summary["rollback"])
    from recsys_hdet.config import probe_rows

    r["rows"] = {"data": str(cfg.data.name), "reserve_rows": probe_rows(cfg), "total_steps": total,
                 "examples_per_step": int(cfg.data.batch_size) * int(cfg.trainer.nproc)}
    if str(cfg.optim.schedule.get("name", "one_cycle")) == "range_test":
        from recsys_hdet.lr_find import range_test_curve

        steps, losses = range_test_curve(metrics)
        r["range_test"] = {**OmegaConf.to_container(cfg.optim.schedule.range_test, resolve=True),
                           "step": steps, "loss": [sig(loss, LOSS_SIG) for loss in losses]}
    r["commit"], r["clean"] = run_info.get("commit"), bool(run_info.get("clean", False))
    return r


def mean_ne(run: Mapping[str, Any]) -> Optional[float]:
    """Mean held-out NE over the tasks of a results line (or of a RunDir.SUMMARY); None unless completed."""
    if run.get("status") != "completed":
        return None
    if "mean_ne" in run:
        return run["mean_ne"]
    return statistics.fmean(run["eval"][t]["ne"] for t in TASKS)
