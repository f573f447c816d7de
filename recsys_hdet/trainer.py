"""The training job on one rank: build, train one pass, evaluate, checkpoint, summarize.

Read top to bottom: :meth:`Trainer.run` is the whole job. Rank 0 writes the artifacts of
product.md (``metrics.jsonl``, ``summary.json``, ``checkpoint/``); every rank trains.
Exit statuses: 0 completed, 3 diverged (see :data:`EXIT_DIVERGED`).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from recsys_hdet.components.checkpoint import CheckpointManager, load_model, save_model
from recsys_hdet.components.hparam_bindings import LossSettings, build_explored_hparams, set_temperature
from recsys_hdet.components.dataloader import (ORACLE_PREFIX, DatasetMeta, DenseNormalization, ParquetBatchStream,
                                              RowHoldout, model_inputs, split_for)
from recsys_hdet.components.faults import faults_from_env
from recsys_hdet.components.lr_scheduler import GroupLRScheduler, build_one_cycle
from recsys_hdet.components.metrics import (MetricLogger, oracle_metrics, peak_rss_mb, task_metrics, truncate_jsonl,
                                           write_json_atomic)
from recsys_hdet.components.train_state import LoopState, ModelState, RNGState
from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params
from recsys_hdet.components.replicas import ReplicaAverager, mixed_replica_loss
from recsys_hdet.components.rollback import Rollback, build_rollback
from recsys_hdet.components.tensorboard import build_tensorboard
from recsys_hdet.config import probe_rows
from recsys_hdet.distributed import ProcessGroups, shard_model
from recsys_hdet.hdet import HDETConfig, HDETOneCycleLR, ReplicaAxis
from recsys_hdet.hdet.warm_init import perturb_
from recsys_hdet.models.ranker import PARAM_GROUPS, build_model  # noqa: F401 (build_model: re-exported)

EXIT_DIVERGED = 3


class StepProfiler:
    """``trainer.profile.steps > 0``: rank 0 records steps [skip, skip + steps) with torch.profiler
    and writes ``profile.txt`` (operators by self CPU time) into the run directory. The profiler's
    own overhead slows those steps: not for throughput numbers."""

    def __init__(self, skip: int, steps: int, path: str) -> None:
        self.skip, self.steps, self.path = skip, steps, path
        self.prof: Optional[torch.profiler.profile] = None

    @classmethod
    def from_config(cls, spec, run_dir: str) -> Optional["StepProfiler"]:
        if not spec or int(spec.get("steps", 0)) <= 0:
            return None
        return cls(int(spec.get("skip", 20)), int(spec["steps"]), os.path.join(run_dir, "profile.txt"))

    def before_step(self, step: int) -> None:
        if step == self.skip:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.__enter__()
        elif step == self.skip + self.steps:
            self.close()

    def close(self) -> None:
        if self.prof is None:
            return
        self.prof.__exit__(None, None, None)
        table = self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        with open(self.path, "w") as f:
            f.write(f"torch.profiler, rank 0, steps {self.skip}..{self.skip + self.steps - 1}\n{table}\n")
        self.prof = None


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: str, pgs: ProcessGroups, job_start: float) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.pgs = pgs
        self.rank = pgs.layout.rank
        self.world = pgs.layout.world_size
        self.job_start = job_start
        self.tasks: List[str] = list(cfg.tasks)
        self.task_weights = torch.tensor([float(cfg.tasks[t].weight) for t in self.tasks])
        self.loss_settings = LossSettings(float(cfg.loss.label_smoothing))
        self.cfg_container = OmegaConf.to_container(cfg, resolve=True)  # recorded in each checkpoint's manifest

    def _weighted_mean(self, per_task: torch.Tensor) -> float:
        """The task-weighted mean of per-task losses: the objective per unit weight."""
        w = self.task_weights.double()
        return float((per_task.double() * w).sum() / w.sum())

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    # ------------------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        meta = DatasetMeta.load(cfg.data.root)
        train_days, eval_days = split_for(meta, cfg.data)
        # data.holdout: a fixed slice of every day never trained on; the held-out metrics score the
        # slice of the evaluated days (otherwise whole days are held out).
        self.holdout = RowHoldout.from_config(cfg.data)
        # Dense inputs standardized with the training days' statistics; a warm start keeps the
        # normalization its weights were trained with.
        warm = cfg.trainer.get("warm_start")
        self.normalization = (DenseNormalization.from_checkpoint(str(warm)) if warm else None) or \
            DenseNormalization.from_days(meta, train_days)
        train_stream = ParquetBatchStream(
            meta, train_days, int(cfg.data.batch_size), self.rank, self.world, int(cfg.seed),
            shuffle_within_day=bool(cfg.data.shuffle_within_day), reserve_rows=probe_rows(cfg),
            exposure=str(cfg.data.get("train_exposure", "all")), normalization=self.normalization,
            holdout=self.holdout,
        )
        total_steps = len(train_stream)
        train_rows = sum(train_stream.rows_in_day(d) for d in train_days)
        if total_steps < 1:
            raise ValueError(
                f"data: {train_rows} training rows cannot fill one global "
                f"batch of {train_stream.examples_per_step} (data.batch_size x trainer.nproc)"
            )
        if self.holdout is not None:
            self.log(f"data.holdout: {sum(int(meta.days[d]['rows']) for d in train_days) - train_rows} rows of the "
                     f"training days are held out (fraction {self.holdout.fraction}, seed {self.holdout.seed}); "
                     f"held-out metrics score that slice of {eval_days}")
        elif train_stream.exposure == "standard":
            all_rows = sum(int(meta.days[d]["rows"]) for d in train_days)
            self.log(f"data.train_exposure=standard: {all_rows - train_rows} random-exposure rows (is_rand = 1) of "
                     f"{all_rows} in the training days are not trained on")

        # Same seed on every rank: replicated state starts identical (DDP also broadcasts rank 0's).
        torch.manual_seed(int(cfg.seed))
        lrs = {g: float(cfg.optim.lr[g]) for g in PARAM_GROUPS}
        schedules = {g: build_one_cycle(cfg.optim.schedule, lrs[g], total_steps) for g in PARAM_GROUPS}
        model = shard_model(
            build_model(cfg, meta),
            self.pgs,
            fused_params(cfg.optim.embedding, schedules["embedding"](0)[0]),
            list(cfg.model.sharding_types),
        )
        set_temperature(model, float(cfg.model.attention_temperature))
        if cfg.trainer.get("warm_start"):
            info = load_model(model, str(cfg.trainer.warm_start))
            self.log(f"warm start from {cfg.trainer.warm_start} (step {info.get('steps')})")
        optimizer = GroupedOptimizer(model, cfg.optim.dense, {g: s(0)[0] for g, s in schedules.items()})
        averager = ReplicaAverager(model, self.pgs.replica, self.pgs.world)
        self.hdet = bool(cfg.hdet.enabled)
        self.serving_signal = self.hdet and str(cfg.hdet.get("signal", "train")) == "serving"
        # Each sharding group trains its own copy of the tables on its own data (no gradient
        # all-reduce across groups): averaging them keeps one model, as TorchRec's DMPCollection.sync().
        # The loop averages them every trainer.embedding_sync_every steps; under HDET with the
        # embedding LR spread, HDET's converge averages them at every sync instead (0 here), so each
        # replica follows its own LR for a window. With no spread (alpha = 0) the plain cadence stays:
        # alpha = 0 is the plain run in every layout.
        self.embedding_sync_every = int(cfg.trainer.embedding_sync_every)
        if self.hdet:
            if cfg.trainer.get("warm_start") and float(cfg.hdet.warm_init.nu) > 0:
                self._warm_noise(averager)
            scheduler = self._build_hdet_scheduler(model, optimizer, averager, total_steps, train_stream)
            override = cfg.hdet.get("embedding_sync_every")
            if override is not None:
                self.embedding_sync_every = int(override)
            elif scheduler.is_spread("embedding"):
                self.embedding_sync_every = 0
        else:
            scheduler = GroupLRScheduler(optimizer.groups, schedules, bool(cfg.optim.schedule.cycle_momentum))
            optimizer.apply_hparams()
        if not averager.has_embedding_replicas:
            self.embedding_sync_every = 0
        elif self.embedding_sync_every:
            self.log(f"{self.pgs.layout.replicas} embedding replicas (one per sharding group), averaged every "
                     f"{self.embedding_sync_every} steps")
        else:
            self.log(f"{self.pgs.layout.replicas} embedding replicas (one per sharding group), each with its own LR, "
                     f"averaged at every HDET sync ({cfg.hdet.sync_every} steps)")

        loop = LoopState(len(self.tasks))
        model_state = ModelState(model, optimizer.dense)
        rollback = build_rollback(cfg.trainer.rollback, model_state, averager, scheduler)
        checkpoints = self._build_checkpoints(model_state, scheduler, train_stream, loop, rollback, total_steps)
        resume_from = cfg.trainer.get("resume_from")
        branch_from = cfg.trainer.get("branch_from")
        if branch_from and not resume_from:
            # Another run's state at its step; this run's LR control takes over from that step.
            checkpoints.load(str(branch_from), pieces=("model", "loader", "rng", "loop"))
            scheduler.start_at(loop.step)
            optimizer.apply_hparams()
            self.log(f"branched from {branch_from} at step {loop.step} of {total_steps}")
        if resume_from:
            checkpoints.load(str(resume_from))
            # The fused embedding kernels take an LR only when it is pushed (the restored schedule
            # wrote it into their param_groups).
            optimizer.apply_hparams()
            if self.rank == 0:
                dropped = sum(truncate_jsonl(os.path.join(self.run_dir, f), loop.step)
                              for f in ("metrics.jsonl", "hdet.jsonl"))
                self.log(f"resumed from {resume_from} at step {loop.step} of {total_steps}"
                         + (f" ({dropped} log records the interrupted attempt wrote after it dropped)" if dropped else ""))
        self.log(
            f"training {total_steps - loop.step} steps x {train_stream.examples_per_step} examples on days "
            f"{train_days[0]}..{train_days[-1]}; layout {self.world} ranks = "
            f"{self.pgs.layout.sharding_group_size} per sharding group x {self.pgs.layout.replicas} replicas"
        )
        rollback.snapshot(loop.step)  # the state to come back to before the first check
        status, train_loss, steps, train_seconds = self._train(model, optimizer, scheduler, averager, train_stream,
                                                               total_steps, loop, checkpoints, rollback)
        if status == "completed":
            self._check_replicas_identical(averager)
        examples = steps * train_stream.examples_per_step
        summary: Dict[str, Any] = {
            "experiment": str(cfg.experiment_name),
            "status": status,
            "steps": steps,
            "examples": examples,
            "train_loss": train_loss,
            "examples_per_sec": examples / max(train_seconds, 1e-9),
            "train_seconds": train_seconds,
        }
        if rollback.enabled:
            summary["rollback"] = rollback.summary()
        if self.hdet_cost is not None:
            # Rank 0's time in HDET's hooks (gather, converge, controller, value updates).
            summary["hdet"] = {**self.hdet_cost, "fraction_of_train": self.hdet_cost["seconds"] / max(train_seconds, 1e-9)}
        if status == "completed":
            eval_metrics, oracle = self._evaluate(model, meta, eval_days)
            summary["eval"] = eval_metrics
            if oracle:
                summary["oracle"] = oracle
            if bool(cfg.trainer.checkpoint):
                save_model(model, os.path.join(self.run_dir, "checkpoint"),
                           {"steps": steps, "examples": examples, "experiment": str(cfg.experiment_name),
                            "dense_normalization": self.normalization.to_dict(), "model_inputs": model_inputs(meta)})
        if resume_from:
            summary["resumed_from_step"] = int(str(resume_from).rstrip("/").rsplit("-", 1)[-1])
        summary["periodic_checkpoints"] = {"every_steps": checkpoints.every_steps, "saved": checkpoints.saved,
                                           "seconds": checkpoints.seconds, "bytes": checkpoints.last_bytes,
                                           "state_bytes": checkpoints.state_bytes}
        rss = [0.0] * self.world
        dist.all_gather_object(rss, peak_rss_mb())
        summary["wall_seconds"] = time.time() - self.job_start
        summary["peak_rss_mb"] = max(rss)
        summary["peak_rss_mb_per_worker"] = rss
        if self.rank == 0:
            write_json_atomic(os.path.join(self.run_dir, "summary.json"), summary)
            self._print_summary(summary)
        # Only now: a job killed before summary.json was written resumes from them.
        checkpoints.remove_all()
        return EXIT_DIVERGED if status == "diverged" else 0

    def _build_checkpoints(self, model_state: ModelState, scheduler, stream: ParquetBatchStream,
                           loop: LoopState, rollback: Rollback, total_steps: int) -> CheckpointManager:
        """Every stateful piece of the job, registered for periodic checkpoints and resume."""
        spec = self.cfg.trainer.periodic_checkpoint
        log_every = int(self.cfg.trainer.log_every)
        # keep_at: on a divergence check (a multiple of log_every), where rollback's copy is taken too.
        keep_steps = [round(float(f) * total_steps / log_every) * log_every for f in spec.get("keep_at") or []]
        manager = CheckpointManager(os.path.join(self.run_dir, "checkpoint"), self.run_dir, int(spec.every_steps),
                                    int(spec.keep_last), self.rank, self.world, say=self.log,
                                    async_save=bool(spec.get("async_save", False)),
                                    keep_steps=tuple(s for s in keep_steps if 0 < s < total_steps))
        manager.register("model", model_state)
        manager.register("schedule", scheduler)  # the LR schedules' position, or the HDET engine's state
        manager.register("loader", stream)
        manager.register("rng", RNGState())
        manager.register("loop", loop)
        manager.register("rollback", rollback)
        return manager

    # ------------------------------------------------------------------------------------------
    def _build_hdet_scheduler(self, model, optimizer: GroupedOptimizer, averager: ReplicaAverager, total_steps: int,
                              stream: ParquetBatchStream):
        cfg, layout = self.cfg, self.pgs.layout
        h = cfg.hdet
        sched = cfg.optim.schedule
        if not averager.has_embedding_replicas:
            self.log("HDET: one sharding group, so no embedding replicas: the embedding group follows the base "
                     "schedule (use trainer.sharding_group_size < trainer.nproc to explore it)")

        probe = None
        if stream.reserve_rows and str(h.get("signal", "train")) == "probe":  # rows may be reserved for other reasons
            batch = int(cfg.trainer.eval_batch_size)
            mix = h.get("probe_mix", 1.0)
            dense_mix = 1.0 / layout.world_size if mix == "replicas" else float(mix)
            emb_mix = 1.0 / layout.replicas if mix == "replicas" else float(mix)
            score = lambda: self._probe_loss(model, stream.reserved_batches(batch))
            probe = score if dense_mix == emb_mix == 1.0 else (
                lambda: mixed_replica_loss(averager, score, dense_mix, emb_mix))
            self.log(f"HDET signal: every replica scores the same {stream.reserve_rows} rows reserved from each "
                     f"training day, at each sync (as avg + c (own - avg): c = {dense_mix:g} dense, "
                     f"{emb_mix:g} embedding)")

        def converge(excluded_ranks):
            bad_groups = {r // layout.sharding_group_size for r in excluded_ranks}
            averager.average_dense(include=layout.rank not in excluded_ranks)
            # Embedding replicas averaged by the loop at the plain cadence are averaged here only to
            # restore an excluded one.
            if averager.has_embedding_replicas and (self.embedding_sync_every == 0 or bad_groups):
                averager.average_embeddings(include=layout.sharding_group not in bad_groups)

        return HDETOneCycleLR(
            optimizer,
            max_lr={g: float(cfg.optim.lr[g]) for g in PARAM_GROUPS},
            total_steps=total_steps,
            pct_start=float(sched.pct_start),
            anneal_strategy=str(sched.anneal_strategy),
            cycle_momentum=bool(sched.cycle_momentum),
            base_momentum=float(sched.base_momentum),
            max_momentum=float(sched.max_momentum),
            div_factor=float(sched.div_factor),
            final_div_factor=float(sched.final_div_factor),
            three_phase=bool(sched.three_phase),
            hdet=HDETConfig.from_mapping(h),
            ceiling_multiple=float(h.ceiling_multiple),
            replica_axes={"embedding": ReplicaAxis.per_block(layout.world_size, layout.sharding_group_size)},
            converge=converge,
            state_is_finite=averager.local_state_is_finite,
            on_change=optimizer.apply_hparams,
            process_group=self.pgs.world,
            probe=probe,
            extra_hparams=build_explored_hparams(
                h.get("explore") or {},
                starts={"dropout": float(cfg.model.dropout), "weight_decay": float(cfg.optim.dense.weight_decay),
                        "temperature": float(cfg.model.attention_temperature),
                        "label_smoothing": float(cfg.loss.label_smoothing)},
                model=model, dense_groups=optimizer.groups, loss=self.loss_settings,
                axis=ReplicaAxis.per_rank(layout.world_size)),
        )

    @torch.no_grad()
    def _probe_loss(self, model, batches) -> float:
        """This replica's task-weighted loss on the probe rows, as it serves (eval mode: no dropout,
        no smoothing). Every rank scores the same rows, so replicas differ by their parameters only."""
        model.eval()
        total = torch.zeros(len(self.tasks), dtype=torch.float64)
        rows = 0
        for batch in batches:
            logits = model(batch.dense, batch.sparse)
            total += F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="none").sum(0).double()
            rows += batch.labels.shape[0]
        model.train()
        return self._weighted_mean(total / rows)

    def _check_replicas_identical(self, averager: ReplicaAverager) -> None:
        """After the pass's final average every replica must hold the same model: evaluation scores
        each rank's copy and the checkpoint keeps one. A difference is a wiring bug, never data."""
        differing = averager.differing_state()
        if differing:
            raise RuntimeError(f"the replicas' {' and '.join(differing)} state differs after the final average")
        if self.world > 1:
            self.log(f"final model bit-identical on every replica (dense over {self.world} ranks, embeddings over "
                     f"{self.pgs.layout.replicas} sharding group(s))")

    def _warm_noise(self, averager: ReplicaAverager) -> None:
        """Each replica perturbs the warm-started weights with its own noise (method section 4)."""
        layout, nu, seed = self.pgs.layout, float(self.cfg.hdet.warm_init.nu), int(self.cfg.hdet.seed)
        perturb_(averager.dense_tensors, nu, torch.Generator().manual_seed(seed * 100_003 + layout.rank))
        # Embedding replicas are the sharding groups; each rank perturbs the shards it holds.
        perturb_(averager.embedding_weights, nu, torch.Generator().manual_seed(seed * 100_003 + 50_000 + layout.rank))
        self.log(f"HDET warm init: every replica perturbed with nu={nu} per tensor")

    def _train(self, model, optimizer, scheduler, averager, stream, total_steps: int, loop: LoopState,
               checkpoints: CheckpointManager, rollback: Rollback):
        """One pass, from ``loop.step`` (0, or the step of the checkpoint a resumed run loaded).
        Returns (status, mean train loss per task and avg, steps, train seconds)."""
        cfg = self.cfg.trainer
        log_every = int(cfg.log_every)
        stop_at = cfg.get("stop_at_step")  # studies: end the pass early
        sync_every = self.embedding_sync_every  # the loop's embedding averaging (see run())
        rank0 = self.rank == 0
        logger = MetricLogger(os.path.join(self.run_dir, "metrics.jsonl"), total_steps, start_step=loop.step) \
            if rank0 else None
        hdet_log = open(os.path.join(self.run_dir, "hdet.jsonl"), "a" if loop.step else "w") \
            if self.hdet and rank0 else None
        # TensorBoard scalars of both records (rank 0); a resumed run continues its curves from its step.
        tensorboard = build_tensorboard(self.cfg, self.run_dir, self.rank, start_step=loop.step)
        profiler = StepProfiler.from_config(cfg.get("profile"), self.run_dir) if rank0 else None
        faults = faults_from_env(self.rank, self.run_dir)
        status = "completed"
        seconds_before = loop.train_seconds  # a resumed run's training time before this attempt
        checkpoint_seconds = 0.0
        model.train()
        start = window_start = time.monotonic()
        for batch in stream:
            if profiler is not None:
                profiler.before_step(loop.step)
            faults.before_step(loop.step + 1, optimizer)
            per_task, record = self._train_step(model, optimizer, scheduler, averager, batch, loop.step, total_steps,
                                                faults, loop)
            loop.step += 1
            loop.window_steps += 1
            if record is not None and rank0:
                self._log_sync(record, hdet_log, tensorboard)
            # Every replica non-finite at a sync: none to restore the others from (same on all ranks).
            nothing_to_restore = record is not None and len(record["excluded"]) == self.world
            if sync_every and (loop.step % sync_every == 0 or loop.step == total_steps):
                averager.average_embeddings()
            loop.add_step_losses(per_task.detach().double())
            if loop.step % log_every == 0 or loop.step in (total_steps, stop_at) or nothing_to_restore:
                now = time.monotonic()
                reason, metrics_record, interval = self._end_interval(loop, optimizer, stream.examples_per_step,
                                                                      now - window_start, nothing_to_restore)
                # A failed check is rolled back while rollbacks are left (same decision on every rank).
                event = rollback.undo(loop.step, reason) if reason else None
                loop.end_interval(interval, rolled_back=event is not None)
                if event is not None:
                    optimizer.apply_hparams()  # the cut LRs reach the fused kernels before the next step
                    metrics_record["rollback"] = event
                    self._log_rollback(event, hdet_log)
                elif not reason:
                    rollback.snapshot(loop.step)
                if logger is not None:
                    logger.log(metrics_record)
                    tensorboard.log_metrics(metrics_record)
                window_start = now
                if reason and event is None:
                    self.log(f"DIVERGED at step {loop.step}: {reason}; not rolled back: {rollback.why_not}. "
                             "Stopping; no evaluation or checkpoint.")
                    status = "diverged"
                    break
            if checkpoints.due(loop.step, total_steps):
                tick = time.monotonic()
                loop.train_seconds = seconds_before + (tick - start - checkpoint_seconds)
                checkpoints.save(loop.step, {"examples": loop.step * stream.examples_per_step,
                                             "config": self.cfg_container}, fail_write=faults.checkpoint_fails)
                checkpoint_seconds += time.monotonic() - tick
                window_start += time.monotonic() - tick  # the stall is not the interval's throughput
            if loop.step == stop_at:
                self.log(f"stopped at step {loop.step} (trainer.stop_at_step): no evaluation or final checkpoint")
                status = "stopped"
                break
        checkpoints.finish()  # an async checkpoint still being written is published
        seconds = seconds_before + time.monotonic() - start - checkpoint_seconds
        for closing in (profiler, logger, hdet_log, tensorboard):
            if closing is not None:
                closing.close()
        mean_total = loop.total / max(loop.step * self.world - loop.rolled_back_steps, 1)
        train_loss = {t: float(mean_total[i]) for i, t in enumerate(self.tasks)}
        train_loss["avg"] = self._weighted_mean(mean_total)
        self.hdet_cost = {"syncs": loop.hdet_syncs, "seconds": loop.hdet_seconds} if self.hdet else None
        return status, train_loss, loop.step, seconds

    def _train_step(self, model, optimizer, scheduler, averager, batch, step: int, total_steps: int, faults,
                    loop: LoopState):
        """Forward, backward, the optimizers, and the schedule's (or HDET's) step for training step
        ``step`` (0-based). Returns (per-task losses, HDET's sync record or None)."""
        serving_signal = self.serving_signal
        if serving_signal:
            # The loss as the model serves (no dropout, no smoothing) on the batch it is about to
            # train on: in one pass, a held-out estimate; what regularizers should be judged by.
            model.eval()
            with torch.no_grad():
                served = F.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.labels,
                                                            reduction="none").mean(0)
            model.train()
            signal = self._weighted_mean(served)
        logits = model(batch.dense, batch.sparse)
        ls = self.loss_settings.label_smoothing
        targets = batch.labels * (1 - ls) + 0.5 * ls if ls > 0 else batch.labels
        per_task = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(0)
        loss = (per_task * self.task_weights).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        faults.after_optimizer_step(step + 1, averager.dense_tensors)
        record = None
        if self.hdet:
            # Weighted task loss as the replica's signal (the training objective, per example).
            hdet_start = time.perf_counter()
            if not serving_signal:
                signal = self._weighted_mean(per_task.detach())
            record = scheduler.step(signal)
            loop.hdet_seconds += time.perf_counter() - hdet_start  # HDET's hook time (for benchmarks)
            loop.hdet_syncs += record is not None
        elif step + 1 < total_steps:  # the schedule has total_steps values, the last one is kept
            scheduler.step()
            optimizer.apply_hparams()
        return per_task, record

    def _log_sync(self, record: Dict[str, Any], hdet_log, tensorboard) -> None:
        hdet_log.write(json.dumps(record) + "\n")
        hdet_log.flush()
        tensorboard.log_hdet(record)
        bases = " ".join(f"{k.split('/')[-1] if k.startswith('lr/') else k}={v['next_base']:.3g}"
                         for k, v in record["hparams"].items())
        excluded = f"  excluded ranks {record['excluded']}" if record["excluded"] else ""
        print(f"HDET sync at step {record['step']}: base lr {bases}{excluded}", flush=True)

    def _log_rollback(self, event: Dict[str, Any], hdet_log) -> None:
        if hdet_log is not None:  # an event line: readers of sync records skip it (metrics.sync_records)
            hdet_log.write(json.dumps({**event, "event": "rollback"}) + "\n")
            hdet_log.flush()
        self.log(f"ROLLBACK {event['rollback']}/{event['max_rollbacks']} at step {event['step']}: {event['reason']}; "
                 f"restored the state of step {event['restored_step']}, learning rates now x{event['lr_scale']:g}")

    def _end_interval(self, loop: LoopState, optimizer, examples_per_step: int, seconds: float,
                      nothing_to_restore: bool):
        """The logging interval's record and divergence check, from one small all-reduce, so every
        rank takes the same decision. Returns (why the interval diverged or '', the metrics.jsonl
        record: rank 0 writes it, the interval's all-reduced sums for LoopState.end_interval)."""
        num_tasks = len(self.tasks)
        stats = torch.cat([loop.window, torch.tensor([float(loop.window_steps)], dtype=torch.float64)])
        dist.all_reduce(stats)
        good_steps = stats[-1] - stats[num_tasks]
        mean = stats[:num_tasks] / good_steps.clamp(min=1)
        avg = self._weighted_mean(mean)
        metrics_record = {
            "step": loop.step,
            "examples": loop.step * examples_per_step,
            "loss": {**{t: float(mean[i]) for i, t in enumerate(self.tasks)}, "avg": avg},
            "lr": optimizer.group_lrs(),
            "examples_per_sec": loop.window_steps * examples_per_step / max(seconds, 1e-9),
        }
        loop.window.zero_()
        loop.window_steps = 0
        # Under HDET a non-finite replica is excluded and restored at the next sync; the run
        # diverged only when no replica produced a finite loss in the interval.
        non_finite = (good_steps == 0) if self.hdet else (stats[num_tasks] > 0)
        diverge_loss = float(self.cfg.trainer.diverge_loss)
        if nothing_to_restore:
            return "every replica non-finite at the sync, none to restore the others from", metrics_record, stats
        if non_finite or not math.isfinite(avg):
            return "a non-finite loss", metrics_record, stats
        if avg > diverge_loss:
            return f"average loss {avg:.3g} above trainer.diverge_loss={diverge_loss}", metrics_record, stats
        return "", metrics_record, stats

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _evaluate(self, model, meta: DatasetMeta, eval_days: List[str]):
        """Scores the held-out days on all ranks; rank 0 computes the metrics."""
        extras = [ORACLE_PREFIX + t for t in self.tasks] if meta.has_oracle else []
        stream = ParquetBatchStream(
            meta, eval_days, int(self.cfg.trainer.eval_batch_size), self.rank, self.world,
            int(self.cfg.seed), shuffle_within_day=False, pad_last=True, extras=extras,
            normalization=self.normalization, holdout=self.holdout, part="holdout",
        )
        model.eval()
        probs, labels, oracle = [], [], []
        for batch in stream:
            p = torch.sigmoid(model(batch.dense, batch.sparse))
            probs.append(p[batch.mask])
            labels.append(batch.labels[batch.mask])
            if extras:
                oracle.append(torch.stack([batch.extras[c] for c in extras], dim=1)[batch.mask])
        model.train()
        local = (torch.cat(probs), torch.cat(labels), torch.cat(oracle) if oracle else None)
        gathered: Optional[List[Any]] = [None] * self.world if self.rank == 0 else None
        dist.gather_object(local, gathered, dst=0)
        if self.rank != 0:
            return {}, {}
        all_p = torch.cat([g[0] for g in gathered])
        all_y = torch.cat([g[1] for g in gathered])
        eval_metrics = {t: task_metrics(all_p[:, i], all_y[:, i]) for i, t in enumerate(self.tasks)}
        oracle_out = {}
        if extras:
            all_o = torch.cat([g[2] for g in gathered])
            oracle_out = {t: oracle_metrics(all_o[:, i], all_y[:, i]) for i, t in enumerate(self.tasks)}
        return eval_metrics, oracle_out

    def _print_summary(self, s: Dict[str, Any]) -> None:
        print(f"{s['experiment']}: {s['status']} after {s['steps']} steps, {s['examples']} examples, "
              f"{s['examples_per_sec']:.0f} ex/s, {s['wall_seconds']:.1f} s wall", flush=True)
        print(f"train loss: " + " ".join(f"{k}={v:.4f}" for k, v in s["train_loss"].items()))
        for task, m in s.get("eval", {}).items():
            o = s.get("oracle", {}).get(task)
            extra = f"  oracle NE {o['ne']:.4f} (gap {m['ne'] - o['ne']:+.4f})" if o else ""
            print(f"held-out {task:>12}: AUC {m['auc']:.4f}  NE {m['ne']:.4f}  logloss {m['logloss']:.4f}  "
                  f"calibration {m['calibration']:.3f}{extra}", flush=True)
