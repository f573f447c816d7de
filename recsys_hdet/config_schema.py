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

Choices are ``StrEnum`` members: they compare, hash and print as their strings, so code reading the
config treats them as the strings the YAML files hold.

Limits: OmegaConf has no ``Literal``; ``tasks`` is a mapping whose keys are the user's task names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from recsys_hdet.hdet.config import HDETConfig


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and what is allowed."""


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config {key}={value!r}: {expected}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def positive(key: str, value: Any) -> None:
    require(_number(value) and value > 0, key, value, "must be a finite number > 0")


def at_least(key: str, value: Any, low: int) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= low, key, value,
            f"must be an integer >= {low}")


def fraction(key: str, value: Any, low_open: bool = False, high_open: bool = True) -> None:
    lo_ok = (value > 0) if low_open else (value >= 0)
    hi_ok = (value < 1) if high_open else (value <= 1)
    require(_number(value) and lo_ok and hi_ok, key, value,
            f"must be in {'(' if low_open else '['}0, 1{')' if high_open else ']'}")


# ----------------------------------------------------------------------------------------------
# Choices


class TrainExposure(StrEnum):
    all = "all"              # train on every impression
    standard = "standard"    # drop the random-exposure impressions (is_rand = 1)


class DenseOptimizer(StrEnum):
    adam = "adam"
    adamw = "adamw"
    prodigy = "prodigy"
    schedulefree_adamw = "schedulefree_adamw"


class EmbeddingOptimizer(StrEnum):
    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"
    adam = "adam"            # fbgemm has it on CUDA only


CUDA_ONLY_EMBEDDING_OPTIMIZERS = (EmbeddingOptimizer.adam,)


class Schedule(StrEnum):
    one_cycle = "one_cycle"
    range_test = "range_test"   # the LR range test (a short run that sweeps the LR; plain runs only)


class AnnealStrategy(StrEnum):
    cos = "cos"
    linear = "linear"


class DenseGradients(StrEnum):
    allreduce = "allreduce"   # DDP: every step's dense gradient averaged over the world
    local = "local"           # none between HDET syncs (local SGD); the syncs average the replicas


class TrainPipeline(StrEnum):
    sparse_dist = "sparse_dist"   # TorchRec's TrainPipelineSparseDist (input all-to-all a batch ahead)
    base = "base"                 # TorchRec's TrainPipelineBase


class ShardingType(StrEnum):
    table_wise = "table_wise"
    column_wise = "column_wise"
    row_wise = "row_wise"
    table_row_wise = "table_row_wise"
    table_column_wise = "table_column_wise"
    data_parallel = "data_parallel"


class HDETSignal(StrEnum):
    train = "train"
    serving = "serving"
    probe = "probe"
    averaged_probe = "averaged_probe"
    anneal_probe = "anneal_probe"
    discounted_credit = "discounted_credit"


# The signals that score rows reserved from training (hdet.probe_rows).
PROBE_SIGNALS = (HDETSignal.probe, HDETSignal.averaged_probe, HDETSignal.anneal_probe, HDETSignal.discounted_credit)


class AveragedTensors(StrEnum):
    dense = "dense"
    all = "all"


# ----------------------------------------------------------------------------------------------
# Training: conf/config.yaml and its groups


@dataclass
class HoldoutConfig:
    fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        fraction("data.holdout.fraction", self.fraction)


@dataclass
class DataConfig:
    name: str = MISSING
    root: str = MISSING
    generator: Optional[Dict[str, Any]] = None   # null for a data set converted from real logs
    min_count: Dict[str, int] = field(default_factory=dict)
    eval_days: int = 1
    skip_days: int = 0
    train_days: Optional[int] = None
    until: Optional[str] = None                  # a day YYYYMMDD
    holdout: HoldoutConfig = field(default_factory=HoldoutConfig)
    train_exposure: TrainExposure = TrainExposure.all
    reserve_rows: Optional[int] = None
    batch_size: int = 512
    shuffle_within_day: bool = True

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
    attention_temperature: float = 1.0
    compile_dense: bool = False
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
class LearningRates:
    embedding: float = 0.05
    transformer: float = 0.002
    non_embedding: float = 0.002
    no_decay: float = 0.002

    def __post_init__(self) -> None:
        for group, lr in vars(self).items():
            positive(f"optim.lr.{group}", lr)


@dataclass
class DenseOptimizerConfig:
    type: DenseOptimizer = DenseOptimizer.adam
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1.0e-8
    weight_decay: float = 0.0
    fused: bool = True
    d0: float = 1.0e-6
    warmup_steps: Optional[int] = None   # schedulefree_adamw's own warm-up; null: the one-cycle's rise

    def __post_init__(self) -> None:
        require(len(self.betas) == 2 and all(_number(b) and 0 <= b < 1 for b in self.betas), "optim.dense.betas",
                self.betas, "must be [beta1, beta2], each in [0, 1)")
        positive("optim.dense.eps", self.eps)
        require(_number(self.weight_decay) and self.weight_decay >= 0, "optim.dense.weight_decay",
                self.weight_decay, "must be a finite number >= 0")
        if self.type == DenseOptimizer.prodigy:
            positive("optim.dense.d0", self.d0)
        if self.warmup_steps is not None:
            at_least("optim.dense.warmup_steps", self.warmup_steps, 0)


@dataclass
class RangeTestConfig:
    steps: int = 100
    low: float = 0.01
    high: float = 100.0
    groups: List[str] = field(default_factory=lambda: ["embedding", "transformer", "non_embedding", "no_decay"])

    def __post_init__(self) -> None:
        at_least("optim.schedule.range_test.steps", self.steps, 2)
        positive("optim.schedule.range_test.low", self.low)
        require(_number(self.high) and self.high > self.low, "optim.schedule.range_test.high", self.high,
                f"must be a number above optim.schedule.range_test.low={self.low}")
        groups = ("embedding", "transformer", "non_embedding", "no_decay")
        require(bool(self.groups) and all(g in groups for g in self.groups), "optim.schedule.range_test.groups",
                list(self.groups), "a non-empty list of " + ", ".join(groups))


@dataclass
class EmbeddingOptimizerConfig:
    type: EmbeddingOptimizer = EmbeddingOptimizer.rowwise_adagrad
    eps: float = 1.0e-8

    def __post_init__(self) -> None:
        positive("optim.embedding.eps", self.eps)
        if self.type in CUDA_ONLY_EMBEDDING_OPTIMIZERS:
            import torch

            require(torch.cuda.is_available(), "optim.embedding.type", str(self.type),
                    f"fbgemm's CPU kernels have no fused {self.type} and this machine has no CUDA device: choose "
                    "one of " + ", ".join(repr(str(k)) for k in EmbeddingOptimizer
                                          if k not in CUDA_ONLY_EMBEDDING_OPTIMIZERS))


@dataclass
class ScheduleConfig:
    name: Schedule = Schedule.one_cycle
    pct_start: float = 0.3
    anneal_strategy: AnnealStrategy = AnnealStrategy.cos
    div_factor: float = 25.0
    final_div_factor: float = 10000.0
    three_phase: bool = False
    cycle_momentum: bool = True
    base_momentum: float = 0.85
    max_momentum: float = 0.95
    range_test: RangeTestConfig = field(default_factory=RangeTestConfig)

    def __post_init__(self) -> None:
        fraction("optim.schedule.pct_start", self.pct_start, low_open=True)
        positive("optim.schedule.div_factor", self.div_factor)
        positive("optim.schedule.final_div_factor", self.final_div_factor)


@dataclass
class OptimConfig:
    lr: LearningRates = field(default_factory=LearningRates)
    dense: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    embedding: EmbeddingOptimizerConfig = field(default_factory=EmbeddingOptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


@dataclass
class RollbackConfig:
    max_rollbacks: int = 3
    lr_factor: float = 0.5

    def __post_init__(self) -> None:
        at_least("trainer.rollback.max_rollbacks", self.max_rollbacks, 0)
        require(_number(self.lr_factor) and 0 < self.lr_factor <= 1, "trainer.rollback.lr_factor", self.lr_factor,
                "must be a number in (0, 1]")


@dataclass
class PeriodicCheckpointConfig:
    every_steps: int = 250
    keep_last: int = 2
    async_save: bool = False
    keep_at: List[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        at_least("trainer.periodic_checkpoint.every_steps", self.every_steps, 0)
        at_least("trainer.periodic_checkpoint.keep_last", self.keep_last, 1)
        require(all(_number(f) and 0 < f < 1 for f in self.keep_at), "trainer.periodic_checkpoint.keep_at",
                list(self.keep_at), "must be a list of fractions of the pass in (0, 1)")


@dataclass
class ProfileConfig:
    steps: int = 0
    skip: int = 20

    def __post_init__(self) -> None:
        at_least("trainer.profile.steps", self.steps, 0)
        at_least("trainer.profile.skip", self.skip, 0)


@dataclass
class TrainerConfig:
    nproc: int = 4
    sharding_group_size: int = 4
    embedding_sync_every: int = 1
    train_pipeline: TrainPipeline = TrainPipeline.sparse_dist
    dense_gradients: DenseGradients = DenseGradients.allreduce
    threads_per_worker: Optional[int] = None
    log_every: int = 25
    diverge_loss: float = 2.0
    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    eval_batch_size: int = 2048
    checkpoint: bool = True
    periodic_checkpoint: PeriodicCheckpointConfig = field(default_factory=PeriodicCheckpointConfig)
    resume: str = "auto"
    collective_timeout_s: float = 300.0
    max_restarts: int = 0
    tensorboard: bool = True
    branch_from: Optional[str] = None
    stop_at_step: Optional[int] = None
    warm_start: Optional[str] = None
    warm_start_preset: Optional[str] = None
    warm_start_overrides: List[str] = field(default_factory=list)
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def __post_init__(self) -> None:
        for key in ("nproc", "sharding_group_size", "embedding_sync_every", "log_every", "eval_batch_size"):
            at_least(f"trainer.{key}", getattr(self, key), 1)
        require(self.nproc % self.sharding_group_size == 0, "trainer.sharding_group_size", self.sharding_group_size,
                f"must divide trainer.nproc={self.nproc}")
        if self.threads_per_worker is not None:
            at_least("trainer.threads_per_worker", self.threads_per_worker, 1)
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
class AveragedProbeConfig:
    fraction: float = 0.5
    tensors: AveragedTensors = AveragedTensors.all

    def __post_init__(self) -> None:
        fraction("hdet.averaged_probe.fraction", self.fraction, low_open=True, high_open=False)


@dataclass
class AnnealProbeConfig:
    steps: int = 4

    def __post_init__(self) -> None:
        at_least("hdet.anneal_probe.steps", self.steps, 1)


@dataclass
class DiscountedCreditConfig:
    mu: float = 0.9
    fraction: float = 0.5

    def __post_init__(self) -> None:
        require(_number(self.mu) and 0 <= self.mu < 1, "hdet.discounted_credit.mu", self.mu, "must be in [0, 1)")
        fraction("hdet.discounted_credit.fraction", self.fraction, low_open=True, high_open=False)


@dataclass
class ExploreConfig:
    """Scalar hyperparameters beyond LR, steered like the LRs; null: not explored. Each a mapping:
    ``spread`` and its bounds (``max``; ``max_multiple`` for weight decay; ``min``/``max`` for the
    attention temperature)."""
    dropout: Optional[Dict[str, float]] = None
    weight_decay: Optional[Dict[str, float]] = None
    temperature: Optional[Dict[str, float]] = None
    label_smoothing: Optional[Dict[str, float]] = None

    def __post_init__(self) -> None:
        for name, spec in vars(self).items():
            if spec is None:
                continue
            spread = spec.get("spread")
            require(_number(spread) and spread >= 0, f"hdet.explore.{name}.spread", spread, "must be a number >= 0")
            if name in ("dropout", "label_smoothing"):
                fraction(f"hdet.explore.{name}.max", spec.get("max", -1), low_open=True)


@dataclass
class WarmInitConfig:
    nu: float = 0.0

    def __post_init__(self) -> None:
        require(_number(self.nu) and self.nu >= 0, "hdet.warm_init.nu", self.nu, "must be >= 0")


@dataclass
class HDETConfigGroup(HDETConfig):
    """conf/hdet/: the controller's fields are :class:`recsys_hdet.hdet.config.HDETConfig`'s (declared,
    defaulted and checked there, once; conf/hdet/enabled.yaml sets the product's values), plus the
    job's own HDET fields below (their meanings: conf/hdet/enabled.yaml)."""
    enabled: bool = False
    embedding_sync_every: Optional[int] = None
    ceiling_multiple: float = 2.0
    signal: HDETSignal = HDETSignal.anneal_probe
    probe_rows: int = 4096
    averaged_probe: AveragedProbeConfig = field(default_factory=AveragedProbeConfig)
    anneal_probe: AnnealProbeConfig = field(default_factory=AnnealProbeConfig)
    discounted_credit: DiscountedCreditConfig = field(default_factory=DiscountedCreditConfig)
    probe_mix: Any = 1.0     # a number in (0, 1], or "replicas"
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    warm_init: WarmInitConfig = field(default_factory=WarmInitConfig)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        super().__post_init__()  # the controller's checks
        if self.embedding_sync_every is not None:
            at_least("hdet.embedding_sync_every", self.embedding_sync_every, 1)
        require(_number(self.ceiling_multiple) and self.ceiling_multiple >= 1, "hdet.ceiling_multiple",
                self.ceiling_multiple, "must be >= 1")
        if self.signal in PROBE_SIGNALS:
            at_least("hdet.probe_rows", self.probe_rows, 1)
        mix = self.probe_mix
        require(mix == "replicas" or (_number(mix) and 0 < mix <= 1), "hdet.probe_mix", mix,
                "'replicas' or a number in (0, 1]")


@dataclass
class TaskConfig:
    weight: float = 1.0


@dataclass
class LossConfig:
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        fraction("loss.label_smoothing", self.label_smoothing)


@dataclass
class TrainConfig:
    """``python -m recsys_hdet.train``: conf/config.yaml composed from the groups below."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    hdet: HDETConfigGroup = field(default_factory=HDETConfigGroup)
    experiment_name: str = "default"
    seed: int = 0
    tasks: Dict[str, TaskConfig] = field(default_factory=dict)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        require(len(self.tasks) >= 1, "tasks", dict(self.tasks), "declare at least one task")
        for task, spec in self.tasks.items():
            require(_number(spec.weight) and spec.weight >= 0, f"tasks.{task}.weight", spec.weight,
                    "must be a finite number >= 0")
        require(sum(s.weight for s in self.tasks.values()) > 0, "tasks", "all weights 0",
                "some task needs a weight > 0")


# ----------------------------------------------------------------------------------------------
# The evaluation command (conf/evaluate.yaml) and the retraining job (conf/retrain.yaml)


@dataclass
class EvaluateConfig:
    """``python -m recsys_hdet.evaluate``: one run (``run_dir``) or a comparison (``runs``, ``out``)."""
    run_dir: Optional[str] = None
    runs: Optional[List[str]] = None
    out: Optional[str] = None
    days: Optional[List[Any]] = None        # held-out days YYYYMMDD
    data_root: Optional[str] = None
    batch_size: int = 4096
    nproc: int = 1
    rescore: bool = False
    labels: Optional[List[str]] = None

    def __post_init__(self) -> None:
        at_least("batch_size", self.batch_size, 1)
        at_least("nproc", self.nproc, 1)


@dataclass
class HoldoutSlice:
    fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        fraction("holdout.fraction", self.fraction, low_open=True)


@dataclass
class GateConfig:
    ne_tolerance: float = 0.002
    max_ne: float = 1.0
    calibration: List[float] = field(default_factory=lambda: [0.8, 1.25])

    def __post_init__(self) -> None:
        require(_number(self.ne_tolerance) and self.ne_tolerance >= 0, "gate.ne_tolerance", self.ne_tolerance,
                "must be >= 0")
        positive("gate.max_ne", self.max_ne)
        require(len(self.calibration) == 2 and 0 < self.calibration[0] <= 1 <= self.calibration[1],
                "gate.calibration", list(self.calibration), "need [low, high] with 0 < low <= 1 <= high")


@dataclass
class RetrainConfig:
    """``python -m pipelines.retrain``: field meanings in conf/retrain.yaml."""
    registry: str = MISSING
    data_root: Optional[str] = None          # the ``run`` command needs it; status and rollback do not
    experiment: str = "retrain_daily"
    cold_start_experiment: str = "retrain_daily"
    overrides: List[str] = field(default_factory=list)
    carry_lr: bool = False
    carry_lr_clamp: Optional[float] = 4.0
    holdout: HoldoutSlice = field(default_factory=HoldoutSlice)
    gate: GateConfig = field(default_factory=GateConfig)
    eval_nproc: int = 1
    train_timeout_s: float = 0.0
    seed: int = 0
    nothing_to_do_exit: int = 5

    def __post_init__(self) -> None:
        if self.carry_lr_clamp is not None:
            require(self.carry_lr_clamp >= 1, "carry_lr_clamp", self.carry_lr_clamp, "must be a number >= 1 or null")
        at_least("eval_nproc", self.eval_nproc, 1)
        require(_number(self.train_timeout_s) and self.train_timeout_s >= 0, "train_timeout_s",
                self.train_timeout_s, "must be >= 0 (0: no limit)")
        from recsys_hdet.exit_status import ExitStatus

        taken = sorted(int(e) for e in ExitStatus if e not in (ExitStatus.OK, ExitStatus.NOTHING_TO_DO))
        require(0 <= self.nothing_to_do_exit <= 255 and self.nothing_to_do_exit not in taken, "nothing_to_do_exit",
                self.nothing_to_do_exit, f"must be an exit status 0..255 other than {taken} (those mean something else)")


def register() -> None:
    """Registers the schemas the YAML files' defaults lists name (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="retrain_schema", node=RetrainConfig)


def check(cfg: DictConfig) -> None:
    """Runs every group's ``__post_init__`` checks on a composed config (raises :class:`ConfigError`)."""
    OmegaConf.to_object(cfg)


register()
