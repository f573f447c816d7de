"""The schemas of the evaluation command (``conf/evaluate.yaml``) and the retraining job
(``conf/retrain.yaml``), registered with Hydra's ConfigStore by :func:`recsys_hdet.config_schema.register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, List, Optional

from omegaconf import MISSING

from recsys_hdet.config_values import at_least, fraction, is_number, positive, require


@dataclass
class DataRoot:
    """``data.root=DIR``: a processed data set, spelled so in every command (the training config's key)."""
    root: Optional[str] = None


class TrackingBackend(StrEnum):
    none = "none"      # TensorBoard alone (trainer.tensorboard), as always
    mlflow = "mlflow"  # also MLflow (recsys_hdet/tracking.py): pip install 'recsys-hdet[mlflow]'


@dataclass
class TrackingConfig:
    """``tracking=mlflow`` (the config group conf/tracking/): the run is also an MLflow run (docs/outputs.md)."""
    backend: TrackingBackend = TrackingBackend.none
    # the MLflow tracking URI (a server, http://host:5000) or a local directory (its mlflow.db and artifacts/);
    # null: MLFLOW_TRACKING_URI when set, else the local directory outputs/mlflow (the working directory's)
    uri: Optional[str] = None
    experiment: Optional[str] = None   # the MLflow experiment; null: the run's experiment_name

    def __post_init__(self) -> None:
        if self.backend == TrackingBackend.mlflow:
            import importlib.util

            require(importlib.util.find_spec("mlflow") is not None, "tracking", "mlflow",
                    "mlflow is not installed: pip install 'recsys-hdet[mlflow]' (or mlflow-skinny)")


@dataclass
class EvaluateConfig:
    """``python -m recsys_hdet.evaluate``: one run (``run_dir``) or a comparison (``runs``, ``out``)."""
    run_dir: Optional[str] = None           # one run: eval.json, predictions.parquet, report.html into it
    runs: Optional[List[str]] = None        # a comparison: each run evaluated as run_dir=, one report.html in out
    # comparison: where its report.html goes (null: a new outputs/comparisons/<YYYY-MM-DD_HH-MM-SS>; never a run's
    # directory)
    out: Optional[str] = None
    days: Optional[List[Any]] = None        # held-out days to score, e.g. [20220418]; null: the run's own held-out days
    # data.root: the run's data set, when it moved since training (null: the run's recorded data.root)
    data: DataRoot = field(default_factory=DataRoot)
    batch_size: int = 4096                  # rows per worker per scoring step
    nproc: int = 1                          # local scoring workers (the tables are sharded over them)
    rescore: bool = False                   # false: reuse a run's eval.json when it scored the same days
    labels: Optional[List[str]] = None      # comparison: display names, one per run (null: each run's experiment name)

    def __post_init__(self) -> None:
        at_least("batch_size", self.batch_size, 1)
        at_least("nproc", self.nproc, 1)


@dataclass
class HoldoutSlice:
    """The gate's rows: a fixed slice of every day that no run trains on; the gate scores the slice of the day just
    trained on."""
    fraction: float = 0.1   # the share of each day's rows held out
    seed: int = 0           # draws the slice (by file position)

    def __post_init__(self) -> None:
        fraction("holdout.fraction", self.fraction, low_open=True)


@dataclass
class GateConfig:
    """What a day's candidate must pass to be published (docs/operations.md)."""
    # per task: rejected when the candidate's NE is worse than the published model's by more than this with
    # confidence: the paired interval of the difference over the held-out rows lies entirely above it
    ne_tolerance: float = 0.0
    z: float = 1.96   # the interval's half-width in standard errors (1.96: 95%, two-sided)
    # per task: NE must stay below this (1.0: no better than predicting the held-out rows' positive rate, e.g. a day
    # with shuffled labels)
    max_ne: float = 1.0
    calibration: List[float] = field(default_factory=lambda: [0.8, 1.25])  # per task: mean prediction / positive rate

    def __post_init__(self) -> None:
        require(is_number(self.ne_tolerance) and self.ne_tolerance >= 0, "gate.ne_tolerance", self.ne_tolerance,
                "must be >= 0")
        positive("gate.max_ne", self.max_ne)
        positive("gate.z", self.z)
        require(len(self.calibration) == 2 and 0 < self.calibration[0] <= 1 <= self.calibration[1],
                "gate.calibration", list(self.calibration), "need [low, high] with 0 < low <= 1 <= high")


@dataclass
class RetrainConfig:
    """``python -m pipelines.retrain``: the job's settings (recorded in each version), then the invocation's own
    options."""
    # the model registry directory (created by adopt, or by the first run with create=true)
    registry: str = MISSING
    # data.root: the processed data set new days are appended to (run needs it; adopt: default the run's; status
    # and rollback do not read it)
    data: DataRoot = field(default_factory=DataRoot)
    # the preset every day's run trains with (plain: docs/results/retrain_compare/retraining.md)
    experiment: str = "retrain_daily"
    cold_start_experiment: str = "retrain_daily"   # trains version 1 on every day up to the first run's last day
    # extra Hydra overrides for every training run, e.g. ['trainer.nproc=2'] or ['tracking=mlflow'] (each day's
    # run an MLflow run, its gate decision and version logged on it); adopt: default the run's own
    overrides: List[str] = field(default_factory=list)
    # true (HDET days only; refused on a plain day): start each group's max LR from the rates the published model's
    # HDET run trained at (the controller's last bases; the range test's commit, from which the day's sweep then
    # spans), clamped by carry_lr_clamp; false: the preset's LRs every day
    carry_lr: bool = False
    carry_lr_clamp: Optional[float] = 4.0    # a carried LR stays within [preset / this, preset x this] (null: unbounded)
    holdout: HoldoutSlice = field(default_factory=HoldoutSlice)
    gate: GateConfig = field(default_factory=GateConfig)
    eval_nproc: int = 1                      # local workers that score the held-out rows
    train_timeout_s: float = 0.0             # > 0: a training run that takes longer is killed and the day fails
    seed: int = 0                            # every day's run uses this seed (shuffles are seeded by seed and day)
    # the exit status when no day is new (docs/operations.md): 99 makes Airflow's BashOperator skip the task, 0
    # reports success
    nothing_to_do_exit: int = 5
    # true: train a day whose settings (the keys above that shape a model, or the preset's resolved config) differ
    # from the published version's; false: such a day is refused with exit 2 naming the keys
    allow_config_change: bool = False
    run_dir: Optional[str] = None            # adopt: the completed training run to publish as version 1
    # true: each published version also holds export/ (python -m recsys_hdet.export): registry/current/export is the
    # serving artifact
    export_on_publish: bool = False
    # The invocation's own options (not settings: never recorded in a version)
    until: Optional[str] = None              # run: train every missing day up to this one (YYYYMMDD), not past it
    # run: print the plan, make every check the run makes before it trains, write nothing (no lock either)
    dry_run: bool = False
    force: bool = False                      # run: train a day again although a version was trained on it
    # run: train a day although days before it are missing from the data set (never trained on); false: refused
    # with exit 2 naming the missing days
    allow_gaps: bool = False
    # run: on a path that holds no registry, create it and cold-start version 1; false: refused with exit 2 (a
    # typo'd path is not a new registry)
    create: bool = False
    to: Optional[str] = None                 # rollback: the version to repoint current to (null: current's parent)
    # adopt: a run trained with the range test (hdet=enabled): its committed max LRs become the job's overrides
    # (optim.lr.<group>=<rate> each, hdet=disabled in place of hdet=enabled), so the days train plain at them with
    # no sweep; refused (exit 2) for a run that committed none (docs/operations.md, "Adopting a run")
    freeze_lr: bool = False
    json: bool = False                       # status: one JSON object, for scripts and dashboards

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
    """``python -m recsys_hdet.export``: a completed run as a serving artifact."""
    run_dir: str = MISSING                   # the completed training run to export
    out: str = MISSING                       # the artifact's directory: model.pt2, vocab/, manifest.json
    # data.root: the run's data set, when it moved since training (null: the run's recorded data.root)
    data: DataRoot = field(default_factory=DataRoot)
    overwrite: bool = False                  # true: replace an existing out directory
    raw_program: bool = False                # true: also raw_model.pt2, the program that reads raw requests


@dataclass
class PredictConfig:
    """``python -m recsys_hdet.predict``: scores with an exported model."""
    model_dir: str = MISSING                # the exported model (python -m recsys_hdet.export's out)
    data: DataRoot = field(default_factory=DataRoot)  # data.root: a processed data set to score a day of (or log)
    log: Optional[str] = None               # or a file: a raw log CSV (with users, videos) or a processed day file
    day: Optional[Any] = None               # with data.root: the day to score, YYYYMMDD (null: its last day)
    out: str = MISSING                      # the scores' Parquet file
    users: Optional[str] = None             # a raw log's user features CSV (KuaiRand's user_features_*.csv)
    videos: Optional[str] = None            # a raw log's video features CSV (KuaiRand's video_features_basic_*.csv)
    batch_size: int = 65536                 # rows per call of the program

    def __post_init__(self) -> None:
        at_least("batch_size", self.batch_size, 1)
