"""Offline evaluation, steps 2 and 3: the predictions table and the metrics per task and segment.

2. :func:`predictions_frame` joins the scored probabilities (:func:`recsys_hdet.evaluation.scoring.score_run`)
   with the impressions' labels, oracle probabilities and the ids reports segment by: user
   activity level (``user_active_degree``), item popularity bucket (from the video's impressions in
   the run's training days) and tab.
3. :func:`evaluate_frame` computes, per task and per segment, the trainer's held-out metrics
   (:func:`recsys_hdet.evaluation.task_metrics.task_metrics`: AUC, NE, log loss, calibration, ECE,
   positive rate, count; and each slice's positives and 95% intervals: :mod:`recsys_hdet.evaluation.intervals`),
   plus equal-count reliability curves, and the same metrics on the
   random-exposure slice (``is_rand`` = 1: videos shown uniformly at random, the unbiased
   estimate), or why that slice is absent (no ``is_rand`` column in older data sets, or no such row).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import polars as pl
import torch
from omegaconf import DictConfig

from data_tools.contract import LABEL_PREFIX, ORACLE_PREFIX, RAND_COLUMN, has_meta, meta_path
from recsys_hdet.components.dataset import DatasetMeta, RowHoldout, split_for
from recsys_hdet.evaluation.intervals import method as intervals_method, with_intervals
from recsys_hdet.evaluation.task_metrics import grouped_auc, oracle_metrics, reliability_curve, task_metrics
from recsys_hdet.run_dir import RunDir

PRED_PREFIX = "pred_"
# Segments: name -> column of predictions.parquet.
SEGMENTS = {"user_activity": "user_activity", "item_popularity": "item_popularity", "tab": "tab_segment"}
# Item popularity buckets by cumulative share of training impressions (items sorted by impressions).
POPULARITY_BUCKETS = (("head", 0.5), ("torso", 0.8), ("tail", 1.0))
COLD = "cold (unseen in training)"
# eval.json's "random_exposure": the held-out rows with is_rand = 1.
RANDOM_EXPOSURE_LABEL = "unbiased estimate: impressions whose video was shown uniformly at random (is_rand = 1)"
NO_RAND_COLUMN = (f"the held-out day files have no {RAND_COLUMN!r} column (a data set processed before random "
                  "exposure was recorded): no random-exposure information; re-convert the raw logs to get this slice")


class EvaluationError(ValueError):
    """A run directory or evaluation setting that cannot be evaluated; the message names the file."""


# ----------------------------------------------------------------------------------------------
# The run


@dataclass
class RunInfo:
    """A finished run as evaluation needs it: its config and summary (read through :class:`RunDir`), its data
    set and the days it trained on and holds out."""
    run_dir: str
    cfg: DictConfig
    summary: Dict[str, Any]
    meta: DatasetMeta
    train_days: List[str]
    eval_days: List[str]

    @property
    def files(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def checkpoint(self) -> str:
        return self.files.path(RunDir.CHECKPOINT)


def load_run(run_dir: str, days: Optional[Sequence[str]] = None, data_root: Optional[str] = None) -> RunInfo:
    """Reads a run directory's config, summary and data set; checks it can be evaluated."""
    run_dir = os.path.abspath(run_dir)
    if not os.path.isdir(run_dir):
        raise EvaluationError(f"run_dir={run_dir}: no such directory")
    files = RunDir(run_dir)
    cfg_path = files.path(RunDir.CONFIG)
    if not os.path.isfile(cfg_path):
        raise EvaluationError(f"{cfg_path}: missing; not a recsys_hdet run directory")
    cfg = files.config()
    summary_path = files.path(RunDir.SUMMARY)
    summary = files.summary()
    if summary is None:
        raise EvaluationError(f"{summary_path}: missing; the run did not finish")
    if summary.get("status") != "completed":
        raise EvaluationError(f"{summary_path}: status {summary.get('status')!r}; only completed runs have a "
                              "checkpoint to evaluate")
    checkpoint = files.path(RunDir.CHECKPOINT)
    if not os.path.isfile(os.path.join(checkpoint, ".metadata")):
        raise EvaluationError(f"{checkpoint}: no checkpoint (.metadata missing); "
                              "was the run trained with trainer.checkpoint=false?")
    root = os.path.abspath(str(data_root or cfg.data.root))
    if not has_meta(root):
        raise EvaluationError(f"{meta_path(root)}: the run's data set is not there "
                              "(pass data.root=DIR)")
    meta = DatasetMeta.load(root)
    try:
        train_days, eval_days = split_for(meta, cfg.data)
    except ValueError as e:
        raise EvaluationError(f"{cfg_path}: {e}") from None
    if days:
        unknown = [str(d) for d in days if str(d) not in meta.days]
        if unknown:
            raise EvaluationError(f"days={list(days)}: {unknown} not in {meta_path(root)} (days: {list(meta.days)})")
        eval_days = [str(d) for d in days]
    return RunInfo(run_dir, cfg, summary, meta, train_days, eval_days)


