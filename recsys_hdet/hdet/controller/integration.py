"""HDET in the training job: the LR control (:class:`recsys_hdet.lr_control.LRControl`)
that the trainer holds when ``hdet.enabled``.

Everything the job does for HDET lives here, so the training loop never branches on it:

- the engine (:class:`~recsys_hdet.hdet.controller.scheduler.HDETOneCycleLR`): one-cycle base schedules, each
  replica's multiplier, the sync every ``hdet.sync_every`` steps, the controller;
- the **signal** each replica reports at a sync (:mod:`recsys_hdet.hdet.controller.signals`): its weighted
  training loss (``signal=train``), the loss as it serves on the batch it trains on, before the
  step (``signal=serving``: eval mode, no smoothing; the model computes it in the training step
  when :attr:`HDETControl.wants_serving_loss`), or its loss on rows reserved from each day, scored
  at the last iterate (``probe``), at the window's averaged iterate (``averaged_probe``), or after
  a cooldown of ``hdet.anneal_probe.steps`` steps on the first reserved rows, the probe scoring
  the rest (``anneal_probe``), or at the replicas' averaged iterate moved along each group's
  discounted sum of past displacements by the replica's offset (``discounted_credit``: MARTHE's
  hypergradient read from the spread);
- **converge**: the dense replicas averaged over the world at every sync (a non-finite rank left
  out and restored from the others); the embedding replicas (one per sharding group) too when their
  LR is spread, else at the plain cadence by the loop (alpha = 0 is then the plain run, in every
  layout);
- the **warm-start noise** each replica adds to warm-started weights (method section 4);
- the **logs**: ``hdet.jsonl`` (a sync record per sync; rollback events as ``"event"`` lines),
  TensorBoard, the console line; ``RunDir.SUMMARY``'s ``hdet`` (time in HDET's hooks).

It talks to the model only through the :class:`~recsys_hdet.components.replicas.ReplicaAverager`
(averaging, finiteness), the optimizer's named param groups, the explored hyperparameters'
bindings, and, for the probe, a function that scores batches.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from recsys_hdet.components.job_handles import JobHandles
from recsys_hdet.components.lr_scheduler import one_cycle_shape
from recsys_hdet.config_values import plain
from recsys_hdet.components.train_metrics import weighted_task_mean
from recsys_hdet.components.replicas import ReplicaAverager, all_finite, average_, mixed_replica_loss
from recsys_hdet.components.train_state import ModelState
from recsys_hdet.hdet.controller.config import HDETConfig
from recsys_hdet.hdet.hparams import ReplicaAxis
from recsys_hdet.hdet.controller.explored import build_explored_hparams
from recsys_hdet.hdet.controller.scheduler import HDETOneCycleLR
from recsys_hdet.hdet.controller.signals import (SIGNALS, AnnealThenProbe, AveragedIterateProbe, DiscountedCredit, LastIterateProbe,
                                     ReplicaSignal)
from recsys_hdet.hdet.controller.warm_init import perturb_
from recsys_hdet.run_dir import RunDir



class HDETControl:
    """HDET's LR control. With explore-then-commit (``hdet.explore_rounds``), once the rounds have
    committed and nothing is left to control, it hands the pass to ``plain_after_commit(max_lrs)``: the
    plain run's LR control at the held max LRs, started at that step. From there the run is a plain run
    (no syncs, no signal, the plain cadence and failure checks), bit for bit the plain run branched from
    that step's state with those max LRs; the exploration costs nothing afterwards."""

    commitment = None  # the controller commits nothing before the pass (its state is checkpointed instead)

    def __init__(self, scheduler: HDETOneCycleLR, *, signal: str, task_weights: torch.Tensor, world_size: int,
                 embedding_sync_every: int, committed_embedding_sync_every: int = 0, run_dir: str,
                 rank: int, plain_after_commit: Optional[Callable[[Mapping[str, float]], Any]] = None) -> None:
        if signal not in SIGNALS:
            raise ValueError(f"hdet.signal={signal!r}: choose one of {list(SIGNALS)}")
        self.scheduler = scheduler
        self.signal = signal
        self.task_weights = task_weights
        self.world_size = world_size
        self._embedding_sync_every = embedding_sync_every
        # Explore-then-commit: once the rounds are over the embedding replicas train at one LR and are
        # averaged at the plain run's cadence (0: HDET's own cadence throughout).
        self.committed_embedding_sync_every = committed_embedding_sync_every
        self.run_dir, self.rank = run_dir, rank
        self._plain_after_commit = plain_after_commit
        self.plain: Optional[Any] = None  # the plain LR control once the pass is handed over
        self.handed_over_at: Optional[int] = None
        self.seconds = 0.0  # time in HDET's hooks (for benchmarks)
        self.syncs = 0
        # Each LR group's base at the last sync in max-LR units (the run's max LR times the base over
        # the schedule it replaces at that step): what a later job that carries the LR starts from.
        self.controlled_max_lr: Dict[str, float] = {}
        self.trained_steps = 0
        self._failure = ""
        self._log = None
        self._tensorboard = None

    @property
    def tolerates_non_finite_replicas(self) -> bool:
        """Until the hand-over a non-finite replica is restored at the next sync; after it, as plain."""
        return self.plain is None

    def _hand_over(self, step: int) -> bool:
        """From ``step`` (the next to train) the plain control at the held max LRs, where the engine holds
        everything and a plain control is given; says whether it did."""
        held = self.scheduler.held_max_lrs() if self._plain_after_commit is not None else None
        if held is None:
            return False
        self.plain = self._plain_after_commit(held)
        self.plain.start_at(step)
        self.handed_over_at, self.controlled_max_lr = step, dict(held)
        return True

    @property
    def embedding_sync_every(self) -> int:
        """How often the loop's hook averages the embedding replicas now (0: at HDET's syncs)."""
        if self.plain is not None:
            return self.plain.embedding_sync_every
        if self.committed_embedding_sync_every and self.scheduler.engine.committed:
            return self.committed_embedding_sync_every
        return self._embedding_sync_every

    # -- every step ----------------------------------------------------------------------------
    @property
    def wants_serving_loss(self) -> bool:
        return self.signal == "serving"

    def step(self, step: int, per_task: torch.Tensor, served: Optional[torch.Tensor]) -> Optional[Dict[str, Any]]:
        if self.plain is not None:
            return self.plain.step(step, per_task, served)
        start = time.perf_counter()
        self.trained_steps = step + 1  # the probe scores the reserved rows of this step's day
        # The replica's signal: its weighted task loss (the training objective, per example), or the
        # loss as it serves (no dropout, no smoothing) on the batch it trained on, taken before the
        # step (in one pass, a held-out estimate; what regularizers should be judged by). The probe's
        # rows are scored by the engine at the sync.
        signal = weighted_task_mean(served if self.signal == "serving" else per_task, self.task_weights)
        record = self.scheduler.step(signal)
        self.seconds += time.perf_counter() - start
        self.syncs += record is not None
        # Every replica non-finite at a sync: none to restore the others from (same on all ranks).
        self._failure = ("every replica non-finite at the sync, none to restore the others from"
                         if record is not None and len(record["excluded"]) == self.world_size else "")
        if record is not None:
            self._record_bases(record)
            if self._log is not None:
                self._write_sync(record)
            if not self._failure and self._hand_over(step + 1) and self.rank == 0:
                print(f"HDET: exploration committed; from step {step + 1} the plain schedule at max LRs "
                      + " ".join(f"{g}={v:.4g}" for g, v in self.controlled_max_lr.items()), flush=True)
        return record

    def _record_bases(self, record: Mapping[str, Any]) -> None:
        prefix, hparams = self.scheduler.log_prefix, record.get("hparams") or {}
        for group, schedule in self.scheduler.schedules.items():
            if prefix + group not in hparams:  # a sync with no finite replica sets no bases
                continue
            at = min(int(record["step"]), schedule.total_steps - 1)
            self.controlled_max_lr[group] = schedule.max_lr * hparams[prefix + group]["next_base"] / schedule(at)[0]

    def failed_check(self) -> str:
        return self._failure

    # -- logs ----------------------------------------------------------------------------------
    def open_logs(self, start_step: int, tensorboard: Any) -> None:
        """Rank 0 writes hdet.jsonl (appending after a resume: the interrupted attempt's records
        past the checkpoint were dropped by the trainer) and HDET's TensorBoard scalars."""
        if self.rank == 0:
            self._log = open(RunDir(self.run_dir).path(RunDir.HDET), "a" if start_step else "w")
            self._tensorboard = tensorboard

    def _write_sync(self, record: Dict[str, Any]) -> None:
        self._log.write(json.dumps(record) + "\n")
        self._log.flush()
        self._tensorboard.log_hdet(record)
        bases = " ".join(f"{k.split('/')[-1] if k.startswith('lr/') else k}={v['next_base']:.3g}"
                         for k, v in record["hparams"].items())
        excluded = f"  excluded ranks {record['excluded']}" if record["excluded"] else ""
        print(f"HDET sync at step {record['step']}: base lr {bases}{excluded}", flush=True)

    def log_event(self, event: Mapping[str, Any]) -> None:
        """An event line (a rollback): readers of sync records skip it (metrics.sync_records)."""
        if self._log is not None:
            self._log.write(json.dumps({**event, "event": "rollback"}) + "\n")
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def summary(self, train_seconds: float) -> Dict[str, Any]:
        # Rank 0's time in HDET's hooks (gather, converge, controller, value updates).
        return {"hdet": {"syncs": self.syncs, "seconds": self.seconds,
                         "fraction_of_train": self.seconds / max(train_seconds, 1e-9),
                         "handed_over_at": self.handed_over_at},
                "lr": {"controlled_max_lr": dict(self.controlled_max_lr)}}

    # -- the LR control's other duties -----------------------------------------------------------
    def is_spread(self, group: str) -> bool:
        return self.scheduler.is_spread(group)

    def start_at(self, step: int) -> None:
        self.plain = self.handed_over_at = None
        self.scheduler.start_at(step)
        self._hand_over(step)  # a branch from a step after the commit

    def cut_learning_rates(self, factor: float) -> None:
        (self.plain or self.scheduler).cut_learning_rates(factor)

    def state_dict(self) -> Dict[str, Any]:
        # The same keys before and after the hand-over (a checkpoint is loaded into a fresh control's
        # state_dict): the plain control's state, or a placeholder of its shape, and -1 for "not yet".
        plain = self.plain.state_dict() if self.plain is not None else {
            "last_step": 0, "scale": {group: 1.0 for group in self.scheduler.schedules}}
        return {**self.scheduler.state_dict(), "hook_seconds": self.seconds, "syncs": self.syncs,
                "controlled_max_lr": dict(self.controlled_max_lr), "plain": plain,
                "handed_over_at": -1 if self.handed_over_at is None else self.handed_over_at}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scheduler.load_state_dict(state)
        self.seconds = float(state.get("hook_seconds", 0.0))
        self.syncs = int(state.get("syncs", 0))
        self.plain = self.handed_over_at = None
        if int(state.get("handed_over_at", -1)) >= 0:  # the held max LRs follow from the engine's state
            self._hand_over(int(state["handed_over_at"]))
            self.plain.load_state_dict(state["plain"])
        self.controlled_max_lr = {g: float(v) for g, v in (state.get("controlled_max_lr") or {}).items()}


