"""The retraining job's checks before anything trains (docs/operations.md, "Bad input" and "Settings between
days"): a damaged input file ends the job as bad input before any worker starts; the dry run makes every check
the run makes and exits as the run does; a changed key of how the run executes is noted, not refused.

Fast tests on hand-made registries (the tiny data set, no training); the slow one trains two days for real.
"""
import json
import os
import shutil

import pytest
from omegaconf import OmegaConf

from pipelines import retrain as R
from pipelines.day_plan import DayPlan
from pipelines.day_training import training_overrides
from pipelines.registry import Registry
from pipelines.settings import changed_settings, job_settings
from data_tools.exit_status import ExitStatus
from test_retrain import _main, _version

HOLDOUT = {"fraction": 0.1, "seed": 0}  # conf/retrain.yaml's: the job's own
LAYOUT = ["trainer.nproc=1", "trainer.sharding_group_size=1"]  # the published version's workers
RERUN_WONT_HELP = "fix or restore the file; a rerun will not help"


def _overrides(*entries):
    return "overrides=[" + ",".join(f"'{o}'" for o in entries) + "]"


def _data(tmp_path, tiny_dataset):
    """A copy of the tiny data set: (its days, {day: its file})."""
    shutil.copytree(tiny_dataset, tmp_path / "data")
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    return sorted(meta["days"]), {d: tmp_path / "data" / spec["file"] for d, spec in meta["days"].items()}


def _registry_files(tmp_path):
    """Every file of the registry with its bytes (the lock file is the job's, empty)."""
    return {str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "registry").rglob("*")
            if p.is_file() and p.name != ".lock"}


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _label_outside_0_1(path):
    import polars as pl

    df = pl.read_parquet(path)
    df.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(2.0).otherwise(pl.col("label_like"))
                    .cast(df.schema["label_like"]).alias("label_like")).write_parquet(path)


@pytest.mark.parametrize("which, damage", [("middle day", "deleted"), ("middle day", "truncated"),
                                           ("newest day", "a label outside {0, 1}"), ("meta file", "truncated")])
def test_a_damaged_input_file_ends_the_job_as_bad_input_before_any_worker_starts(tmp_path, tiny_dataset, capsys,
                                                                                  which, damage):
    """v0001 published on the first two days; the job would train the third, warm. A day file the run reads
    (the middle day: not in the day's window, but the run validates the whole data set) or the meta file,
    damaged: the run and its dry run exit 2 with one line naming the file and saying a rerun will not help;
    no run directory (no worker started), the registry's versions and current unchanged. Before: a damaged
    middle day started the training run, which failed on it (exit 1, "a rerun resumes it")."""
    days, files = _data(tmp_path, tiny_dataset)
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, days[:2], holdout=HOLDOUT)
    path = {"middle day": files[days[1]], "newest day": files[days[2]],
            "meta file": tmp_path / "data" / "meta.json"}[which]
    {"deleted": os.remove, "truncated": _truncate, "a label outside {0, 1}": _label_outside_0_1}[damage](path)
    before = _registry_files(tmp_path)
    capsys.readouterr()

    assert _main(tmp_path) == ExitStatus.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and RERUN_WONT_HELP in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "registry" / "work").exists()  # no run directory, no train.log: nothing started
    assert (reg.list_versions(), reg.current()) == (["v0001"], "v0001")
    after = _registry_files(tmp_path)
    events = [json.loads(line) for line in after["registry/retrain.jsonl"].decode().splitlines()]
    assert {k: v for k, v in after.items() if k != "registry/retrain.jsonl"} == \
        {k: v for k, v in before.items() if k != "registry/retrain.jsonl"}
    if which != "meta file":  # the day was planned: its event names the file (the meta file stops before planning)
        assert events[-1]["event"] == "bad_input" and str(path) in events[-1]["reason"], events[-1]

    assert _main(tmp_path, "dry_run=true") == ExitStatus.USAGE  # the dry run: the same check, the same status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and RERUN_WONT_HELP in err[0], err
    assert _registry_files(tmp_path) == after  # and it writes nothing


def _published_with_its_config(tmp_path, days, overrides):
    """v0001 as the job records a cold start on the first day: its settings (``overrides``) and its run's
    resolved training config, which the next day's is compared with."""
    from recsys_hdet.api import compose_config

    cfg = R.compose([f"registry={tmp_path / 'registry'}", f"data.root={tmp_path / 'data'}", _overrides(*overrides)])
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, days[:1], experiment="retrain_daily",
             settings=job_settings(cfg), holdout=HOLDOUT)
    cold = compose_config(training_overrides(cfg, DayPlan(days[0], days[:1], True), days, None, {}))
    os.makedirs(os.path.join(reg.version_dir("v0001"), ".hydra"))
    OmegaConf.save(cold, os.path.join(reg.version_dir("v0001"), ".hydra", "config.yaml"), resolve=True)
    return reg


