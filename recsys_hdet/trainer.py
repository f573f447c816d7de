"""The training job on one rank: build, train one pass, evaluate, checkpoint, summarize.

Read top to bottom: :meth:`Trainer.run` is the whole job. Rank 0 writes the artifacts of
product.md (``RunDir.METRICS``, ``RunDir.SUMMARY``, ``checkpoint/``); every rank trains.
Exit statuses: 0 completed, 3 diverged (see :attr:`ExitStatus.DIVERGED`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from recsys_hdet.config_schema import TrainConfig

from recsys_hdet.components.checkpoint import CheckpointManager, build_checkpoints
from recsys_hdet.components.model_checkpoint import load_model, save_model
from recsys_hdet.components.hparam_bindings import LossSettings, set_temperature
from recsys_hdet.components.job_handles import JobHandles
from recsys_hdet.components.interval_check import IntervalCheck
from data_tools.contract import oracle_column
from recsys_hdet.components.dataset import DatasetMeta, DenseNormalization, RowHoldout, model_inputs, split_for
from recsys_hdet.components.dataloader import ParquetBatchStream, TrainedPosition
from recsys_hdet.components.faults import faults_from_env
from recsys_hdet.components.profiler import StepProfiler
from recsys_hdet.components.lr_scheduler import build_schedules
from recsys_hdet.provenance import code_version
from recsys_hdet.components.metrics_log import MetricLogger, lr_trajectory, peak_rss_mb, print_summary, truncate_jsonl
from data_tools.fileio import write_json_atomic
from recsys_hdet.evaluation.scoring import predict_batches, score_held_out
from recsys_hdet.components.train_metrics import TrainMetrics, weighted_task_mean
from recsys_hdet.components.train_pipeline import TimedBatches, TrainStep
from recsys_hdet.components.train_state import LoopState, ModelState, RNGState, TrainClock
from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params, schedulefree_warmup
from recsys_hdet.components.replicas import PeriodicEmbeddingAveraging, ReplicaAverager
from recsys_hdet.components.rollback import Rollback, build_rollback
from recsys_hdet.components.tensorboard import build_tensorboard, log_final
from recsys_hdet.config import probe_rows
from recsys_hdet.hdet.form import hdet_form
from recsys_hdet.lr_control import COMMITMENT, LRControl, build_lr_control, recorded_commitment, run_cost
from recsys_hdet.distributed import ProcessGroups, shard_model
from recsys_hdet.models.ranker import PARAM_GROUPS, build_model  # noqa: F401 (build_model: re-exported)
from recsys_hdet.run_dir import RunDir
from data_tools.exit_status import ExitStatus



@dataclass
class Job:
    """Everything :meth:`Trainer.build` makes for one pass."""

    meta: DatasetMeta
    train_days: List[str]
    eval_days: List[str]
    stream: ParquetBatchStream
    total_steps: int
    model: torch.nn.Module
    train_step: TrainStep
    train_metrics: TrainMetrics
    optimizer: GroupedOptimizer
    averager: ReplicaAverager
    embedding_averaging: PeriodicEmbeddingAveraging
    lr_control: LRControl
    loop: LoopState
    rollback: Rollback
    checkpoints: CheckpointManager
    resume_from: Optional[str]
    data_wait: Optional[TimedBatches] = None  # set by train(): the time the step waited for data
    data_wait_fraction: float = 0.0


class Trainer:
    def __init__(self, cfg: TrainConfig, record: Dict[str, Any], run_dir: str, pgs: ProcessGroups,
                 job_start: float) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.files = RunDir(run_dir)
        self.pgs = pgs
        self.rank = pgs.layout.rank
        self.world = pgs.layout.world_size
        self.job_start = job_start
        self.tasks: List[str] = list(cfg.tasks)
        self.task_weights = torch.tensor([float(cfg.tasks[t].weight) for t in self.tasks])
        self.loss_settings = LossSettings(float(cfg.loss.label_smoothing))
        self.cfg_container = record  # recorded in each checkpoint's manifest

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    # ------------------------------------------------------------------------------------------
    def run(self) -> int:
        job = self.build()
        status, train_loss, train_seconds = self.train(job)
        summary = self.summarize(job, status, train_loss, train_seconds)
        if status == "completed":
            summary.update(self.evaluate_and_save(job))
        self.finish(job, summary)
        return ExitStatus.DIVERGED if status == "diverged" else 0

    # ------------------------------------------------------------------------------------------
    def build(self) -> Job:
        """Data, model, optimizers, LR control, rollback and checkpoints; a resumed or branched job
        loads its state here."""
        cfg = self.cfg
        meta = DatasetMeta.load(cfg.data.root)
        train_days, eval_days = split_for(meta, cfg.data)
        # data.holdout: a fixed slice of every day never trained on; the held-out metrics score the
        # slice of the evaluated days (otherwise whole days are held out).
        self.holdout = RowHoldout.from_config(cfg.data)
        # Dense inputs standardized with the training days' statistics; a warm start keeps the
        # normalization its weights were trained with.
        warm = cfg.trainer.warm_start
        self.normalization = (DenseNormalization.from_checkpoint(str(warm)) if warm else None) or \
            DenseNormalization.from_days(meta, train_days)
        stream = ParquetBatchStream(
            meta, train_days, int(cfg.data.batch_size), self.rank, self.world, int(cfg.seed),
            shuffle_within_day=bool(cfg.data.shuffle_within_day), reserve_rows=probe_rows(cfg),
            exposure=str(cfg.data.train_exposure), normalization=self.normalization,
            holdout=self.holdout, read=str(cfg.data.read),
        )
        total_steps = len(stream)
        train_rows = sum(stream.rows_in_day(d) for d in train_days)
        if total_steps < 1:  # checked before the workers start too (job_inputs.check_days_and_steps)
            raise ValueError(f"data: {train_rows} training rows cannot fill one global batch of "
                             f"{stream.examples_per_step} (data.batch_size x trainer.nproc)")
        if self.holdout is not None:
            self.log(f"data.holdout: {sum(int(meta.days[d]['rows']) for d in train_days) - train_rows} rows of the "
                     f"training days are held out (fraction {self.holdout.fraction}, seed {self.holdout.seed}); "
                     f"held-out metrics score that slice of {eval_days}")
        elif stream.exposure == "standard":
            all_rows = sum(int(meta.days[d]["rows"]) for d in train_days)
            self.log(f"data.train_exposure=standard: {all_rows - train_rows} random-exposure rows (is_rand = 1) of "
                     f"{all_rows} in the training days are not trained on")

        # Same seed on every rank: replicated state starts identical (DDP also broadcasts rank 0's).
        torch.manual_seed(int(cfg.seed))
        first_lrs = {g: schedule(0)[0] for g, schedule in build_schedules(cfg.optim, PARAM_GROUPS, total_steps).items()}
        model = shard_model(
            build_model(cfg, meta, training={"task_weights": self.task_weights, "loss_settings": self.loss_settings}),
            self.pgs,
            fused_params(cfg.optim.embedding, first_lrs["embedding"]),
            list(cfg.model.sharding_types),
            str(cfg.trainer.dense_gradients),
        )
        set_temperature(model, float(cfg.model.attention_temperature))
        if warm:
            info = load_model(model, str(warm))
            self.log(f"warm start from {warm} (step {info.get('steps')})")
        optimizer = GroupedOptimizer(model, cfg.optim.dense, first_lrs,
                                     warmup_steps=schedulefree_warmup(cfg.optim, total_steps))
        averager = ReplicaAverager(model, self.pgs.replica, self.pgs.world)
        # Each sharding group trains its own copy of the tables on its own data (no gradient
        # all-reduce across groups): averaging them keeps one model, as TorchRec's DMPCollection.sync(),
        # every trainer.embedding_sync_every steps (the LR control may take that over: HDET does).
        train_step = TrainStep(model, optimizer, self.pgs.device, str(cfg.trainer.train_pipeline))
        handles = JobHandles(model=model, optimizer=optimizer, averager=averager, stream=stream, layout=self.pgs.layout,
                             process_group=self.pgs.world, sharding_group=self.pgs.sharding,
                             dense_gradients=model.dense_gradient_reduction, task_weights=self.task_weights,
                             loss_settings=self.loss_settings, run_dir=self.run_dir, log=self.log,
                             served_loss=partial(self._served_loss, train_step),
                             train_outside=partial(train_step.train_outside, optimizer=optimizer))
        resume_from = self.cfg_container["trainer"].get("resume_from")  # set by the job (api.train), not a config key
        branch_from = cfg.trainer.branch_from
        lr_control = build_lr_control(
            cfg, handles, total_steps=total_steps,
            plain_embedding_sync_every=int(cfg.trainer.embedding_sync_every) if averager.has_embedding_replicas else 0,
            commitment=recorded_commitment(resume_from or branch_from))
        model.module.serving_loss_wanted = lr_control.wants_serving_loss  # the TrainingRanker under DMP
        if lr_control.embedding_sync_every:
            self.log(f"{self.pgs.layout.replicas} embedding replicas (one per sharding group), averaged every "
                     f"{lr_control.embedding_sync_every} steps")
        elif averager.has_embedding_replicas and hdet_form(cfg.hdet) == "controller":
            self.log(f"{self.pgs.layout.replicas} embedding replicas (one per sharding group), each with its own LR, "
                     f"averaged at every HDET sync ({cfg.hdet.sync_every} steps)")

        loop = LoopState(len(self.tasks))
        model_state = ModelState(model, optimizer.dense)
        rollback = build_rollback(cfg.trainer.rollback, model_state, averager, lr_control)
        # Every stateful piece of the job, by name, for periodic checkpoints and resume: the LR control (the
        # schedules' position, or the HDET engine's state); the loader after the batches trained on, not
        # the ones read ahead.
        checkpoints = build_checkpoints(
            cfg.trainer, self.run_dir, total_steps, self.rank, self.world, self.log,
            {"model": model_state, "schedule": lr_control, "loader": TrainedPosition(stream, lambda: loop.step),
             "rng": RNGState(), "loop": loop, "rollback": rollback})
        if branch_from and not resume_from:
            # Another run's state at its step; this run's LR control takes over from that step.
            checkpoints.load(str(branch_from), pieces=("model", "loader", "rng", "loop"))
            lr_control.start_at(loop.step)
            optimizer.apply_hparams()
            self.log(f"branched from {branch_from} at step {loop.step} of {total_steps}")
        if resume_from:
            checkpoints.load(str(resume_from))
            # The fused embedding kernels take an LR only when it is pushed (the restored schedule
            # wrote it into their param_groups).
            optimizer.apply_hparams()
            if self.rank == 0:
                dropped = sum(truncate_jsonl(self.files.path(f), loop.step) for f in (RunDir.METRICS, RunDir.HDET))
                self.log(f"resumed from {resume_from} at step {loop.step} of {total_steps}"
                         + (f" ({dropped} log records the interrupted attempt wrote after it dropped)" if dropped else ""))
        self.log(
            f"training {total_steps - loop.step} steps x {stream.examples_per_step} examples on days "
            f"{train_days[0]}..{train_days[-1]}; layout {self.world} ranks = "
            f"{self.pgs.layout.sharding_group_size} per sharding group x {self.pgs.layout.replicas} replicas"
        )
        # NE, calibration and AUC per task over each metrics interval (trainer.metrics_every, else each logging
        # interval), reduced over the ranks.
        train_metrics = TrainMetrics(self.tasks, int(cfg.data.batch_size), self.world, self.rank,
                                     int(cfg.trainer.metrics_every or cfg.trainer.log_every), self.pgs.device,
                                     self.pgs.world)
        embedding_averaging = PeriodicEmbeddingAveraging(averager, lambda: lr_control.embedding_sync_every, total_steps)
        return Job(meta, train_days, eval_days, stream, total_steps, model, train_step, train_metrics, optimizer,
                   averager, embedding_averaging, lr_control, loop, rollback, checkpoints, resume_from)

    # ------------------------------------------------------------------------------------------
    def train(self, job: Job):
        """One pass, from ``loop.step`` (0, or the step of the checkpoint a resumed run loaded).
        Returns (status, mean train loss per task and avg, train seconds)."""
        cfg, loop, lr_control = self.cfg.trainer, job.loop, job.lr_control
        total_steps, log_every, stop_at = job.total_steps, int(cfg.log_every), cfg.stop_at_step
        logger = MetricLogger(self.files.path(RunDir.METRICS), total_steps, start_step=loop.step) \
            if self.rank == 0 else None
        # TensorBoard scalars (rank 0); a resumed run continues its curves from its step.
        tensorboard = build_tensorboard(self.cfg, self.run_dir, self.rank, start_step=loop.step)
        lr_control.open_logs(loop.step, tensorboard)
        profiler = StepProfiler.from_config(cfg.profile, self.run_dir) if self.rank == 0 else None
        faults = faults_from_env(self.rank, self.run_dir)
        status, clock = "completed", TrainClock(loop.train_seconds)
        job.rollback.snapshot(loop.step)  # the state to come back to before the first check
        job.model.train()
        batches = job.data_wait = TimedBatches(iter(job.stream))
        attempt_start = loop.train_seconds
        intervals = IntervalCheck(self.tasks, self.task_weights, self.rank, cfg, total_steps,
                                  job.stream.examples_per_step, job.train_metrics)
        while loop.step < total_steps:
            if profiler is not None:
                profiler.before_step(loop.step)
            faults.before_step(loop.step + 1, job.optimizer)
            per_task, served, predictions, labels = job.train_step.progress(batches)  # forward, backward, optimizers
            job.train_metrics.update(predictions, labels)
            faults.after_optimizer_step(loop.step + 1, job.averager.dense_tensors)
            lr_control.step(loop.step, per_task, served)
            loop.step += 1
            loop.window_steps += 1
            job.embedding_averaging.after_step(loop.step)  # at its cadence (none where the LR control averages)
            loop.add_step_losses(per_task.double())
            forced = lr_control.failed_check()
            if loop.step % log_every == 0 or loop.step in (total_steps, stop_at) or forced:
                reason, record, interval = intervals.end(loop, clock.interval(), forced, job.optimizer.group_lrs(),
                                                         lr_control.tolerates_non_finite_replicas)
                # A failed check is rolled back while rollbacks are left (same decision on every rank).
                event = job.rollback.undo(loop.step, reason) if reason else None
                loop.end_interval(interval, rolled_back=event is not None)
                if event is not None:
                    record["rollback"] = event
                    lr_control.log_event(event)
                    self.log(f"ROLLBACK {event['rollback']}/{event['max_rollbacks']} at step {event['step']}: "
                             f"{event['reason']}; restored the state of step {event['restored_step']}, learning "
                             f"rates now x{event['lr_scale']:g}")
                elif not reason:
                    job.rollback.snapshot(loop.step)
                if logger is not None:
                    logger.log(record)
                    tensorboard.log_metrics(record)
                if reason and event is None:
                    self.log(f"DIVERGED at step {loop.step}: {reason}; not rolled back: {job.rollback.why_not}. "
                             "Stopping; no evaluation or checkpoint.")
                    status = "diverged"
                    break
            if job.checkpoints.due(loop.step, total_steps):
                with clock.paused():  # the stall is neither training time nor the interval's throughput
                    loop.train_seconds = clock.seconds()
                    job.checkpoints.save(loop.step, {"examples": loop.step * job.stream.examples_per_step,
                                                     "config": self.cfg_container,
                                                     COMMITMENT: job.lr_control.commitment},
                                         fail_write=faults.checkpoint_fails)
            if loop.step == stop_at:
                self.log(f"stopped at step {loop.step} (trainer.stop_at_step): no evaluation or final checkpoint")
                status = "stopped"
                break
        job.checkpoints.finish()  # an async checkpoint still being written is published
        seconds = clock.seconds()
        job.data_wait_fraction = batches.seconds / max(seconds - attempt_start, 1e-9)  # of this attempt's training
        for closing in (profiler, logger, lr_control, tensorboard):
            if closing is not None:
                closing.close()
        mean_total = loop.total / max(loop.step * self.world - loop.rolled_back_steps, 1)
        train_loss = {t: float(mean_total[i]) for i, t in enumerate(self.tasks)}
        train_loss["avg"] = weighted_task_mean(mean_total, self.task_weights)
        return status, train_loss, seconds

    def _served_loss(self, train_step: TrainStep, batches) -> torch.Tensor:
        """This replica's per-task mean loss on ``batches`` as it serves (eval mode: no dropout, no
        smoothing), outside the training step."""
        with train_step.model_detached() as model:
            scored = predict_batches(model.module.logits, batches, self.pgs.device)
        return F.binary_cross_entropy_with_logits(scored["logits"], scored["labels"], reduction="none").double().mean(0)

    # ------------------------------------------------------------------------------------------
    def summarize(self, job: Job, status: str, train_loss: Dict[str, float], train_seconds: float) -> Dict[str, Any]:
        examples = job.loop.step * job.stream.examples_per_step
        summary: Dict[str, Any] = {
            "experiment": str(self.cfg.experiment_name),
            "status": status,
            "steps": job.loop.step,
            "total_steps": job.total_steps,  # the pass's planned steps (steps < total_steps: it stopped early)
            "examples": examples,
            "train_loss": train_loss,
            "examples_per_sec": examples / max(train_seconds, 1e-9),
            "train_seconds": train_seconds,
            # The training thread waiting for the next batch (rank 0), over this attempt's training time.
            "data_wait_seconds": job.data_wait.seconds if job.data_wait is not None else 0.0,
            "data_wait_fraction": job.data_wait_fraction,
        }
        if job.rollback.enabled:
            summary["rollback"] = job.rollback.summary()
        control = job.lr_control.summary(train_seconds)
        # Each group's max LR as trained (a form's committed rate, else the configured one) beside the configured
        # one, its LR at every logged step and the last one (rank 0).
        configured = {g: float(self.cfg.optim.lr[g]) for g in PARAM_GROUPS}
        commitment = job.lr_control.commitment
        trajectory = lr_trajectory(self.files.metrics(), commitment["committed"] if commitment else configured) \
            if self.rank == 0 else {}
        summary["lr"] = {**trajectory, "configured_max_lr": configured, **control.pop("lr", {})}
        summary.update(control)
        # What the run cost: the pass, and what a form ran before it to commit its rates (the range test's sweep,
        # counted once however often the run was resumed).
        summary["cost"] = run_cost(job.loop.step, train_seconds, commitment)
        return summary

    def evaluate_and_save(self, job: Job) -> Dict[str, Any]:
        """After a completed pass: the held-out metrics and the final checkpoint."""
        # After the pass's final average every replica must hold the same model: evaluation scores each
        # rank's copy and the checkpoint keeps one. A difference is a wiring bug, never data.
        differing = job.averager.differing_state()
        if differing:
            raise RuntimeError(f"the replicas' {' and '.join(differing)} state differs after the final average")
        if self.world > 1:
            self.log(f"final model bit-identical on every replica (dense over {self.world} ranks, embeddings over "
                     f"{self.pgs.layout.replicas} sharding group(s))")
        with job.optimizer.eval_weights():  # Schedule-Free's averaged weights; the live ones otherwise
            stream = ParquetBatchStream(
                job.meta, job.eval_days, int(self.cfg.trainer.eval_batch_size), self.rank, self.world, int(self.cfg.seed),
                shuffle_within_day=False, pad_last=True, extras=[oracle_column(t) for t in self.tasks] if job.meta.has_oracle
                else [], normalization=self.normalization, holdout=self.holdout, part="holdout")
            with job.train_step.model_detached() as model:
                eval_metrics, oracle = score_held_out(model.module.logits, stream, self.tasks, self.pgs.device)
            out: Dict[str, Any] = {"eval": eval_metrics, **({"oracle": oracle} if oracle else {})}
            if bool(self.cfg.trainer.checkpoint):
                save_model(job.model, self.files.path(RunDir.CHECKPOINT),
                           {"steps": job.loop.step, "examples": job.loop.step * job.stream.examples_per_step,
                            "experiment": str(self.cfg.experiment_name),
                            "dense_normalization": self.normalization.to_dict(), "model_inputs": model_inputs(job.meta),
                            COMMITMENT: job.lr_control.commitment})
        return out

    def finish(self, job: Job, summary: Dict[str, Any]) -> None:
        """Writes RunDir.SUMMARY (rank 0), then removes the periodic checkpoints."""
        if job.resume_from:
            summary["resumed_from_step"] = int(str(job.resume_from).rstrip("/").rsplit("-", 1)[-1])
        ckpt = job.checkpoints
        summary["periodic_checkpoints"] = {"every_steps": ckpt.every_steps, "saved": ckpt.saved,
                                           "seconds": ckpt.seconds, "bytes": ckpt.last_bytes,
                                           "state_bytes": ckpt.state_bytes}
        rss = [0.0] * self.world
        dist.all_gather_object(rss, peak_rss_mb())
        summary["wall_seconds"] = time.time() - self.job_start
        summary["peak_rss_mb"] = max(rss)
        summary["peak_rss_mb_per_worker"] = rss
        # The float results depend on it (intra-op reductions split by thread): a run reproduces bit for
        # bit only at the same threads per worker (studies' --verify pins it).
        summary["threads_per_worker"] = torch.get_num_threads()
        summary["code"] = code_version()  # the commit it trained at (an export's manifest names it)
        if self.rank == 0:
            write_json_atomic(self.files.path(RunDir.SUMMARY), summary)
            log_final(self.cfg, self.run_dir, self.rank, summary)  # held-out metrics, hparams as trained (TensorBoard)
            print_summary(summary)
        # Only now: a job killed before RunDir.SUMMARY was written resumes from them.
        ckpt.remove_all()