# ----------------------------------------------------------------------------------------------
# 2. The predictions table


def popularity_buckets(meta: DatasetMeta, train_days: Sequence[str]) -> pl.DataFrame:
    """video_id_raw -> bucket by the video's impressions in the training days: items sorted by
    impressions, the ones making up the first 50% of impressions are "head", the next 30%
    "torso", the rest "tail". Known before the held-out day, so no leakage from it."""
    counts = (
        pl.concat([pl.scan_parquet(meta.day_path(d)).select("video_id_raw") for d in train_days])
        .group_by("video_id_raw").len()
        .sort(["len", "video_id_raw"], descending=[True, False])
        .collect()
    )
    share = counts["len"].cum_sum() / counts["len"].sum()
    # An item belongs to the first bucket whose cumulative share its impressions start in.
    start = (share - counts["len"] / counts["len"].sum()).to_numpy()
    labels = np.full(len(start), POPULARITY_BUCKETS[-1][0], dtype=object)
    for name, bound in reversed(POPULARITY_BUCKETS):
        labels[start < bound] = name
    return pl.DataFrame({"video_id_raw": counts["video_id_raw"], "item_popularity": labels.astype(str)})


def _user_activity_names(meta: DatasetMeta) -> Dict[int, str]:
    vocab = (meta.source or {}).get("string_vocabs", {}).get("user_active_degree")
    names = {0: "missing"}
    if vocab:
        names.update({i + 1: str(v) for i, v in enumerate(vocab)})
    return names


def _tab_names(meta: DatasetMeta) -> Dict[int, str]:
    """Feature row -> label naming the raw tab it encodes (the data set's exact tab vocabulary)."""
    from data_tools.vocab import OOV_ROW, vocab_path

    path = vocab_path(meta.root, "tab")
    if not os.path.isfile(path):
        return {}
    rows = pl.read_parquet(path, columns=["raw_id", "row"])
    return {OOV_ROW: "out of vocabulary", **{int(r): f"tab {int(t)}" for t, r in rows.iter_rows()}}


def predictions_frame(run: RunInfo, probs: np.ndarray) -> pl.DataFrame:
    """One row per held-out impression: ids, segments, and per task label, prediction, oracle."""
    tasks = list(run.cfg.tasks)
    oracle = [ORACLE_PREFIX + t for t in tasks] if run.meta.has_oracle else []
    cols = ["date", "time_ms", "user_id_raw", "video_id_raw", "user_active_degree", "tab"] + \
        [LABEL_PREFIX + t for t in tasks] + oracle
    frames, with_rand = [], False
    holdout = RowHoldout.from_config(run.cfg.data)
    for d in run.eval_days:
        # is_rand is kept (Int8) where the day file has it; a day without it gets nulls: no information.
        has_rand = RAND_COLUMN in pl.read_parquet_schema(run.meta.day_path(d))
        with_rand |= has_rand
        frame = pl.read_parquet(run.meta.day_path(d), columns=cols + ([RAND_COLUMN] if has_rand else []))
        if holdout is not None:  # the rows the run held out (and scored), as the loader picks them
            frame = frame.filter(pl.Series(holdout.mask(d, frame.height)))
        frames.append(frame.with_columns(
            (pl.col(RAND_COLUMN) if has_rand else pl.lit(None)).cast(pl.Int8).alias(RAND_COLUMN)))
    df = pl.concat(frames)
    if not with_rand:
        df = df.drop(RAND_COLUMN)
    if df.height != probs.shape[0]:
        raise RuntimeError(f"scored {probs.shape[0]} rows but the days hold {df.height}")
    names = _user_activity_names(run.meta)
    tabs = _tab_names(run.meta)
    df = df.with_columns(
        pl.col("tab").replace_strict(tabs, default=None, return_dtype=pl.String)
        .fill_null(pl.format("id {}", pl.col("tab"))).alias("tab_segment"),
        pl.col("user_active_degree").replace_strict(names, default="unknown", return_dtype=pl.String)
        .alias("user_activity"),
        *[pl.Series(PRED_PREFIX + t, probs[:, i].astype(np.float32)) for i, t in enumerate(tasks)],
    ).drop("user_active_degree")
    df = df.join(popularity_buckets(run.meta, run.train_days), on="video_id_raw", how="left", maintain_order="left")
    return df.with_columns(pl.col("item_popularity").fill_null(COLD))


# ----------------------------------------------------------------------------------------------
# 3. Metrics per task and segment


def _tensor(column: pl.Series) -> torch.Tensor:
    """A copy: polars' numpy view of a column is read-only, which torch.from_numpy warns about."""
    return torch.from_numpy(column.to_numpy(writable=True))