def test_the_dry_run_exits_as_the_run_does_and_an_execution_key_is_noted(tmp_path, tiny_dataset, capsys):
    """Another worker count is refused (exit 2, its reason stated) by the run and, before, not by the dry
    run (it said "would train", exit 0); a changed thread count is noted and allowed; a changed key under
    allow_config_change=true is logged; an override the training config does not have is refused by both
    (before: a traceback)."""
    days, _ = _data(tmp_path, tiny_dataset)
    reg = _published_with_its_config(tmp_path, days, LAYOUT)
    before = _registry_files(tmp_path)
    capsys.readouterr()

    more_workers = _overrides("trainer.nproc=2", "trainer.sharding_group_size=1")
    assert _main(tmp_path, more_workers, "dry_run=true") == ExitStatus.USAGE
    dry = capsys.readouterr()
    assert f"would train day {days[1]}" in dry.out
    assert _main(tmp_path, more_workers) == ExitStatus.USAGE
    real = capsys.readouterr().err
    for err in (dry.err, real):
        assert "REFUSED" in err and "trainer.nproc: 1 -> 2 (data.batch_size is per worker" in err, err
    assert not (tmp_path / "registry" / "work").exists() and reg.list_versions() == ["v0001"]

    assert _main(tmp_path, more_workers, "allow_config_change=true", "dry_run=true") == ExitStatus.OK
    assert "(allow_config_change=true): overrides:" in capsys.readouterr().out

    threads = _overrides(*LAYOUT, "trainer.threads_per_worker=1")
    assert _main(tmp_path, threads, "dry_run=true") == ExitStatus.OK
    out = capsys.readouterr().out
    assert "note: changed since the published version v0001's, allowed" in out, out
    assert "trainer.threads_per_worker: None -> 1" in out, out

    for dry_run in (["dry_run=true"], []):
        assert _main(tmp_path, _overrides(*LAYOUT, "trainer.no_such_key=1"), *dry_run) == ExitStatus.USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "does not compose" in err[0] and "no_such_key" in err[0], err
    after = _registry_files(tmp_path)
    after.pop("registry/retrain.jsonl")  # the run's two refusals are logged there
    assert after == {k: v for k, v in before.items() if k != "registry/retrain.jsonl"}


def test_which_changed_keys_refuse_a_day_and_which_are_noted(tmp_path):
    """Between the published version's resolved config and the day's: the worker count and the sharding
    group size refuse the day, each with its reason; the keys of how the run executes (threads, logging and
    checkpoint cadence) are notes, and so is an ``overrides`` list that differs only in such keys."""
    base = {"experiment": "retrain_daily", "cold_start_experiment": "retrain_daily", "carry_lr": False,
            "carry_lr_clamp": 4.0, "seed": 0}
    was = OmegaConf.create({"trainer": {"nproc": 2, "sharding_group_size": 1, "threads_per_worker": None,
                                        "log_every": 25, "periodic_checkpoint": {"every_steps": 50}},
                            "model": {"dropout": 0.0}})
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(was, str(tmp_path / ".hydra" / "config.yaml"))

    def compare(published_overrides, overrides, **changed):
        now = OmegaConf.merge(was, {})
        for key, value in changed.items():
            OmegaConf.update(now, key, value)
        parent = {"experiment": "retrain_daily", "settings": {**base, "overrides": published_overrides}}
        cfg = OmegaConf.create({**base, "overrides": overrides})
        return changed_settings(cfg, parent, str(tmp_path), now, "retrain_daily")

    noted = compare([], ["trainer.threads_per_worker=2", "trainer.log_every=5"],
                    **{"trainer.threads_per_worker": 2, "trainer.log_every": 5,
                       "trainer.periodic_checkpoint.every_steps": 10})
    assert noted.refused == []
    assert noted.noted == ["overrides: [] -> ['trainer.threads_per_worker=2', 'trainer.log_every=5']",
                           "trainer.log_every: 25 -> 5", "trainer.periodic_checkpoint.every_steps: 50 -> 10",
                           "trainer.threads_per_worker: None -> 2"]
    refused = compare([], ["trainer.nproc=4", "trainer.sharding_group_size=2"],
                      **{"trainer.nproc": 4, "trainer.sharding_group_size": 2})
    assert refused.noted == [] and refused.refused[0].startswith("overrides: [] -> ")
    assert refused.refused[1].startswith("trainer.nproc: 2 -> 4 (data.batch_size is per worker")
    assert refused.refused[2].startswith("trainer.sharding_group_size: 1 -> 2 (trainer.nproc / "
                                         "trainer.sharding_group_size is the number of embedding replicas")
    mixed = compare(["trainer.log_every=5"], ["model.dropout=0.1"], **{"model.dropout": 0.1, "trainer.log_every": 25})
    assert mixed.refused == ["overrides: ['trainer.log_every=5'] -> ['model.dropout=0.1']", "model.dropout: 0.0 -> 0.1"]
    assert mixed.noted == []  # log_every equals the saved config's (25): the config has nothing to note


