"""Bad config and bad data fail before training, with the field or file named, leaving no outputs."""
import json
import os
import shutil

import polars as pl
import pytest

from conftest import config_error, run_train


def _assert_clean_failure(proc, run_dir, *needles):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not os.path.exists(run_dir), f"a failed validation leaves no run directory: {os.listdir(run_dir)}"


def test_an_invalid_config_value_fails_the_launcher_cleanly(tmp_path, data_cache):
    # The subprocess path once: exit status 2, the field named, no traceback, no run directory.
    run_dir = tmp_path / "run"
    proc = run_train(run_dir, "data=tiny", "optim.lr.transformer=-0.001", data_cache=data_cache, timeout=120)
    _assert_clean_failure(proc, run_dir, "optim.lr.transformer", "-0.001", "> 0")


def test_the_installed_commands_read_the_checkouts_conf_from_any_directory(tmp_path):
    import subprocess
    import sys

    bin_dir = os.path.dirname(sys.executable)
    proc = subprocess.run([os.path.join(bin_dir, "recsys-hdet-train"), "data=tiny", "hdet=controller", "+hdet.alpah=0.1",
                           f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", "hdet.alpah: unknown key", "did you mean hdet.alpha?")
    proc = subprocess.run([os.path.join(bin_dir, "recsys-hdet-retrain"), "status", f"registry={tmp_path / 'none'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no registry there" in proc.stderr, proc.stdout + proc.stderr


def _config_error(*overrides):
    return config_error("data=tiny", *overrides)


@pytest.mark.parametrize(
    "override, needles",
    [
        ("optim.lr.transformer=-0.001", ["optim.lr.transformer", "-0.001", "> 0"]),
        ("trainer.nproc=0", ["trainer.nproc", "0", ">= 1"]),
        ("trainer.sharding_group_size=3", ["trainer.sharding_group_size", "must divide"]),
        ("model.dropout=1.5", ["model.dropout", "1.5"]),
        ("tasks.like.weight=-1", ["tasks.like.weight", "-1"]),
        ("data.eval_days=0", ["data.eval_days", ">= 1"]),
        ("trainer.rollback.lr_factor=2", ["trainer.rollback.lr_factor", "(0, 1]"]),
        ("trainer.rollback.max_rollbacks=-1", ["trainer.rollback.max_rollbacks", ">= 0"]),
        ("optim.dense.type=lamb", ["optim.dense.type", "'lamb'", "adam, adamw, prodigy, schedulefree_adamw"]),
        ("trainer.nproc=abc", ["trainer.nproc", "'abc'", "Integer"]),
        ("hdet.alpah=0.1", ["hdet.alpah: unknown key", "did you mean hdet.alpha, a key of hdet=controller?"]),
        ("optim.embedding.type=adam", ["optim.embedding.type", "no fused adam", "'rowwise_adagrad'"]),
        ("+trainer.nproq=2", ["trainer.nproq: unknown key", "did you mean trainer.nproc?"]),
        ("+trainer.lr=0.1", ["trainer.lr: unknown key"]),
        ("trainer.dense_gradients=local", ["trainer.dense_gradients='local'", "needs HDET's controller (hdet=controller)"]),
        ("trainer.dense_gradients=ring", ["trainer.dense_gradients", "one of [allreduce, local]"]),
        ("trainer.periodic_checkpoint.every_steps=30",
         ["trainer.periodic_checkpoint.every_steps", "multiple of trainer.log_every=25"]),
        ("trainer.metrics_every=30", ["trainer.metrics_every", "30", "multiple of trainer.log_every=25"]),
        ("trainer.metrics_every=0", ["trainer.metrics_every", "positive multiple"]),
    ],
)
def test_invalid_config_value_is_named(override, needles):
    message = _config_error(override)
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["hdet.score=best"], ["hdet.score", "one of [softmax, zscore, rank, regression, effect, aimd, rprop]"]),
        (["hdet.space=cubic"], ["hdet.space", "one of [linear, log]"]),
        (["hdet.range_decades=[1.0,2.0]"], ["hdet.range_decades", "low <= 0 <= high"]),
        (["hdet.signal=probe", "hdet.probe_rows=0"], ["hdet.probe_rows", ">= 1"]),
        (["hdet.signal=anneal_probe", "hdet.probe_rows=1024", "hdet.anneal_probe.steps=64"],
         ["hdet.anneal_probe.steps=64", "leaving none of the 1024 reserved rows"]),
        (["hdet.signal=averaged_probe", "hdet.averaged_probe.fraction=0"], ["hdet.averaged_probe.fraction", "(0, 1]"]),
        (["hdet.signal=discounted_credit", "hdet.discounted_credit.mu=1.0"], ["hdet.discounted_credit.mu", "[0, 1)"]),
        (["hdet.signal=discounted_credit", "hdet.discounted_credit.fraction=0"],
         ["hdet.discounted_credit.fraction", "(0, 1]"]),
        (["hdet.signal=last"], ["hdet.signal", "discounted_credit]"]),
        (["hdet.score=effect", "hdet.space=linear"], ["hdet.score", "needs space=log"]),
        (["hdet.effect_scale=0"], ["hdet.effect_scale", "> 0"]),
    ],
)
def test_invalid_hdet_value_is_named(overrides, needles):
    message = _config_error("hdet=controller", *overrides)
    for needle in needles:
        assert needle in message, message


def test_a_probe_larger_than_a_day_allows_is_named(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "run"
    proc = run_train(run_dir, "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=2", "hdet=controller",
                     "hdet.signal=probe", "hdet.probe_rows=20000", data_cache=data_cache, timeout=120)
    _assert_clean_failure(proc, run_dir, "hdet.probe_rows=20000", "cannot fill one global batch")


def test_unknown_experiment_is_named(tmp_path, data_cache):
    proc = run_train(tmp_path / "run", "+experiment=no_such_preset", data_cache=data_cache, timeout=120)
    assert proc.returncode == 2, "bad config: exit status 2, as the README says"
    assert "experiment/no_such_preset" in proc.stderr
    assert "demo" in proc.stderr, "Hydra lists the available presets"
    assert not os.path.exists(tmp_path / "run" / "summary.json")


def _broken_copy(tiny_dataset, data_cache, tmp_path, name):
    """A copy of the tiny data set under a data cache of its own (so the fixture's stays intact)."""
    cache = tmp_path / "cache"
    shutil.copytree(tiny_dataset, cache / "tiny")
    shutil.copytree(tiny_dataset + ".raw", cache / "tiny.raw") if os.path.exists(tiny_dataset + ".raw") else None
    return str(cache), cache / "tiny"


def _first_day(root):
    return sorted(p for p in os.listdir(root) if p.endswith(".parquet"))[0]


def test_corrupt_parquet_is_named_before_training(tmp_path, data_cache, tiny_dataset):
    cache, root = _broken_copy(tiny_dataset, data_cache, tmp_path, "corrupt")
    day = _first_day(root)
    with open(root / day, "r+b") as f:
        f.seek(100)
        f.write(b"\x00garbage\x00" * 50)
    proc = run_train(tmp_path / "run", "data=tiny", "data.generator=null", data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", day)


def test_negative_id_and_nan_dense_are_named(tmp_path, data_cache, tiny_dataset):
    cache, root = _broken_copy(tiny_dataset, data_cache, tmp_path, "values")
    day = _first_day(root)
    df = pl.read_parquet(root / day)
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(-3).otherwise(pl.col("video_id")).alias("video_id"),
    )
    df.write_parquet(root / day)
    proc = run_train(tmp_path / "run", "data=tiny", "data.generator=null", data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", day, "video_id")

    dense = [c for c in df.columns if c.startswith("log_")][0]
    df = pl.read_parquet(tiny_dataset + "/" + day).with_columns(
        pl.when(pl.int_range(pl.len()) == 7).then(float("nan")).otherwise(pl.col(dense)).alias(dense)
    )
    df.write_parquet(root / day)
    proc = run_train(tmp_path / "run2", "data=tiny", "data.generator=null", data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run2", day, dense)


def test_missing_column_and_empty_partition_are_named(tmp_path, data_cache, tiny_dataset):
    cache, root = _broken_copy(tiny_dataset, data_cache, tmp_path, "schema")
    day = _first_day(root)
    pl.read_parquet(root / day).drop("label_like").write_parquet(root / day)
    proc = run_train(tmp_path / "run", "data=tiny", "data.generator=null", data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", day, "label_like")

    pl.read_parquet(tiny_dataset + "/" + day).head(0).write_parquet(root / day)
    proc = run_train(tmp_path / "run2", "data=tiny", "data.generator=null", data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run2", day)


def test_a_batch_larger_than_the_training_data_is_named(tmp_path, data_cache, tiny_dataset):
    proc = run_train(tmp_path / "run", "data=tiny", "data.batch_size=100000", data_cache=data_cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", "data.batch_size=100000", "less than one global batch")


def test_too_many_skipped_days_are_named(tmp_path, data_cache, tiny_dataset):
    proc = run_train(tmp_path / "run", "data=tiny", "data.skip_days=2", data_cache=data_cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", "data.skip_days=2")


def test_standard_exposure_on_data_without_is_rand_is_named(tmp_path, data_cache, tiny_dataset):
    # A data set processed before random exposure was recorded (the column dropped where it exists).
    cache, root = _broken_copy(tiny_dataset, data_cache, tmp_path, "no_is_rand")
    for day in os.listdir(root):
        if day.endswith(".parquet") and "is_rand" in pl.read_parquet_schema(root / day):
            pl.read_parquet(root / day).drop("is_rand").write_parquet(root / day)
    # ... and whose meta.json does not promise the column (format 2 writes has_is_rand and the
    # validator then requires it in every day file).
    meta_path = root / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("has_is_rand", None)
    meta_path.write_text(json.dumps(meta))
    proc = run_train(tmp_path / "run", "data=tiny", "data.generator=null", "data.train_exposure=standard",
                     data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", "data.train_exposure=standard", str(root), "'is_rand' column")


def test_own_row_groups_on_a_layout_1_data_set_is_named_with_the_command_that_rewrites_it(tmp_path, data_cache,
                                                                                         tiny_dataset):
    cache, root = _broken_copy(tiny_dataset, data_cache, tmp_path, "layout_1")
    meta_path = root / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("layout", None)  # written before layout 2
    meta_path.write_text(json.dumps(meta))
    proc = run_train(tmp_path / "run", "data=tiny", "data.generator=null", "data.read=own_row_groups",
                     data_cache=cache, timeout=120)
    _assert_clean_failure(proc, tmp_path / "run", "data.read=own_row_groups", "layout version 1",
                          f"python -m data_tools.relayout data.root={root}")
