"""The typed config schema: one dataclass per config group, registered with Hydra's ConfigStore.

The YAML files under ``conf/`` are presets over these classes (``conf/config.yaml`` lists
``train_schema`` first in its defaults; ``evaluate.yaml`` and ``retrain.yaml`` list theirs), so
Hydra refuses at composition, before any worker starts and before a run directory exists:

- a key no class declares (``+hdet.alpah=0.1``, a typo in a preset),
- a value of the wrong type (``trainer.nproc=abc``),
- a choice outside its enum (``optim.dense.type=sgd`` names the allowed values).

Checks of one group's values (ranges, a choice this machine cannot run) live in the classes'
``__post_init__``, which runs when :func:`check` instantiates the composed config; checks that span
groups or need the data stay in :mod:`recsys_hdet.config`.

The checks and the choices (``StrEnum``) are :mod:`recsys_hdet.config_values`'; the ``optim`` group's schema is
:mod:`recsys_hdet.optim_schema`'s, the ``hdet`` group's each form's own (:mod:`recsys_hdet.hdet.config`); the
evaluation command's and the retraining job's schemas :mod:`recsys_hdet.job_schema`'s.

Limits: OmegaConf has no ``Literal``; ``tasks`` is a mapping whose keys are the user's task names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from recsys_hdet.config_values import (DayRead, DenseGradients, ShardingType, TrainExposure, TrainPipeline, at_least,
                                       fraction, is_number, positive, require)
from recsys_hdet.hdet.config import FORM_SCHEMAS, SCHEMA_OF_FORM
from recsys_hdet.hdet.form import HDETForm, hdet_form
from recsys_hdet.job_schema import EvaluateConfig, ExportConfig, PredictConfig, RetrainConfig, TrackingConfig
from recsys_hdet.optim_schema import OptimConfig


# ----------------------------------------------------------------------------------------------
# Training: conf/config.yaml and its groups


@dataclass
class HoldoutConfig:
    """Rows never trained on: a fixed random slice of every day (by file position, drawn per day from ``seed``)."""
    fraction: float = 0.0   # > 0: held-out metrics score this slice of the last eval_days days, which are then
    seed: int = 0           # training days too (their other rows)

    def __post_init__(self) -> None:
        fraction("data.holdout.fraction", self.fraction)


@dataclass
class DataConfig:
    name: str = MISSING
    root: str = MISSING
    generator: Optional[Dict[str, Any]] = None   # the synthetic set's parameters; null for a data set converted
                                                 # from real logs (data_tools.convert): never generated
    # Impressions an id needs for an embedding row of its own, per id feature (user_id, video_id, author_id,
    # music_id, tab, tag; default 1; rarer ids share the out-of-vocabulary row). The generator's only:
    # convert's min_count={NAME:N} sets a real data set's.
    min_count: Dict[str, int] = field(default_factory=dict)
    eval_days: int = 1                           # held-out days after the training days
    skip_days: int = 0                           # days at the start not trained on (e.g. a warm start's pre-training)
    train_days: Optional[int] = None             # null: every day before the held-out ones
    until: Optional[str] = None                  # a day YYYYMMDD: the data set as it was that day (later days ignored)
    holdout: HoldoutConfig = field(default_factory=HoldoutConfig)
    # all: every impression; standard: drop the random-exposure ones (is_rand = 1), e.g. when the random log
    # (log_random_*) was converted in too (docs/data.md)
    train_exposure: TrainExposure = TrainExposure.all
    # Rows at the end of each training day never trained on (null: hdet.probe_rows with a probe signal, else 0);
    # set, plain and HDET runs train on the same rows.
    reserve_rows: Optional[int] = None
    batch_size: int = 512                        # per rank
    shuffle_within_day: bool = True
    # whole_day: every rank decodes the whole day; own_row_groups: each rank reads only the row groups dealt
    # to it (layout 2, docs/data.md)
    read: DayRead = DayRead.whole_day

    def __post_init__(self) -> None:
        at_least("data.eval_days", self.eval_days, 1)
        at_least("data.batch_size", self.batch_size, 1)
        at_least("data.skip_days", self.skip_days, 0)
        if self.train_days is not None:
            at_least("data.train_days", self.train_days, 1)
        if self.reserve_rows is not None:
            at_least("data.reserve_rows", self.reserve_rows, 0)
        require(self.until is None or (len(str(self.until)) == 8 and str(self.until).isdigit()), "data.until",
                self.until, "must be null or a day YYYYMMDD")


@dataclass
class ModelConfig:
    embedding_dim: int = 16
    attention_heads: int = 2
    trunk: List[int] = field(default_factory=lambda: [256, 128])
    tower: List[int] = field(default_factory=lambda: [64])
    dropout: float = 0.0
    attention_temperature: float = 1.0   # divides the attention logits (1.0: standard attention)
    # torch.compile the dense modules (attention block, trunk, towers); compile time is paid at the first steps
    # of every process (BENCHMARKS.md)
    compile_dense: bool = False
    # Sharding types the planner may choose from. On CPU, table_wise and column_wise train with the fused
    # embedding optimizer (the planner's data_parallel tables would bypass it). table_wise only by default: our
    # dim-16 tables gain nothing from column splits, which only add all-to-all traffic, and with column_wise
    # allowed the planner's choice varied between runs (BENCHMARKS.md, Profiling); add column_wise for tables
    # too big for one rank.
    sharding_types: List[ShardingType] = field(default_factory=lambda: [ShardingType.table_wise])

    def __post_init__(self) -> None:
        at_least("model.embedding_dim", self.embedding_dim, 1)
        at_least("model.attention_heads", self.attention_heads, 1)
        require(self.embedding_dim % self.attention_heads == 0, "model.attention_heads", self.attention_heads,
                f"must divide model.embedding_dim={self.embedding_dim}")
        fraction("model.dropout", self.dropout)
        positive("model.attention_temperature", self.attention_temperature)
        require(len(self.sharding_types) >= 1, "model.sharding_types", self.sharding_types, "list at least one")


@dataclass
class RollbackConfig:
    """A failed divergence check restores the last state that passed one, instead of ending the run."""
    max_rollbacks: int = 3    # then the next failed check ends the run as "diverged" (exit 3); 0: off
    lr_factor: float = 0.5    # at each rollback every learning rate (schedule or HDET base) is multiplied by this

    def __post_init__(self) -> None:
        at_least("trainer.rollback.max_rollbacks", self.max_rollbacks, 0)
        require(is_number(self.lr_factor) and 0 < self.lr_factor <= 1, "trainer.rollback.lr_factor", self.lr_factor,
                "must be a number in (0, 1]")


@dataclass
class CollapseConfig:
    """A divergence check also fails when the model collapsed to the base-rate predictor: every task's training
    NE over the interval >= ``ne`` (null: no such check), after an interval whose mean NE was below
    ``armed_below`` (a model that learned something and lost it; not the first steps)."""
    ne: Optional[float] = 0.999
    armed_below: float = 0.99

    def __post_init__(self) -> None:
        if self.ne is not None:
            positive("trainer.collapse.ne", self.ne)
            require(is_number(self.armed_below) and 0 < self.armed_below < self.ne, "trainer.collapse.armed_below",
                    self.armed_below, f"must be in (0, trainer.collapse.ne={self.ne})")


@dataclass
class PeriodicCheckpointConfig:
    """Resumable checkpoints in checkpoint/step-<N>/ while the run trains (removed at its end)."""
    every_steps: int = 250    # 0: off
    keep_last: int = 2        # older ones are deleted once a newer one is complete
    async_save: bool = False  # true: write in a background thread (DCP async_save), stall only for the copy
    # Fractions of the pass (e.g. [0.25, 0.5, 0.75]) whose checkpoints are also written and kept after the run
    # (at the nearest multiple of log_every), to branch runs from.
    keep_at: List[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        at_least("trainer.periodic_checkpoint.every_steps", self.every_steps, 0)
        at_least("trainer.periodic_checkpoint.keep_last", self.keep_last, 1)
        require(all(is_number(f) and 0 < f < 1 for f in self.keep_at), "trainer.periodic_checkpoint.keep_at",
                list(self.keep_at), "must be a list of fractions of the pass in (0, 1)")


@dataclass
class ProfileConfig:
    """torch.profiler on rank 0 for a few steps -> profile.txt in the run directory."""
    steps: int = 0    # 0: off
    skip: int = 20    # steps to run before recording (warm-up)

    def __post_init__(self) -> None:
        at_least("trainer.profile.steps", self.steps, 0)
        at_least("trainer.profile.skip", self.skip, 0)


@dataclass
class TrainerConfig:
    nproc: int = 4                    # local workers when not under torchrun (world size)
    sharding_group_size: int = 4      # ranks per embedding sharding group; must divide the world size
    embedding_sync_every: int = 1     # with several sharding groups: average the embedding replicas every N steps
    train_pipeline: TrainPipeline = TrainPipeline.sparse_dist   # TorchRec's train pipeline (TrainPipeline's members)
    # allreduce: DDP averages every step's dense gradient over the world; local: none (each rank's dense replica
    # follows its own gradient, local SGD) and the HDET controller's syncs average the replicas (needs
    # hdet=controller; refused under hdet=enabled, whose pass trains plain; docs/results/hdet_history.md)
    dense_gradients: DenseGradients = DenseGradients.allreduce
    threads_per_worker: Optional[int] = None   # null: the cores this job may use (CPU affinity) / local workers, >= 1
    log_every: int = 25               # steps per RunDir.METRICS record (and divergence check)
    # Steps per computation of the training NE, calibration and AUC (a collective over the interval's rows, the
    # costliest part of a record): null, every record; a multiple of log_every records the loss every log_every
    # steps and these every metrics_every (an LR range test logs its loss every step: python -m recsys_hdet.lr_find).
    # Between two computations the collapse check reads the interval's loss over its positive rate's entropy.
    metrics_every: Optional[int] = None
    diverge_loss: float = 2.0         # a check fails when the interval's avg task loss exceeds this (or none is finite)
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    eval_batch_size: int = 2048
    checkpoint: bool = True           # write checkpoint/ (the final model) at the end
    periodic_checkpoint: PeriodicCheckpointConfig = field(default_factory=PeriodicCheckpointConfig)
    # auto: continue from the newest complete checkpoint/step-<N> in the run directory; never: refuse a run
    # directory that holds a run; or the path of a step-<N> checkpoint
    resume: str = "auto"
    collective_timeout_s: float = 300.0   # a collective that waits longer for a peer fails (a dead or hung worker)
    max_restarts: int = 0             # without torchrun: relaunch the workers this many times after one dies
                                      # (resume=auto)
    tensorboard: bool = True          # rank 0 writes RunDir.METRICS's and hdet.jsonl's figures as TensorBoard scalars
                                      # into tensorboard/
    # A checkpoint/step-<N> of another run to continue its pass from (model, optimizer state, data position, RNG,
    # loop) with this config's LRs and HDET settings (studies: what a changed LR does from a point of a pass);
    # data, model, layout and seed must match.
    branch_from: Optional[str] = None
    # End the pass early at this step (status "stopped": no evaluation, no final checkpoint).
    stop_at_step: Optional[int] = None
    warm_start: Optional[str] = None      # path to a checkpoint/ directory to start from
    warm_start_preset: Optional[str] = None   # experiment that produces warm_start when missing (trained on first use)
    warm_start_overrides: List[str] = field(default_factory=list)   # extra Hydra overrides for that run,
                                                                    # e.g. ['data=tiny','trainer.nproc=2']
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def __post_init__(self) -> None:
        for key in ("nproc", "sharding_group_size", "embedding_sync_every", "log_every", "eval_batch_size"):
            at_least(f"trainer.{key}", getattr(self, key), 1)
        require(self.nproc % self.sharding_group_size == 0, "trainer.sharding_group_size", self.sharding_group_size,
                f"must divide trainer.nproc={self.nproc}")
        if self.threads_per_worker is not None:
            at_least("trainer.threads_per_worker", self.threads_per_worker, 1)
        if self.metrics_every is not None:
            require(is_number(self.metrics_every) and self.metrics_every >= 1
                    and self.metrics_every % self.log_every == 0, "trainer.metrics_every", self.metrics_every,
                    f"must be null or a positive multiple of trainer.log_every={self.log_every}")
        positive("trainer.diverge_loss", self.diverge_loss)
        positive("trainer.collective_timeout_s", self.collective_timeout_s)
        at_least("trainer.max_restarts", self.max_restarts, 0)
        require(bool(self.resume), "trainer.resume", self.resume,
                "must be auto, never, or the path of a checkpoint/step-<N> directory")
        if self.stop_at_step is not None:
            at_least("trainer.stop_at_step", self.stop_at_step, 1)
        every = self.periodic_checkpoint.every_steps
        if self.rollback.max_rollbacks and every > 0:
            # A checkpoint is then written where a divergence check has just passed, so a resumed run
            # starts from the state the uninterrupted one would roll back to (components/rollback.py).
            require(every % self.log_every == 0, "trainer.periodic_checkpoint.every_steps", every,
                    f"must be a multiple of trainer.log_every={self.log_every} while trainer.rollback.max_rollbacks > 0")


@dataclass
class TaskConfig:
    weight: float = 1.0


@dataclass
class LossConfig:
    label_smoothing: float = 0.0   # BCE targets become y (1 - s) + s / 2

    def __post_init__(self) -> None:
        fraction("loss.label_smoothing", self.label_smoothing)


@dataclass
class TrainConfig:
    """``python -m recsys_hdet.train``: conf/config.yaml composed from the groups below."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    hdet: HDETForm = field(default_factory=HDETForm)   # the chosen form's schema (conf/hdet/: hdet=enabled, ...)
    experiment_name: str = "default"
    seed: int = 0
    tasks: Dict[str, TaskConfig] = field(default_factory=dict)
    loss: LossConfig = field(default_factory=LossConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        require(len(self.tasks) >= 1, "tasks", dict(self.tasks), "declare at least one task")
        for task, spec in self.tasks.items():
            require(is_number(spec.weight) and spec.weight >= 0, f"tasks.{task}.weight", spec.weight,
                    "must be a finite number >= 0")
        require(sum(s.weight for s in self.tasks.values()) > 0, "tasks", "all weights 0",
                "some task needs a weight > 0")


def register() -> None:
    """Registers the schemas the YAML files' defaults lists name (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for option, form in FORM_SCHEMAS.items():  # each hdet option's own keys (conf/hdet/<option>.yaml names it)
        cs.store(group="hdet", name=f"{option}_schema", node=form)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="retrain_schema", node=RetrainConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(name="predict_schema", node=PredictConfig)


def check(cfg: DictConfig) -> "TrainConfig":
    """The composed config as the typed :class:`TrainConfig` (every group's ``__post_init__`` checks run:
    raises :class:`ConfigError`). What the training job passes on: components read its typed sections,
    with the defaults declared here and nowhere else. A config built without the schema (a plain container,
    ``OmegaConf.create``) is merged onto it first."""
    return OmegaConf.to_object(structured(cfg))


def structured(cfg: Any) -> DictConfig:
    """A config built without the schema (a plain container, a resolved config file) merged onto it, its ``hdet``
    node onto the schema of the form its keys name (:func:`recsys_hdet.hdet.config.hdet_form`), as Hydra's
    composition does through the chosen option; a composed config as it is."""
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is TrainConfig:
        return cfg
    schema = OmegaConf.structured(TrainConfig)
    schema.hdet = OmegaConf.structured(SCHEMA_OF_FORM[hdet_form((cfg or {}).get("hdet"))])
    return OmegaConf.merge(schema, cfg)


register()