@pytest.mark.slow
def test_a_changed_execution_key_trains_with_the_note_and_another_worker_count_is_refused(tmp_path, tiny_dataset,
                                                                                         capsys):
    """For real: a cold start on the first day (v0001); the second day with trainer.threads_per_worker=1 added
    trains and publishes v0002 (the note logged, the version's settings holding the new override); the third
    day with two workers is refused, its dry run too, with the same status (the registry unchanged)."""
    days, _ = _data(tmp_path, tiny_dataset)
    wide_gate = ["gate.max_ne=100", "gate.calibration=[0.01,100]"]  # publish whatever the tiny days score
    assert _main(tmp_path, _overrides(*LAYOUT), f"until={days[0]}", "create=true", *wide_gate) == ExitStatus.OK
    capsys.readouterr()
    threads = [*LAYOUT, "trainer.threads_per_worker=1"]
    assert _main(tmp_path, _overrides(*threads), f"until={days[1]}", *wide_gate) == ExitStatus.OK
    out = capsys.readouterr().out
    assert f"day {days[1]}: note: changed since the published version v0001's, allowed" in out, out
    assert "trainer.threads_per_worker: None -> 1" in out and f"day {days[1]}: PUBLISHED v0002" in out, out
    reg = Registry(str(tmp_path / "registry"))
    assert reg.current() == "v0002" and reg.manifest("v0002")["settings"]["overrides"] == threads
    more_workers = _overrides("trainer.nproc=2", "trainer.sharding_group_size=1", "trainer.threads_per_worker=1")
    codes = [_main(tmp_path, more_workers, *dry, *wide_gate) for dry in (["dry_run=true"], [])]
    assert codes == [ExitStatus.USAGE, ExitStatus.USAGE]
    assert "trainer.nproc: 1 -> 2 (data.batch_size is per worker" in capsys.readouterr().err
    assert reg.list_versions() == ["v0001", "v0002"] and not (tmp_path / "registry" / "work").exists()


def test_an_adopted_run_of_another_preset_is_compared_key_by_key(tmp_path):
    """A version adopted from a run of another preset (``adopted_from``, its ``experiment`` the run's): the day's
    config is compared with the run's saved config by the same key table (a changed max LR refused, a changed
    thread count noted), where a cold start of another preset is compared on the settings alone. Before: an
    adopted ``demo`` run's days switched its LRs 0.05/0.002 -> 0.02/0.001 without a word."""
    base = {"experiment": "retrain_daily", "cold_start_experiment": "retrain_daily", "carry_lr": False,
            "carry_lr_clamp": 4.0, "seed": 0, "overrides": []}
    was = OmegaConf.create({"experiment_name": "demo", "optim": {"lr": {"embedding": 0.05, "transformer": 0.002}},
                            "trainer": {"threads_per_worker": None}})
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(was, str(tmp_path / ".hydra" / "config.yaml"))
    now = OmegaConf.create({"experiment_name": "retrain_daily", "optim": {"lr": {"embedding": 0.02, "transformer": 0.001}},
                            "trainer": {"threads_per_worker": 2}})
    cfg = OmegaConf.create(base)
    adopted = changed_settings(cfg, {"experiment": "demo", "adopted_from": "/runs/demo", "settings": base},
                               str(tmp_path), now, "retrain_daily")
    assert adopted.refused == ["optim.lr.embedding: 0.05 -> 0.02", "optim.lr.transformer: 0.002 -> 0.001"]
    assert adopted.noted == ["trainer.threads_per_worker: None -> 2"]  # experiment_name: a label, not compared
    cold = changed_settings(cfg, {"experiment": "demo", "settings": base}, str(tmp_path), now, "retrain_daily")
    assert (cold.refused, cold.noted) == ([], [])
