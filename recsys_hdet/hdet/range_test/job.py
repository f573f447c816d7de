"""The range test on the replicas in the training job (``hdet.range_test.steps > 0``): sweep, commit,
restart from the step-0 state.

Before the pass (:func:`replica_range_test`, called while the job builds its LR control):

1. the rank's state at step 0 is copied (its model and optimizer state: :class:`ModelState`; the random
   generators; the data stream's position);
2. the dense gradients are reduced within each replica only (``JobHandles.dense_gradients.within``), so
   that the replicas' sweeps do not share a gradient, and each replica sweeps its axis on the pass's first
   ``steps`` batches (:func:`recsys_hdet.hdet.range_test.sweep`), one training step outside the train
   pipeline each; one all-gather of the curves at the end;
3. every rank commits the same multipliers (:func:`recsys_hdet.hdet.range_test.sweep.commit`), the state, the
   generators and the stream's position are put back bit for bit, and the job goes on with the plain run's
   LR control at the committed max LRs.

So after the commit the run *is* the plain run at the committed max LRs, from the same step-0 state, bit for
bit (tests/test_hdet_range_test.py); a sweep that blew up leaves nothing behind. Its cost: ``steps`` extra
steps, run by all replicas at once (the LR finder runs two sweeps one after the other), and the copies.

The commit is the run's state (:func:`replica_range_test` returns it as the LR control's ``commitment``): every
checkpoint's manifest and the final model's meta carry it, and a resumed or branched run reuses it
(:func:`reuse_commitment`) instead of sweeping again: a second sweep on other floats (another thread count,
CUDA's non-deterministic kernels) could commit other rates mid-pass, and would charge the sweep twice.
``range_test.json`` is written once, by the sweep.

An axis whose answer lies off the map (:func:`recsys_hdet.hdet.range_test.rule.off_the_map`) is named in one
line at commit time and flagged in the record; ``hdet.range_test.off_map`` says what is committed for it. Each axis's
``check`` (:mod:`recsys_hdet.hdet.range_test.check`) is recorded, not printed: measured against the settings'
plateaus it missed its pre-registered targets (docs/hdet.md, the check), so a line would warn on healthy commits.

Limits: on one replica there is nothing to sweep with (refused by the config check: ``python -m
recsys_hdet.lr_find`` sweeps the axes one after the other instead).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Dict, Mapping

import torch
import torch.distributed as dist

from recsys_hdet.components.job_handles import JobHandles
from recsys_hdet.components.tensorboard import log_curves
from recsys_hdet.components.train_state import ModelState, RNGState, Snapshot
from recsys_hdet.constants import LR_AXES
from data_tools.fileio import write_text_atomic
from recsys_hdet.hdet.hparams import ReplicaAxis
from recsys_hdet.hdet.range_test.config import ADDED_KEYS
from recsys_hdet.hdet.range_test.sweep import ReplicaSweepPlan, commit, sweep
from recsys_hdet.run_dir import RunDir


FORM = "range_test"


def sweep_inputs(cfg: Any) -> Dict[str, Any]:
    """What a commit depends on besides the data and the model: the sweep and its rule, and the configured max LRs."""
    rt = cfg.hdet.range_test
    return {"steps": int(rt.steps), "low": float(rt.low), "high": float(rt.high),
            "divisors": {axis: float(d) for axis, d in rt.divisors.items()}, "off_map": str(rt.off_map),
            "read": str(rt.read), "start": {g: float(cfg.optim.lr[g]) for g in LR_AXES_GROUPS}}


LR_AXES_GROUPS = [g for groups in LR_AXES.values() for g in groups]


def commitment_differs(cfg: Any, commitment: Mapping[str, Any]) -> Dict[str, Any]:
    """The inputs of ``commitment`` (a checkpoint's) that differ from ``cfg``'s: {name: (recorded, now)}; the form
    itself when it is not the range test's. Empty: the commitment is this config's to reuse."""
    if commitment.get("form") != FORM:
        return {"form": (commitment.get("form"), FORM)}
    record, now = commitment.get(FORM) or {}, sweep_inputs(cfg)
    recorded = {k: record.get(k, ADDED_KEYS.get(k)) for k in now}
    return {k: (recorded[k], now[k]) for k in now if recorded[k] != now[k]}


def reuse_commitment(cfg: Any, commitment: Mapping[str, Any], log: Any) -> Dict[str, Any]:
    """The commitment a resumed or branched run's checkpoint recorded (its ``from_checkpoint`` says which),
    reused as is: no sweep. The launch checks that it is this config's (:func:`commitment_differs`, in
    :func:`recsys_hdet.resume.resolve_branch`; a resume changes none of these keys), so a difference here is a
    wiring error."""
    differs = commitment_differs(cfg, commitment)
    if differs:
        raise RuntimeError(f"the checkpoint's range-test commit is not this config's: {differs}")
    source = commitment.get("from_checkpoint")
    record = {**commitment[FORM], "reused_from": source}
    log(f"HDET range test: reusing the commit of {source} (no sweep): max LRs "
        + " ".join(f"{g}={v:.4g}" for g, v in commitment["committed"].items()))
    return {**{k: v for k, v in commitment.items() if k != "from_checkpoint"}, FORM: record}


def replica_range_test(cfg: Any, handles: JobHandles) -> Dict[str, Any]:
    """Runs the sweep on this rank's replica and returns the commitment (the LR control's ``commitment``):
    ``form``, ``committed`` (the max LR per group), ``cost`` (the sweep's steps and seconds) and under ``range_test``
    the record that rank 0 also writes to ``range_test.json`` in the run directory."""
    rt, layout, optimizer, stream = cfg.hdet.range_test, handles.layout, handles.optimizer, handles.stream
    plan = ReplicaSweepPlan(LR_AXES, int(rt.steps), float(rt.low), float(rt.high),
                            {axis: float(d) for axis, d in rt.divisors.items()}, str(rt.off_map), str(rt.read))
    max_lrs = {g: float(cfg.optim.lr[g]) for g in optimizer.groups}
    replica_of_rank = ReplicaAxis.per_block(layout.world_size, layout.sharding_group_size).replica_of_rank
    weights = handles.task_weights.double()

    def set_multipliers(multipliers: Mapping[str, float]) -> None:
        for group, param_groups in optimizer.groups.items():
            for pg in param_groups:
                pg["lr"] = max_lrs[group] * multipliers[group]
        optimizer.apply_hparams()  # the fused embedding kernels take an LR only when pushed

    def train_step(batch: Any) -> torch.Tensor:
        return handles.train_outside(batch) / weights.sum()  # the task-weighted mean, as RunDir.METRICS's loss

    def gather(curve: torch.Tensor) -> torch.Tensor:
        curves = [torch.empty_like(curve) for _ in range(layout.world_size)]
        dist.all_gather(curves, curve, group=handles.process_group)
        return torch.stack(curves).cpu()

    start = time.perf_counter()
    # The step-0 state: the model and every optimizer's state and step counters, the random generators (CPU and
    # CUDA), the data position; the LRs are put back by hand (they live in the optimizers' param groups).
    saved = Snapshot(ModelState(handles.model, optimizer.dense), RNGState(), stream)
    saved_lrs = [(pg, pg["lr"]) for pg in optimizer.param_groups]
    batches = iter(stream)
    try:
        with handles.dense_gradients.within(handles.sharding_group):
            reduced_over = dist.get_world_size(handles.dense_gradients.group)  # recorded: the ranks of a replica
            curves = sweep(plan, layout.sharding_group, batches, train_step, set_multipliers, gather)
    finally:
        batches.close()  # its day reader stops
        saved.restore()
        for pg, lr in saved_lrs:
            pg["lr"] = lr
        optimizer.apply_hparams()
    axes = commit(plan, curves, replica_of_rank)
    committed = {g: float(f"{max_lrs[g] * axes[axis]['multiplier']:.6g}") for axis, gs in LR_AXES.items() for g in gs}
    record = {"steps": plan.steps, "low": plan.low, "high": plan.high, "read": plan.read, "divisors": dict(plan.divisors),
              "off_map": plan.off_map, "start": max_lrs, "committed": committed,
              "axes": axes, "replica_axis": {str(r): plan.axis_of(r) for r in range(layout.replicas)},
              "dense_gradients_reduced_over": reduced_over,
              "seconds": time.perf_counter() - start}
    if layout.rank == 0:
        write_text_atomic(RunDir(handles.run_dir).path(RunDir.RANGE_TEST), json.dumps(record, indent=1) + "\n")
        log_curves(cfg, handles.run_dir, layout.rank, FORM, sweep_curves(axes))
    for axis, a in axes.items():
        why = " (no finite loss: its configured rates kept)" if a["no_suggestion"] else ""
        handles.log(f"HDET range test: {axis} x{a['multiplier']:.4g}{why} (ranks {a['ranks']})")
        if a["off_map"]:
            handles.log(off_map_line(axis, a, plan.off_map))
    handles.log("HDET range test committed in {:.1f} s; the pass trains plain from the step-0 state at max LRs "
                "{}".format(record["seconds"], " ".join(f"{g}={v:.4g}" for g, v in committed.items())))
    return {"form": FORM, "committed": committed, "cost": {"steps": plan.steps, "seconds": record["seconds"]},
            FORM: record}


def sweep_curves(axes: Mapping[str, Any]) -> Dict[str, Any]:
    """The sweep's curves as TensorBoard tags (x: the sweep step): per axis the pooled loss, the smoothed loss the
    rule read, log10 of the multiplier, and each replica's loss."""
    out: Dict[str, Any] = {}
    for axis, a in axes.items():
        out[f"{FORM}/{axis}/loss"] = a["loss"]
        out[f"{FORM}/{axis}/smoothed"] = a["smoothed"]
        out[f"{FORM}/{axis}/log10_multiplier"] = [math.log10(m) for m in a["multipliers"]]
        for rep, r in a["replicas"].items():
            out[f"{FORM}/{axis}/replica{rep}"] = r["loss"]
    return out


OFF_MAP_WHY = {"range_edge_high": "its answer lies within a sweep step of the range's top (the rate may lie higher)",
               "range_edge_low": "its answer lies within a sweep step of the range's bottom (the loss rose from the "
                                 "first steps)",
               "never_exploded": "the loss never exploded (the edge lies above the range, or the axis barely matters)",
               "never_descended": "the loss never fell (a trained model, or rates too high from the start)"}


def off_map_line(axis: str, a: Mapping[str, Any], policy: str) -> str:
    """The one line that says an axis's answer is off the map, why, and what was committed for it."""
    did = (f"kept its configured rates (x1; the rule said x{a['suggested']:.4g}; hdet.range_test.off_map=commit "
           "commits it)" if a["kept_configured"] else
           f"committed the rule's x{a['multiplier']:.4g} anyway (hdet.range_test.off_map={policy})")
    return (f"WARNING: HDET range test: the {axis} axis's answer is off the map: "
            + "; ".join(OFF_MAP_WHY[f] for f in a["off_map"]) + f". It {did}; read its curve in range_test.json "
            "(docs/hdet.md, reading the curves), or run python -m recsys_hdet.lr_find")
