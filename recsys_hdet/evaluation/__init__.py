"""Evaluation: one package for scoring, metrics, the per-segment evaluation, the report and the CLI.

- :mod:`~recsys_hdet.evaluation.task_metrics`: the metrics of probabilities against labels (AUC, NE,
  log loss, calibration, ECE; the oracle's; reliability curves), one definition for every caller;
- :mod:`~recsys_hdet.evaluation.scoring`: :func:`predict_batches`, the one scoring loop (the
  trainer's held-out pass, HDET's probe, and a finished run's checkpoint through :func:`score_run`);
- :mod:`~recsys_hdet.evaluation.segments`: a run directory (:func:`load_run`), the predictions
  table with its segments, the metrics per task, segment and random-exposure slice;
- :mod:`~recsys_hdet.evaluation.intervals`: the 95% intervals of each slice's AUC, NE and calibration;
- :mod:`~recsys_hdet.evaluation.report`: report.html (figures and tables, one run or several), with
  :mod:`~recsys_hdet.evaluation.report_lineage`, a registry version's gate decision and parent;
- :mod:`~recsys_hdet.evaluation.cli`: ``python -m recsys_hdet.evaluate``.
"""

from recsys_hdet.evaluation.task_metrics import grouped_auc, oracle_metrics, reliability_curve, task_metrics
from recsys_hdet.evaluation.segments import (NO_RAND_COLUMN, RANDOM_EXPOSURE_LABEL, EvaluationError, RunInfo,
                                             evaluate_frame, load_run, popularity_buckets, predictions_frame)
from recsys_hdet.evaluation.scoring import predict_batches, score_run

__all__ = ["EvaluationError", "grouped_auc", "NO_RAND_COLUMN", "RANDOM_EXPOSURE_LABEL", "RunInfo", "evaluate_frame", "load_run",
           "oracle_metrics", "popularity_buckets", "predict_batches", "predictions_frame", "reliability_curve",
           "score_run", "task_metrics"]
