"""``adopt freeze_lr=true`` (docs/operations.md, "Adopting a run"; pipelines/lr_freeze.py): the max LRs a run trained
with the range test on the replicas (``hdet=enabled``) committed become the job's overrides (``optim.lr.<group>``
each, ``hdet=disabled`` in place of ``hdet=enabled``), so the days train plain at them with no sweep; the adopted
version records what was frozen and from which run, and the days are compared with the run's config at the frozen
rates. A run that committed none is refused (exit 2, the run and the reason named, nothing written).

Fast tests on hand-made run directories (recorded configs, no training); the slow one trains a range-test run on
the tiny data, adopts it frozen and lets the job train the next day.
"""
import json
import os
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from conftest import read_json, run_command, run_train
from pipelines import retrain as R
from pipelines.lr_freeze import FROZEN_CONFIG, frozen_overrides
from pipelines.registry import Registry
from pipelines.registry_commands import adopted_overrides, adopted_settings
from pipelines.settings import FROZEN, changed_settings, job_settings
from data_tools.exit_status import ExitStatus

LAYOUT = ["trainer.nproc=2", "trainer.sharding_group_size=1"]  # two replicas: the range test needs 2 or more
# 12 sweep steps from x0.001 to x1e6: both sweeps reach their explosion on the tiny data (test_hdet_range_test.py)
RANGE_TEST = ["hdet=enabled", "hdet.range_test.steps=12", "hdet.range_test.low=0.001", "hdet.range_test.high=1000000"]
RUN = ["+experiment=retrain_daily", "data=tiny", *LAYOUT, *RANGE_TEST]  # the job's experiment, so the warm start fits
# publish whatever the tiny days score (the rates committed on the tiny data are far from tuned ones)
WIDE_GATE = ["gate.max_ne=100", "gate.calibration=[0.01,100]", "gate.ne_tolerance=100"]
COMMITTED = {"embedding": 0.0125893, "transformer": 0.000398107, "non_embedding": 0.000398107, "no_decay": 0.000398107}
SWEPT = "HDET range test committed"  # the line a sweep logs when it commits


def _overrides(entries):
    return "overrides=[" + ",".join(f"'{o}'" for o in entries) + "]"


def _recorded_run(path, overrides, commitment=None):
    """A finished run directory as load_run reads it: its recorded config and overrides, a completed summary and a
    final model whose meta records ``commitment`` (the range test's lr_commitment; None: none)."""
    from recsys_hdet.config import compose
    from recsys_hdet.run_dir import RunDir

    run = RunDir(str(path))
    os.makedirs(run.path(RunDir.HYDRA))
    os.makedirs(run.path(RunDir.CHECKPOINT))
    OmegaConf.save(compose("config", overrides), run.path(RunDir.CONFIG))
    OmegaConf.save(OmegaConf.create(list(overrides)), run.path(RunDir.OVERRIDES))
    with open(run.path(RunDir.SUMMARY), "w") as f:
        json.dump({"status": "completed"}, f)
    with open(os.path.join(run.path(RunDir.CHECKPOINT), ".metadata"), "w") as f:
        f.write("not a real model")
    with open(os.path.join(run.path(RunDir.CHECKPOINT), "meta.json"), "w") as f:
        json.dump({"steps": 10, **({"lr_commitment": commitment} if commitment else {})}, f)
    return SimpleNamespace(cfg=run.config(), files=run, run_dir=str(path))


def _commitment(committed=COMMITTED):
    return {"form": "range_test", "committed": committed, "cost": {"steps": 12, "seconds": 1.0},
            "range_test": {"start": {"embedding": 0.02, "transformer": 0.001, "non_embedding": 0.001,
                                     "no_decay": 0.001}, "committed": committed}}


