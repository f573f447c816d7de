"""Random exposure kept apart.

Impressions with ``is_rand`` = 1 (the video was shown uniformly at random) are dropped from the
training stream with ``data.train_exposure=standard``, and the offline evaluation reports them as
a slice of their own: the unbiased estimate. The tests write the ``is_rand`` column themselves
(into a copy of the tiny data set), so they hold whether or not the converter writes it.
"""

import math
import os
import shutil

import numpy as np
import polars as pl
import pytest
import torch

from conftest import REPO, read_json, run_train
from recsys_hdet.components.dataset import DatasetMeta, day_rows, split_days
from recsys_hdet.components.dataloader import ParquetBatchStream

KEYS = ["time_ms", "user_id_raw", "video_id_raw"]
TASKS = ["contribution", "like", "long_dwell"]


def _copy_with_is_rand(src, dst, fraction=0.1, seed=0, days=None, value=None):
    """A copy of the processed data set ``src`` in which each of ``days`` (default: all) gets an
    ``is_rand`` column (Int8): 1 on a seeded ``fraction`` of its rows, or ``value`` on every row;
    the other days lose the column."""
    shutil.copytree(src, dst)
    meta = DatasetMeta.load(str(dst))
    rng = np.random.default_rng(seed)
    for day in meta.days:
        path = meta.day_path(day)
        df = pl.read_parquet(path)
        df = df.drop("is_rand") if "is_rand" in df.columns else df
        if days is None or day in days:
            flags = np.full(df.height, value) if value is not None else rng.random(df.height) < fraction
            df = df.with_columns(pl.Series("is_rand", flags.astype(np.int8), dtype=pl.Int8))
        df.write_parquet(path)
    return str(dst)


def _keys(df):
    return set(zip(*(df[k].to_list() for k in KEYS)))


def _stream(meta, days, **kw):
    kw.setdefault("batch_size", 64)
    return ParquetBatchStream(meta, days, rank=kw.pop("rank", 0), world_size=kw.pop("world", 1), seed=0, **kw)


def _yielded(streams):
    """Row keys of the unmasked rows the streams yield, and the number of batches per stream."""
    rows, batches = [], []
    for s in streams:
        n = 0
        for b in s:
            n += 1
            rows += [tuple(int(b.extras[k][i]) for k in KEYS) for i in torch.nonzero(b.mask).flatten().tolist()]
        batches.append(n)
    return rows, batches


# ----------------------------------------------------------------------------------------------
# Training side: data.train_exposure