def segment_order(segment: str, value: Any) -> tuple:
    """Segments in the order a reader expects: popularity buckets head, torso, tail, then the cold
    items; other values naturally ("tab 2" before "tab 10": digit runs compare as numbers)."""
    if segment == "item_popularity":
        order = [b for b, _ in POPULARITY_BUCKETS] + [COLD]
        return (order.index(value),) if value in order else (len(order), str(value))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(value)) if p)


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def random_exposure_slice(df: pl.DataFrame, tasks: Sequence[str], metrics_for) -> Dict[str, Any]:
    """The metrics of :func:`evaluate_frame`'s ``eval`` (and ``oracle``) on the rows with is_rand = 1,
    the unbiased estimate: ``{"status": "present", "label", "rows", "eval", "oracle"?, "note"?}``, or
    ``{"status": "absent", "label", "rows": 0, "reason"}`` when the column is missing (older data sets)
    or no held-out row has is_rand = 1. A row whose is_rand is null carries no information."""
    out: Dict[str, Any] = {"label": RANDOM_EXPOSURE_LABEL}
    known = df.filter(pl.col(RAND_COLUMN).is_not_null()) if RAND_COLUMN in df.columns else df.clear()
    if known.height == 0:
        return {"status": "absent", **out, "rows": 0, "reason": NO_RAND_COLUMN}
    part = df.filter(pl.col(RAND_COLUMN) == 1)
    if part.height == 0:
        return {"status": "absent", **out, "rows": 0,
                "reason": f"no held-out impression has {RAND_COLUMN} = 1 ({known.height} rows, all standard exposure)"}
    out = {"status": "present", **out, "rows": part.height, "eval": metrics_for(part)}
    if all(ORACLE_PREFIX + t in df.columns for t in tasks):
        out["oracle"] = {t: oracle_metrics(_tensor(part[ORACLE_PREFIX + t]), _tensor(part[LABEL_PREFIX + t]))
                         for t in tasks}
    if known.height < df.height:
        unknown = df.filter(pl.col(RAND_COLUMN).is_null())
        days = sorted({str(d) for d in unknown["date"].unique()}) if "date" in df.columns else []
        out["note"] = (f"{unknown.height} held-out rows{' (days ' + ', '.join(days) + ')' if days else ''} have no "
                       f"{RAND_COLUMN} value; the slice covers the other {known.height} rows only")
    return out


def evaluate_frame(df: pl.DataFrame, tasks: Sequence[str], min_segment_rows: int = 1) -> Dict[str, Any]:
    """eval.json's metrics from a predictions table (see :func:`predictions_frame`). Every slice's task
    metrics (the whole table, each segment, the random-exposure slice) carry the slice's ``positives`` and
    the 95% ``interval`` of its AUC, NE and calibration (:mod:`recsys_hdet.evaluation.intervals`; how they
    were computed: ``intervals``)."""
    def metrics_for(frame: pl.DataFrame) -> Dict[str, Dict[str, float]]:
        point = {t: task_metrics(_tensor(frame[PRED_PREFIX + t]), _tensor(frame[LABEL_PREFIX + t])) for t in tasks}
        labels = frame.select([LABEL_PREFIX + t for t in tasks]).to_numpy()
        probs = frame.select([PRED_PREFIX + t for t in tasks]).to_numpy()
        return with_intervals(point, labels, probs, tasks)

    out: Dict[str, Any] = {"rows": df.height, "eval": metrics_for(df), "intervals": intervals_method()}
    if all(ORACLE_PREFIX + t in df.columns for t in tasks):
        out["oracle"] = {t: oracle_metrics(_tensor(df[ORACLE_PREFIX + t]), _tensor(df[LABEL_PREFIX + t]))
                         for t in tasks}
    segments: Dict[str, Dict[str, Any]] = {}
    for name, col in SEGMENTS.items():
        segments[name] = {}
        for key, part in sorted(df.group_by(col), key=lambda kv: segment_order(name, kv[0][0])):
            if part.height >= min_segment_rows:
                segments[name][str(key[0])] = metrics_for(part)
    out["segments"] = segments
    # Grouped AUC per user: ranking within each user's own impressions.
    out["gauc_user"] = {t: grouped_auc(df[PRED_PREFIX + t].to_numpy(), df[LABEL_PREFIX + t].to_numpy(),
                                       df["user_id_raw"].to_numpy()) for t in tasks} if "user_id_raw" in df.columns else {}
    out["random_exposure"] = random_exposure_slice(df, tasks, metrics_for)
    out["reliability"] = {t: reliability_curve(df[PRED_PREFIX + t].to_numpy().astype(np.float64),
                                               df[LABEL_PREFIX + t].to_numpy().astype(np.float64)) for t in tasks}
    return _nan_to_none(out)