def build_hdet_control(cfg: Any, handles: JobHandles, *, total_steps: int, plain_embedding_sync_every: int,
                       plain_after_commit: Optional[Callable[[Mapping[str, float]], Any]] = None) -> HDETControl:
    """HDET's LR control for the job (``cfg.hdet``, ``cfg.optim``); adds each replica's warm-start
    noise first when the job warm-starts. Through ``handles``: the model (where explored
    hyperparameters are written), the optimizer's groups, the replicas, the reserved rows and
    ``served_loss`` (the probe signals' score), ``train_outside`` (the cooldown of ``anneal_probe``)."""
    optimizer, model, averager, stream, layout = (handles.optimizer, handles.model, handles.averager, handles.stream,
                                                  handles.layout)
    process_group, task_weights, loss_settings, run_dir, log = (handles.process_group, handles.task_weights,
                                                                handles.loss_settings, handles.run_dir, handles.log)
    served_loss, train_outside = handles.served_loss, handles.train_outside
    h, sched = cfg.hdet, cfg.optim.schedule
    groups = list(optimizer.groups)
    if cfg.trainer.warm_start and float(h.warm_init.nu) > 0:
        nu, seed = float(h.warm_init.nu), int(h.seed)
        perturb_(averager.dense_tensors, nu, torch.Generator().manual_seed(seed * 100_003 + layout.rank))
        # Embedding replicas are the sharding groups; each rank perturbs the shards it holds.
        perturb_(averager.embedding_weights, nu, torch.Generator().manual_seed(seed * 100_003 + 50_000 + layout.rank))
        log(f"HDET warm init: every replica perturbed with nu={nu} per tensor")
    if not averager.has_embedding_replicas:
        log("HDET: one sharding group, so no embedding replicas: the embedding group follows the base "
            "schedule (use trainer.sharding_group_size < trainer.nproc to explore it)")

    controller = HDETConfig.from_mapping(plain(h))
    signal = str(h.signal)
    replica_signal = _build_signal(signal, h, cfg, controller, optimizer=optimizer, model=model, averager=averager,
                                   stream=stream, layout=layout, task_weights=task_weights, log=log,
                                   served_loss=served_loss, train_outside=train_outside,
                                   trained_steps=lambda: control.trained_steps,
                                   replica_offsets=lambda: control.scheduler.replica_offsets())

    control: Optional[HDETControl] = None

    def converge(excluded_ranks) -> None:
        bad_groups = {r // layout.sharding_group_size for r in excluded_ranks}
        averager.average_dense(include=layout.rank not in excluded_ranks)
        # Embedding replicas averaged by the loop at the plain cadence are averaged here only to
        # restore an excluded one.
        if averager.has_embedding_replicas and (control.embedding_sync_every == 0 or bad_groups):
            averager.average_embeddings(include=layout.sharding_group not in bad_groups)

    scheduler = HDETOneCycleLR(
        optimizer,
        max_lr={g: float(cfg.optim.lr[g]) for g in groups},
        total_steps=total_steps,
        cycle_momentum=bool(sched.cycle_momentum),
        **one_cycle_shape(sched),
        hdet=controller,
        ceiling_multiple=float(h.ceiling_multiple),
        replica_axes={"embedding": ReplicaAxis.per_block(layout.world_size, layout.sharding_group_size)},
        converge=converge,
        state_is_finite=averager.local_state_is_finite,
        on_change=optimizer.apply_hparams,
        process_group=process_group,
        signal=replica_signal,
        extra_hparams=build_explored_hparams(
            plain(h.explore),
            starts={"dropout": float(cfg.model.dropout), "weight_decay": float(cfg.optim.dense.weight_decay),
                    "temperature": float(cfg.model.attention_temperature),
                    "label_smoothing": float(cfg.loss.label_smoothing)},
            model=model, dense_groups=optimizer.groups, loss=loss_settings,
            axis=ReplicaAxis.per_rank(layout.world_size)),
    )
    # When the embedding replicas are averaged: with their LR spread, at every sync (converge), so
    # each replica follows its own LR for a window; with no spread (alpha = 0), at the plain
    # cadence, as the plain run; hdet.embedding_sync_every forces a cadence (to measure the window).
    override = h.embedding_sync_every
    if override is not None:
        every = int(override)
    elif scheduler.is_spread("embedding"):
        every = 0
    else:
        every = plain_embedding_sync_every
    committed_every = plain_embedding_sync_every if override is None and scheduler.engine.explored else 0
    control = HDETControl(scheduler, signal=signal, task_weights=task_weights, world_size=layout.world_size,
                          embedding_sync_every=every if averager.has_embedding_replicas else 0,
                          committed_embedding_sync_every=committed_every if averager.has_embedding_replicas else 0,
                          run_dir=run_dir, rank=layout.rank, plain_after_commit=plain_after_commit)
    return control


def _build_signal(signal: str, h: Any, cfg: Any, controller: HDETConfig, *, optimizer: Any, model: torch.nn.Module,
                  averager: ReplicaAverager, stream: Any, layout: Any, task_weights: torch.Tensor,
                  log: Callable[[str], None], served_loss: Callable[[List[Any]], torch.Tensor],
                  train_outside: Callable[[Any], None], trained_steps: Callable[[], int],
                  replica_offsets: Callable[[], Mapping[str, float]]) -> Optional[ReplicaSignal]:
    """The replica's signal for ``hdet.signal`` (None: the window loss the loop passes, ``train`` or
    ``serving``). The probe signals score the rows reserved from the day being trained."""
    if signal not in SIGNALS:
        raise ValueError(f"config hdet.signal={signal!r}: choose one of {list(SIGNALS)}")
    if signal in ("train", "serving") or not stream.reserve_rows:  # rows may be reserved for other reasons
        return None
    eval_batch, train_batch = int(cfg.trainer.eval_batch_size), int(cfg.data.batch_size)
    cooldown_steps = int(h.anneal_probe.steps) if signal == "anneal_probe" else 0
    skip = cooldown_steps * train_batch  # the cooldown trains on the first reserved rows, the probe scores the rest
    mix = h.probe_mix
    dense_mix = 1.0 / layout.world_size if mix == "replicas" else float(mix)
    emb_mix = 1.0 / layout.replicas if mix == "replicas" else float(mix)
    score = lambda: weighted_task_mean(served_loss(stream.reserved_batches(eval_batch, trained_steps(), skip)),
                                       task_weights)
    probe = score if dense_mix == emb_mix == 1.0 else (lambda: mixed_replica_loss(averager, score, dense_mix, emb_mix))
    where = {"probe": "at the sync",
             "averaged_probe": f"at the average of its iterates over the last {h.averaged_probe.fraction:g} of the "
                               f"window ({h.averaged_probe.tensors} state)",
             "anneal_probe": f"after {cooldown_steps} cooldown steps (LR falling to 0) on the first {skip} of them, "
                             "then restored",
             "discounted_credit": f"at the replicas' average of their iterates over the last "
                                  f"{h.discounted_credit.fraction:g} of the window, moved along each group's sum of past "
                                  f"displacements (discount mu={h.discounted_credit.mu:g}) by the replica's offset"}[signal]
    mixed = "" if signal == "discounted_credit" else f" (as avg + c (own - avg): c = {dense_mix:g} dense, {emb_mix:g} embedding)"
    log(f"HDET signal {signal}: every replica scores the same {stream.reserve_rows - skip} rows reserved from each "
        f"training day, {where}{mixed}")
    if signal == "probe":
        return LastIterateProbe(probe)
    if signal == "averaged_probe":
        which = str(h.averaged_probe.tensors)
        if which not in ("dense", "all"):
            raise ValueError(f"config hdet.averaged_probe.tensors={which!r}: choose 'dense' or 'all'")
        tensors = list(averager.dense_tensors) + (list(averager.embedding_weights) if which == "all" else [])
        return AveragedIterateProbe(tensors, probe, float(h.averaged_probe.fraction))
    if signal == "discounted_credit":
        return _discounted_credit(h, controller.offset_width, optimizer, averager, score, replica_offsets)
    groups = optimizer.param_groups

    def cooldown_step(lr_scale: float, i: int) -> None:
        batch = stream.reserved_batches(train_batch, trained_steps())[i]
        lrs = [g["lr"] for g in groups]
        try:
            for g, lr in zip(groups, lrs):
                g["lr"] = lr * lr_scale
            optimizer.apply_hparams()  # the fused embedding kernels take an LR only when pushed
            train_outside(batch)
        finally:
            for g, lr in zip(groups, lrs):
                g["lr"] = lr
            optimizer.apply_hparams()

    return AnnealThenProbe(ModelState(model, optimizer.dense), cooldown_step, probe, cooldown_steps)


def _discounted_credit(h: Any, width: float, optimizer: Any, averager: ReplicaAverager, probe: Callable[[], float],
                       replica_offsets: Callable[[], Mapping[str, float]]) -> DiscountedCredit:
    """The signal ``discounted_credit`` over the optimizer's LR groups: the embedding group's tensors are
    this rank's shards (averaged over its replica group), a dense group's its parameters (averaged over
    the world)."""
    groups: Dict[str, List[torch.Tensor]] = {}
    for name, param_groups in optimizer.groups.items():
        if name == "embedding":
            groups[name] = list(averager.embedding_weights)
        else:
            groups[name] = [p.data for pg in param_groups for p in pg["params"]]

    def average(name: str, tensors: List[torch.Tensor]) -> bool:
        include = all_finite(tensors)
        average_(tensors, averager.replica_group if name == "embedding" else averager.world_group, include)
        return include

    return DiscountedCredit(groups, average, replica_offsets, probe, float(h.discounted_credit.mu), width,
                            float(h.discounted_credit.fraction))
