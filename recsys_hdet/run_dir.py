"""The run directory a job trains into, and its one owner: :class:`RunDir` names every file and
folder a run directory holds (docs/outputs.md) and reads them back; every writer and reader of a
run directory (the trainer and its components, evaluation, export, the retraining job, the studies,
the benchmarks) takes its paths from it. Also here: the directory's lock (one job at a time). Resuming the
run it holds and branching from another run's checkpoint: :mod:`recsys_hdet.resume`.

Import-light (no torch), and it imports nothing of ``components/`` or ``hdet/`` (not even through a function's
import), so that every layer above may use it (pyproject.toml's layers contract).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from data_tools.fileio import read_json, read_jsonl

if TYPE_CHECKING:
    from omegaconf import DictConfig


# The one naming scheme of a directory a command makes when none is given: outputs/<what>/<its start time>, the
# time as below (Hydra's ${now:...} in conf/config.yaml and lr_find, evaluate's comparisons, `make demo`; checked
# by tests/test_one_voice.py). A training run: outputs/<experiment_name>/2026-11-28_14-32-17.
TIME_FORMAT = "%Y-%m-%d_%H-%M-%S"
TIME_SHOWN = "<YYYY-MM-DD_HH-MM-SS>"  # the time as --help and the docs show it


def sync_records(path: str) -> List[Dict[str, Any]]:
    """``hdet.jsonl``'s sync records, without its event lines (a rollback: ``"event": "rollback"``)."""
    return [r for r in read_jsonl(path) if "event" not in r]


class RunDir:
    """A run directory, ``RunDir(path)``: the names of what it holds (``RunDir.SUMMARY``, ...: each file
    and folder, named here only), their paths (:meth:`path`) and readers of the run's config, summary and
    records. Writers write through their own code (the bytes are theirs); only the names are here."""

    # What Hydra writes (or a job that composes the config itself: write_job_config, api.record_config)
    HYDRA = ".hydra"
    CONFIG = os.path.join(HYDRA, "config.yaml")        # the composed config: what evaluation, export, resume read
    OVERRIDES = os.path.join(HYDRA, "overrides.yaml")  # the overrides it was composed with
    # What the training job writes
    LOCK = ".lock"                     # held while a job uses the directory
    TRAIN_LOG = "train.log"            # the console
    METRICS = "metrics.jsonl"          # one record per trainer.log_every steps
    HDET = "hdet.jsonl"                # one record per HDET sync (and rollback event lines)
    SUMMARY = "summary.json"           # the outcome: a finished run has one
    CHECKPOINT = "checkpoint"          # the final model, and the periodic step-<N>/ checkpoints
    TENSORBOARD = "tensorboard"        # TensorBoard's event files
    TRACKING = "mlflow.json"           # tracking=mlflow: the run's MLflow store and run id (recsys_hdet/tracking.py)
    PROFILE = "profile.txt"            # trainer.profile's operator table
    RANGE_TEST = "range_test.json"     # HDET's range test on the replicas (hdet.range_test)
    # What recsys_hdet.evaluate writes
    EVAL = "eval.json"
    PREDICTIONS = "predictions.parquet"
    REPORT = "report.html"
    # What the retraining job adds (pipelines/retrain.py: a registry version holds them)
    EXPORT = "export"                  # the serving artifact
    PUBLISHED_EVAL = "published_eval.json"  # the published model scored on the candidate's held-out rows
    VERSION_MANIFEST = "manifest.json"  # a registry version's record (pipelines.registry: its gate, parent, files)
    # What a study run adds (studies/runs.train_run)
    STUDY_RUN = "ablation_run.json"    # the command, overrides, exit status, seconds, commit

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"RunDir({self.root!r})"

    def path(self, name: str) -> str:
        """``root/name`` for one of the names above."""
        return os.path.join(self.root, name)

    def finished(self) -> bool:
        """The run wrote its ``summary.json`` (completed, diverged or stopped: every outcome with a result)."""
        return os.path.isfile(self.path(self.SUMMARY))

    def summary(self) -> Optional[Dict[str, Any]]:
        """``summary.json``; None when the run has none (not finished, or failed)."""
        return read_json(self.path(self.SUMMARY))

    def evaluation(self) -> Optional[Dict[str, Any]]:
        """``eval.json`` (recsys_hdet.evaluate's); None before the run is evaluated."""
        return read_json(self.path(self.EVAL))

    def metrics(self) -> List[Dict[str, Any]]:
        """``metrics.jsonl``'s records; empty when there are none."""
        return read_jsonl(self.path(self.METRICS))

    def syncs(self) -> List[Dict[str, Any]]:
        """``hdet.jsonl``'s sync records (its event lines left out); empty for a plain run."""
        return sync_records(self.path(self.HDET))

    def config(self) -> "DictConfig":
        """``.hydra/config.yaml``, as saved (interpolations unresolved). FileNotFoundError when absent."""
        from omegaconf import OmegaConf

        return OmegaConf.load(self.path(self.CONFIG))

    def overrides(self) -> List[str]:
        """``.hydra/overrides.yaml``: the overrides the config was composed with, as written.
        FileNotFoundError when absent."""
        import yaml

        with open(self.path(self.OVERRIDES)) as f:
            return [str(o) for o in yaml.safe_load(f) or []]


class RunDirInUse(Exception):
    """Another job holds the run directory's lock."""


def run_dir_lock(run_dir: str):
    """An exclusive lock on ``run_dir/.lock`` held for the job's life (the open file; None on a rank other
    than 0 under torchrun, where rank 0's process holds it). RunDirInUse when another job holds it."""
    from recsys_hdet.distributed import torchrun_follower
    from data_tools.fileio import LockHeld, try_exclusive_lock

    if torchrun_follower():
        return None
    try:
        return try_exclusive_lock(RunDir(run_dir).path(RunDir.LOCK))
    except LockHeld as e:
        raise RunDirInUse(f"{run_dir} is in use by another training job ({e.holder}); wait for it, or use another "
                          "run_dir=DIR") from None


def write_job_config(run_dir: str, cfg: Any, overrides: List[str], *, resolve: bool = False) -> str:
    """Writes the composed ``cfg`` and the ``overrides`` it was composed with where the training command's
    Hydra puts them (``run_dir/.hydra/config.yaml`` and ``overrides.yaml``: what evaluation, the studies and
    a resume read), for a job that composes the config itself and trains it through ``python -m
    recsys_hdet.api CONFIG RUN_DIR``. ``resolve=False`` keeps interpolations (``${oc.env:...}``) for the
    training process to resolve, as Hydra does. Returns the config file's path."""
    from omegaconf import OmegaConf

    from data_tools.fileio import write_text_atomic

    files = RunDir(run_dir)
    config = files.path(RunDir.CONFIG)
    os.makedirs(os.path.dirname(config), exist_ok=True)
    write_text_atomic(config, OmegaConf.to_yaml(cfg, resolve=resolve))
    write_text_atomic(files.path(RunDir.OVERRIDES),
                      OmegaConf.to_yaml(OmegaConf.create([str(o) for o in overrides])))
    return config