def _tree(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_the_frozen_overrides_replace_the_range_test_and_the_max_lrs():
    run = ["data=tiny", "trainer.nproc=2", "hdet=enabled", "hdet.range_test.steps=12", "+hdet.range_test.x=1",
           "optim.lr.embedding=0.5", "optim.dense.type=adamw"]
    assert frozen_overrides(run, {"transformer": 1e-05, "embedding": 0.0125893}) == [
        "data=tiny", "trainer.nproc=2", "optim.dense.type=adamw", "hdet=disabled",
        "optim.lr.embedding=0.0125893", "optim.lr.transformer=1e-05"]


@pytest.mark.parametrize("hdet, commitment, why", [
    ([], None, "it trained plain (hdet.enabled=false)"),
    (RANGE_TEST, None, "it trained with HDET on but its final model records no range-test commit"),
    (["hdet=controller"], None, "it trained with HDET on but its final model records no range-test commit")])
def test_freeze_lr_on_a_run_without_a_range_test_commit_is_refused_and_nothing_is_written(tmp_path, tiny_dataset,
                                                                                         capsys, hdet, commitment, why):
    """Exit 2, one line naming the run, why and the file it read; no registry created, the run directory
    untouched (no evaluation ran: refused before it)."""
    run = _recorded_run(tmp_path / "run", ["+experiment=retrain_daily", "data=tiny", f"data.root={tiny_dataset}",
                                           *LAYOUT, *hdet], commitment)
    before = _tree(tmp_path / "run")
    capsys.readouterr()
    code = R.main(["adopt", f"run_dir={run.run_dir}", f"registry={tmp_path / 'registry'}", "freeze_lr=true",
                   *WIDE_GATE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitStatus.USAGE
    assert len(err) == 1 and err[0].startswith(f"error: run_dir={run.run_dir}: freeze_lr=true"), err
    assert why in err[0] and "committed none" in err[0] and "checkpoint/meta.json" in err[0], err
    assert "Traceback" not in err[0]
    assert not (tmp_path / "registry").exists() and _tree(tmp_path / "run") == before


def test_freeze_lr_is_an_option_of_adopt_only(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        R._main([f"registry={tmp_path}", f"data.root={tmp_path}", "freeze_lr=true"])
    assert e.value.code == ExitStatus.USAGE
    assert "freeze_lr: an option of `adopt`, not of `run`" in capsys.readouterr().err


def test_the_days_are_compared_with_the_runs_config_at_the_frozen_rates(tmp_path, tiny_dataset):
    """A range-test run of the job's preset adopted with its commit frozen: its overrides frozen; a day with them
    composes the frozen rates and hdet=disabled and is compared with the frozen config (nothing refused, nothing
    noted); the day with the run's own overrides (a sweep again) is refused naming the overrides and
    hdet.enabled; a day at other rates is refused naming the rate. Compared with the run's own config instead
    (a version without lr_frozen) the frozen day would be refused. Without freeze_lr the overrides are the run's,
    hdet=enabled kept (the days sweep, as before)."""
    from recsys_hdet.config import compose

    run = _recorded_run(tmp_path / "run", [*RUN, f"data.root={tiny_dataset}"], _commitment())
    cfg = R.compose(["registry=/x"], needs_data=False, command="adopt")
    plain = adopted_overrides(cfg, run, given=False)
    assert plain == ["data=tiny", *LAYOUT, *RANGE_TEST]
    unfrozen, overrides, reference = adopted_settings(cfg, run, False, {"committed": COMMITTED, "start": {}})
    assert unfrozen == plain
    assert overrides == ["data=tiny", *LAYOUT, "hdet=disabled", *(f"optim.lr.{g}={v!r}" for g, v in
                                                                  sorted(COMMITTED.items()))]
    version = tmp_path / "v0001"
    (version / ".hydra").mkdir(parents=True)
    OmegaConf.save(run.cfg, str(version / ".hydra" / "config.yaml"))
    OmegaConf.save(reference, str(version / FROZEN_CONFIG))
    cfg.overrides = overrides
    manifest = {"experiment": "retrain_daily", "adopted_from": run.run_dir, "settings": job_settings(cfg),
                FROZEN: {"config": FROZEN_CONFIG, "rates": COMMITTED}}

    def day(entries, parent=manifest):
        now = OmegaConf.merge(cfg, {"overrides": list(entries)})
        training = compose("config", ["+experiment=retrain_daily", *entries])
        return training, changed_settings(now, parent, str(version), training, "retrain_daily")

    training, frozen = day(overrides)
    assert {g: float(v) for g, v in training.optim.lr.items()} == COMMITTED and not training.hdet.enabled
    assert (frozen.refused, frozen.noted) == ([], [])
    _, sweep = day(plain)
    assert sweep.refused[0].startswith("overrides: ") and "hdet.enabled: False -> True" in sweep.refused, sweep.refused
    _, other_rate = day([o if not o.startswith("optim.lr.embedding=") else "optim.lr.embedding=0.02" for o in overrides])
    assert "optim.lr.embedding: 0.0125893 -> 0.02" in other_rate.refused, other_rate.refused
    _, against_the_run = day(overrides, {k: v for k, v in manifest.items() if k != FROZEN})
    assert "hdet.enabled: True -> False" in against_the_run.refused, against_the_run.refused
    assert "optim.lr.embedding: 0.02 -> 0.0125893" in against_the_run.refused, against_the_run.refused


@pytest.mark.slow  # a 2-rank range-test run, its adoption and one day of the job (~3 minutes on 2 cores)
def test_an_adopted_range_test_runs_rates_are_frozen_and_the_next_day_trains_plain_at_them(tmp_path, tiny_dataset,
                                                                                           data_cache):
    """For real: a range-test run of the daily preset (it sweeps and commits) adopted with freeze_lr=true: v0001
    records what was frozen and from which run, its settings the frozen overrides. The next day, run with them:
    its dry run passes, the day with the run's own overrides (a sweep again) is refused unless
    allow_config_change=true; the day trains and publishes v0002, whose config has the frozen rates and HDET
    off, whose log has no sweep and whose summary counts no range-test steps and trained at the frozen rates."""
    import shutil

    shutil.copytree(tiny_dataset, tmp_path / "data")
    run = tmp_path / "run"
    proc = run_train(run, *RUN, f"data.root={tmp_path / 'data'}", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SWEPT in proc.stdout and (run / "range_test.json").is_file()
    committed = read_json(run / "summary.json")["lr"]["max_lr"]
    assert committed == read_json(run / "checkpoint" / "meta.json")["lr_commitment"]["committed"]
    configured = read_json(run / "summary.json")["lr"]["configured_max_lr"]

    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    registry = tmp_path / "registry"
    adopt = run_command([sys.executable, "-m", "pipelines.retrain", "adopt", f"run_dir={run}", f"registry={registry}",
                         "freeze_lr=true", *WIDE_GATE], env=env, timeout=600)
    assert adopt.returncode == 0, adopt.stdout[-3000:] + adopt.stderr[-3000:]
    assert "froze the max LRs its range test committed" in adopt.stdout, adopt.stdout
    reg = Registry(str(registry))
    manifest = reg.manifest("v0001")
    frozen = ["data=tiny", *LAYOUT, "hdet=disabled", *(f"optim.lr.{g}={float(v)!r}" for g, v in sorted(committed.items()))]
    assert manifest["settings"]["overrides"] == frozen
    assert manifest[FROZEN] == {"from_run": str(run), "rates": committed, "configured": configured,
                                "removed": RANGE_TEST, "added": frozen[3:], "config": FROZEN_CONFIG}
    assert reg.verify("v0001") is None and FROZEN_CONFIG in manifest["files"]
    assert f"'{frozen[-1]}'" in adopt.stdout  # the overrides the days pass, printed whole
    status = run_command([sys.executable, "-m", "pipelines.retrain", "status", "json=true", f"registry={registry}"],
                         env=env, timeout=120)
    assert json.loads(status.stdout)["versions"][0]["lr_frozen"] == manifest[FROZEN], status.stdout + status.stderr
    status = run_command([sys.executable, "-m", "pipelines.retrain", "status", f"registry={registry}"], env=env,
                         timeout=120)
    assert f"LRs frozen from {run}: " in status.stdout, status.stdout

    days = sorted(read_json(tmp_path / "data" / "meta.json")["days"])
    job = [f"registry={registry}", f"data.root={tmp_path / 'data'}", *WIDE_GATE]
    again = run_command([sys.executable, "-m", "pipelines.retrain", *job, _overrides(["data=tiny", *LAYOUT, *RANGE_TEST]),
                         "dry_run=true"], env=env, timeout=600)
    assert again.returncode == ExitStatus.USAGE and "REFUSED" in again.stderr, again.stdout + again.stderr
    assert "hdet.enabled: False -> True" in again.stderr and "overrides: " in again.stderr, again.stderr
    allowed = run_command([sys.executable, "-m", "pipelines.retrain", *job, _overrides(["data=tiny", *LAYOUT, *RANGE_TEST]),
                           "allow_config_change=true", "dry_run=true"], env=env, timeout=600)
    assert allowed.returncode == ExitStatus.OK, allowed.stdout + allowed.stderr
    dry = run_command([sys.executable, "-m", "pipelines.retrain", *job, _overrides(frozen), "dry_run=true"], env=env,
                      timeout=600)
    assert dry.returncode == ExitStatus.OK and "note:" not in dry.stdout, dry.stdout + dry.stderr

    day = run_command([sys.executable, "-m", "pipelines.retrain", *job, _overrides(frozen)], env=env, timeout=900)
    assert day.returncode == ExitStatus.OK, day.stdout[-3000:] + day.stderr[-3000:]
    assert f"day {days[-1]}: PUBLISHED v0002 (parent v0001)" in day.stdout, day.stdout
    v2 = registry / "versions" / "v0002"
    config = OmegaConf.load(v2 / ".hydra" / "config.yaml")
    assert {g: float(v) for g, v in config.optim.lr.items()} == committed and config.hdet.enabled is False
    assert config.trainer.warm_start == str(registry / "versions" / "v0001" / "checkpoint")
    log = (v2 / "train.log").read_text()
    assert SWEPT not in log and "reusing the commit" not in log, log[-3000:]
    summary = read_json(v2 / "summary.json")
    assert summary["status"] == "completed" and "range_test" not in summary["cost"] and "hdet" not in summary
    assert summary["lr"]["max_lr"] == summary["lr"]["configured_max_lr"] == committed
    assert reg.manifest("v0002")["settings"]["overrides"] == frozen and reg.current() == "v0002"
