"""The schemas of the evaluation command (``conf/evaluate.yaml``) and the retraining job
(``conf/retrain.yaml``), registered with Hydra's ConfigStore by :func:`recsys_hdet.config_schema.register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from recsys_hdet.config_values import at_least, fraction, is_number, positive, require


@dataclass
class DataRoot:
    """``data.root=DIR``: a processed data set, spelled so in every command (the training config's key)."""
    root: Optional[str] = None


@dataclass
class EvaluateConfig:
    """``python -m recsys_hdet.evaluate``: one run (``run_dir``) or a comparison (``runs``, ``out``)."""
    run_dir: Optional[str] = None
    runs: Optional[List[str]] = None
    out: Optional[str] = None
    days: Optional[List[Any]] = None        # held-out days YYYYMMDD
    data: DataRoot = field(default_factory=DataRoot)  # the run's data set, when it moved
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
    ne_tolerance: float = 0.0
    z: float = 1.96
    max_ne: float = 1.0
    calibration: List[float] = field(default_factory=lambda: [0.8, 1.25])

    def __post_init__(self) -> None:
        require(is_number(self.ne_tolerance) and self.ne_tolerance >= 0, "gate.ne_tolerance", self.ne_tolerance,
                "must be >= 0")
        positive("gate.max_ne", self.max_ne)
        positive("gate.z", self.z)
        require(len(self.calibration) == 2 and 0 < self.calibration[0] <= 1 <= self.calibration[1],
                "gate.calibration", list(self.calibration), "need [low, high] with 0 < low <= 1 <= high")


@dataclass
class RetrainConfig:
    """``python -m pipelines.retrain``: field meanings in conf/retrain.yaml."""
    registry: str = MISSING
    data: DataRoot = field(default_factory=DataRoot)  # data.root: ``run`` needs it; status and rollback do not
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
    allow_config_change: bool = False
    run_dir: Optional[str] = None            # ``adopt``: the completed run to publish as version 1
    export_on_publish: bool = False
    # The invocation's own options (not settings: never recorded in a version)
    until: Optional[str] = None              # ``run``: train the missing days up to this one (YYYYMMDD)
    dry_run: bool = False                    # ``run``: print the plan, write nothing
    force: bool = False                      # ``run``: retrain a day a version was trained on
    allow_gaps: bool = False                 # ``run``: train across days missing from the data set
    create: bool = False                     # ``run``: create the registry (cold start) where none is
    to: Optional[str] = None                 # ``rollback``: the version to repoint current to
    json: bool = False                       # ``status``: one JSON object

    def __post_init__(self) -> None:
        if self.carry_lr_clamp is not None:
            require(self.carry_lr_clamp >= 1, "carry_lr_clamp", self.carry_lr_clamp, "must be a number >= 1 or null")
        at_least("eval_nproc", self.eval_nproc, 1)
        require(is_number(self.train_timeout_s) and self.train_timeout_s >= 0, "train_timeout_s",
                self.train_timeout_s, "must be >= 0 (0: no limit)")
        from data_tools.exit_status import ExitStatus

        taken = sorted(int(e) for e in ExitStatus if e not in (ExitStatus.OK, ExitStatus.NOTHING_TO_DO))
        require(0 <= self.nothing_to_do_exit <= 255 and self.nothing_to_do_exit not in taken, "nothing_to_do_exit",
                self.nothing_to_do_exit, f"must be an exit status 0..255 other than {taken} (those mean something else)")


@dataclass
class ExportConfig:
    """``python -m recsys_hdet.export``: field meanings in conf/export.yaml."""
    run_dir: str = MISSING
    out: str = MISSING
    data: DataRoot = field(default_factory=DataRoot)  # the run's data set, when it moved
    overwrite: bool = False
    raw_program: bool = False


@dataclass
class PredictConfig:
    """``python -m recsys_hdet.predict``: field meanings in conf/predict.yaml."""
    model_dir: str = MISSING
    data: DataRoot = field(default_factory=DataRoot)  # data.root: a processed data set to score a day of
    log: Optional[str] = None               # or a file: a raw log CSV (with users, videos) or a processed day file
    day: Optional[Any] = None               # YYYYMMDD, with data.root: the day to score
    out: str = MISSING
    users: Optional[str] = None
    videos: Optional[str] = None
    batch_size: int = 65536

    def __post_init__(self) -> None:
        at_least("batch_size", self.batch_size, 1)