def test_standard_exposure_drops_the_random_rows_from_the_stream(tiny_dataset, tmp_path):
    root = _copy_with_is_rand(tiny_dataset, tmp_path / "data", fraction=0.1)
    meta = DatasetMeta.load(root)
    train_days, _ = split_days(meta, 1)
    frames = [pl.read_parquet(meta.day_path(d), columns=KEYS + ["is_rand"]) for d in train_days]
    rand = set().union(*(_keys(f.filter(pl.col("is_rand") == 1)) for f in frames))
    standard = set().union(*(_keys(f.filter(pl.col("is_rand") == 0)) for f in frames))
    assert len(rand) > 1000 and len(standard) > 10 * 1000

    # Every row once (padded, as in evaluation): exactly the standard rows, none of the random ones.
    rows, _ = _yielded([_stream(meta, train_days, extras=KEYS, pad_last=True, exposure="standard")])
    assert len(rows) == len(set(rows)) == len(standard)
    assert set(rows) == standard and not set(rows) & rand
    # The default reads every row, random ones included.
    rows, _ = _yielded([_stream(meta, train_days, extras=KEYS, pad_last=True)])
    assert set(rows) == standard | rand

    # As in training: 2 ranks, shuffled, remainders dropped; the pass length counts standard rows only.
    world, B = 2, 64
    streams = [_stream(meta, train_days, extras=KEYS, rank=r, world=world, batch_size=B, exposure="standard")
               for r in range(world)]
    per_day = day_rows(meta, train_days, "standard")
    assert per_day == {d: f.filter(pl.col("is_rand") == 0).height for d, f in zip(train_days, frames)}
    expected_steps = sum(n // (B * world) for n in per_day.values())
    assert len(streams[0]) == expected_steps < sum(meta.days[d]["rows"] // (B * world) for d in train_days)
    rows, batches = _yielded(streams)
    assert batches == [expected_steps] * world
    assert len(rows) == len(set(rows)) == expected_steps * B * world
    assert not set(rows) & rand


def test_is_rand_is_read_only_when_filtering_and_never_a_feature(tiny_dataset, tmp_path, monkeypatch):
    root = _copy_with_is_rand(tiny_dataset, tmp_path / "data", fraction=0.1)
    meta = DatasetMeta.load(root)
    assert "is_rand" not in set(meta.sparse) | set(meta.dense)
    day = list(meta.days)[0]
    read = []
    real = pl.read_parquet
    monkeypatch.setattr(pl, "read_parquet", lambda path, columns=None, **kw: read.append(columns) or real(path, columns=columns, **kw))
    a = next(iter(_stream(meta, [day], shuffle_within_day=False)))
    assert read and "is_rand" not in read[-1]
    b = next(iter(_stream(meta, [day], shuffle_within_day=False, exposure="standard")))
    assert "is_rand" in read[-1]
    assert b.sparse.keys() == a.sparse.keys() and b.dense.shape == a.dense.shape
    # The first standard row is the first batch's first row: the random rows before it are skipped.
    first = pl.read_parquet(meta.day_path(day), columns=["is_rand"])["is_rand"].to_numpy()
    assert torch.equal(b.dense[0], a.dense[int(np.argmax(first == 0))])


def test_standard_exposure_without_the_column_names_the_root_and_column(tiny_dataset, tmp_path):
    root = _copy_with_is_rand(tiny_dataset, tmp_path / "data", days=[])  # every day without is_rand
    meta = DatasetMeta.load(root)
    train_days, _ = split_days(meta, 1)
    with pytest.raises(ValueError) as e:
        _stream(meta, train_days, exposure="standard")
    assert root in str(e.value) and "'is_rand'" in str(e.value) and "data.train_exposure" in str(e.value)
    # Older data sets train as before with the default.
    assert len(_stream(meta, train_days)) == sum(meta.days[d]["rows"] // 64 for d in train_days)
    with pytest.raises(ValueError, match="exposure='random'"):
        _stream(meta, train_days, exposure="random")


@pytest.mark.parametrize("value", ["random", "Standard", "1", "null"])
def test_bad_train_exposure_is_named(value):
    from conftest import config_error

    message = config_error("data=tiny", f"data.train_exposure={value}")
    needles = ("data.train_exposure", "not Optional") if value == "null" else \
        ("data.train_exposure", repr(value), "all, standard")
    for needle in needles:
        assert needle in message, message


def test_every_data_config_trains_on_every_exposure():
    """The default (DataConfig's) is all, and no data preset changes it."""
    from recsys_hdet.config import compose

    folder = os.path.join(REPO, "conf", "data")
    for name in os.listdir(folder):
        assert compose("config", [f"data={name[:-5]}"]).data.train_exposure == "all", name


# ----------------------------------------------------------------------------------------------
# Evaluation side: the random-exposure slice


def _run_info(root, eval_days=1):
    """A RunInfo for the tiny config over ``root`` (no training: the slice needs predictions only)."""
    from hydra import compose, initialize_config_dir

    from recsys_hdet.evaluation import RunInfo

    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["data=tiny", f"data.eval_days={eval_days}"])
    meta = DatasetMeta.load(root)
    train_days, held_out = split_days(meta, eval_days)
    return RunInfo(str(root), cfg, {"status": "completed"}, meta, train_days, held_out)


def _fake_probs(run, seed=0):
    """Predictions that carry signal (so AUC and NE are informative), from the labels plus noise."""
    labels = pl.concat([pl.read_parquet(run.meta.day_path(d), columns=[f"label_{t}" for t in TASKS])
                        for d in run.eval_days]).to_numpy()
    rng = np.random.default_rng(seed)
    logits = -3.0 + 1.5 * labels + rng.normal(0, 1, labels.shape)
    return np.clip(1 / (1 + np.exp(-logits)), 0.01, 0.99).astype(np.float32)


def _direct_metrics(y, p):
    from sklearn.metrics import log_loss, roc_auc_score

    rate = y.mean()
    ll = log_loss(y, p, labels=[0, 1])
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return {"auc": roc_auc_score(y, p), "logloss": ll, "ne": ll / entropy, "calibration": p.mean() / rate,
            "positive_rate": rate, "count": len(y)}


def test_random_exposure_slice_equals_the_metrics_of_the_is_rand_rows(tiny_dataset, tmp_path):
    from recsys_hdet.evaluation import RANDOM_EXPOSURE_LABEL, evaluate_frame, predictions_frame

    root = _copy_with_is_rand(tiny_dataset, tmp_path / "data", fraction=0.2, seed=3)
    run = _run_info(root)
    df = predictions_frame(run, _fake_probs(run))
    held_out = pl.read_parquet(run.meta.day_path(run.eval_days[0]))
    assert df["is_rand"].dtype == pl.Int8 and (df["is_rand"] == held_out["is_rand"]).all()
    ev = evaluate_frame(df, TASKS)
    rnd = ev["random_exposure"]
    part = df.filter(pl.col("is_rand") == 1)
    assert rnd["status"] == "present" and rnd["label"] == RANDOM_EXPOSURE_LABEL and "unbiased" in rnd["label"]
    assert rnd["rows"] == part.height == int(held_out["is_rand"].sum()) > 1000
    assert rnd["rows"] < ev["rows"] and "note" not in rnd
    for t in TASKS:
        y, p = part[f"label_{t}"].to_numpy(), part[f"pred_{t}"].to_numpy().astype(np.float64)
        want, got = _direct_metrics(y, p), rnd["eval"][t]
        assert got["count"] == want["count"]
        for k in ("auc", "logloss", "ne", "calibration", "positive_rate"):
            assert abs(got[k] - want[k]) < 1e-6, (t, k, got[k], want[k])
        # The same keys as the overall metrics, and different numbers (another set of rows).
        assert set(got) == set(ev["eval"][t]) and got["logloss"] != ev["eval"][t]["logloss"]
        o = part[f"oracle_{t}"].to_numpy().astype(np.float64)
        assert abs(rnd["oracle"][t]["ne"] - _direct_metrics(y, o)["ne"]) < 1e-6


def test_random_exposure_slice_absent_is_reported_with_the_reason(tiny_dataset, tmp_path):
    from recsys_hdet.evaluation import evaluate_frame, predictions_frame

    # An older data set: no is_rand column anywhere. Evaluation works; the slice says why it is absent.
    run = _run_info(_copy_with_is_rand(tiny_dataset, tmp_path / "old", days=[]))
    df = predictions_frame(run, _fake_probs(run))
    assert "is_rand" not in df.columns
    ev = evaluate_frame(df, TASKS)
    rnd = ev["random_exposure"]
    assert rnd["status"] == "absent" and rnd["rows"] == 0 and "eval" not in rnd
    assert "'is_rand' column" in rnd["reason"] and "unbiased" in rnd["label"]
    assert ev["eval"]["like"]["count"] == df.height  # the rest of the evaluation is unchanged

    # The column is there but no held-out impression had random exposure.
    run = _run_info(_copy_with_is_rand(tiny_dataset, tmp_path / "zeros", value=0))
    rnd = evaluate_frame(predictions_frame(run, _fake_probs(run)), TASKS)["random_exposure"]
    assert rnd["status"] == "absent" and rnd["rows"] == 0
    held_out_rows = run.meta.days[run.eval_days[0]]["rows"]
    assert "no held-out impression has is_rand = 1" in rnd["reason"] and f"({held_out_rows} rows" in rnd["reason"]

    # Two held-out days, only the later one with the column: the slice covers that day and says so.
    meta = DatasetMeta.load(tiny_dataset)
    first, last = list(meta.days)[-2:]
    run = _run_info(_copy_with_is_rand(tiny_dataset, tmp_path / "mixed", fraction=0.2, days=[last]), eval_days=2)
    df = predictions_frame(run, _fake_probs(run))
    assert df.filter(pl.col("date") == int(first))["is_rand"].null_count() == meta.days[first]["rows"]
    rnd = evaluate_frame(df, TASKS)["random_exposure"]
    assert rnd["status"] == "present"
    assert rnd["rows"] == df.filter(pl.col("is_rand") == 1).height == \
        int(pl.read_parquet(run.meta.day_path(last), columns=["is_rand"])["is_rand"].sum())
    assert first in rnd["note"] and last not in rnd["note"]


def test_report_shows_the_slice_its_row_count_or_why_it_is_absent(tmp_path):
    from recsys_hdet.evaluation.report import render_comparison, render_run
    from recsys_hdet.evaluation.run_artifacts import RunArtifacts

    metrics = {"auc": 0.71, "ne": 0.93, "logloss": 0.21, "calibration": 1.02, "ece": 0.01, "positive_rate": 0.05,
               "count": 1234}
    present = RunArtifacts(str(tmp_path), "with")
    present.evaluation = {"eval": {"like": {**metrics, "count": 12000}},
                          "random_exposure": {"status": "present", "label": "unbiased estimate: is_rand = 1",
                                              "rows": 1234, "eval": {"like": metrics},
                                              "oracle": {"like": {"ne": 0.9, "logloss": 0.2}}}}
    page = render_run(present)
    section = page.split("<h2>Random exposure (unbiased estimate)</h2>")[1].split("<h2>")[0]
    assert "1,234 random-exposure impressions" in section and "unbiased estimate: is_rand = 1" in section
    assert "0.7100" in section and "0.9300" in section and "+0.0300" in section  # AUC, NE, NE gap to the oracle

    absent = RunArtifacts(str(tmp_path), "without")
    absent.evaluation = {"eval": {"like": metrics},
                         "random_exposure": {"status": "absent", "rows": 0, "reason": "no 'is_rand' column here"}}
    section = render_run(absent).split("<h2>Random exposure (unbiased estimate)</h2>")[1].split("<h2>")[0]
    assert "absent" in section and "no &#x27;is_rand&#x27; column here" in section and "<table>" not in section

    older = RunArtifacts(str(tmp_path), "older")
    older.evaluation = {"eval": {"like": metrics}}  # an eval.json from before the slice existed
    page = render_comparison([present, absent, older])
    section = page.split("<h2>Random exposure (unbiased estimate)</h2>")[1].split("<h2>")[0]
    assert "1,234" in section and "no &#x27;is_rand&#x27; column here" in section and "rescore=true" in section


# ----------------------------------------------------------------------------------------------
# End to end: train on standard exposure only, then evaluate (slice in eval.json and report.html)


@pytest.mark.slow  # a training run and an evaluation (about a minute on 2 cores); `make test-all` runs it
def test_train_on_standard_exposure_then_evaluate_the_random_slice(tiny_dataset, tmp_path):
    from sklearn.metrics import log_loss, roc_auc_score

    from test_evaluate import run_evaluate

    cache = tmp_path / "cache"
    root = _copy_with_is_rand(tiny_dataset, cache / "tiny", fraction=0.1, seed=5)
    meta = DatasetMeta.load(root)
    train_days, (held_out,) = split_days(meta, 1)
    run_dir = tmp_path / "run"
    proc = run_train(run_dir, "data=tiny", "data.generator=null", "data.train_exposure=standard",
                     "trainer.nproc=2", "trainer.sharding_group_size=2", "trainer.log_every=10", data_cache=str(cache))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # The pass is as long as the standard rows make it (fewer steps than every row would).
    standard = day_rows(meta, train_days, "standard")
    summary = read_json(run_dir / "summary.json")
    assert summary["steps"] == sum(n // (256 * 2) for n in standard.values()) < \
        sum(meta.days[d]["rows"] // (256 * 2) for d in train_days)
    dropped = sum(meta.days[d]["rows"] for d in train_days) - sum(standard.values())
    assert f"{dropped} random-exposure rows" in proc.stdout

    ev = run_evaluate(f"run_dir={run_dir}", "batch_size=1000", data_cache=str(cache))
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-3000:]
    result = read_json(run_dir / "eval.json")
    rnd = result["random_exposure"]
    df = pl.read_parquet(run_dir / "predictions.parquet")
    part = df.filter(pl.col("is_rand") == 1)
    assert rnd["status"] == "present" and rnd["rows"] == part.height == \
        int(pl.read_parquet(meta.day_path(held_out), columns=["is_rand"])["is_rand"].sum())
    for t in TASKS:
        y, p = part[f"label_{t}"].to_numpy(), part[f"pred_{t}"].to_numpy().astype(np.float64)
        assert rnd["eval"][t]["count"] == part.height
        assert abs(rnd["eval"][t]["logloss"] - log_loss(y, p)) < 1e-4
        if 0 < y.sum() < len(y):
            assert abs(rnd["eval"][t]["auc"] - roc_auc_score(y, p)) < 1e-4
    assert f"random exposure (is_rand = 1, the unbiased estimate), n={part.height}" in ev.stdout
    page = (run_dir / "report.html").read_text()
    assert "Random exposure (unbiased estimate)" in page and f"{part.height:,} random-exposure impressions" in page
