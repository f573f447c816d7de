"""The README's path from one's own data to the daily job, end to end, as a user runs it: KuaiRand-schema
CSVs (the synthetic generator's, in KuaiRand's format) converted and validated, a run trained with the
daily preset on ``data=kuairand``, evaluated, exported and scored with ``predict``, adopted as the
registry's version 1 (its data preset and layout read from the run's recorded config), a new day's log appended, and the retraining job run on it (publishing with
``export_on_publish``, or rejecting: both are the job working), then ``status``."""

import json
import os
import sys

import pytest

from conftest import run_command

GENERATOR = ["seed=5", "n_users=600", "n_videos=1500", "n_authors=300", "n_music=200", "n_tags=60", "days=4",
             "impressions_per_day=20000", "signal_scale=1.5", "target_contribution=0.06", "target_like=0.12",
             "target_long_dwell=0.35"]
LAYOUT = ["trainer.nproc=2", "trainer.sharding_group_size=1", "data.batch_size=64"]  # enough steps to calibrate


def _run(*args, timeout=900):
    proc = run_command([sys.executable, "-m", *args], timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode in (0,), f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_from_kuairand_csvs_to_the_daily_job(tmp_path):
    raw, data, run, model, registry = (tmp_path / n for n in ("raw", "data", "run", "model", "registry"))
    _run("data_tools.generate", f"out={raw}", *GENERATOR)
    lines = (raw / "log_synthetic.csv").read_text().splitlines(keepends=True)
    date = lines[0].rstrip("\n").split(",").index("date")
    days = sorted({line.split(",")[date] for line in lines[1:]})
    (raw / "log_first.csv").write_text("".join([lines[0], *(x for x in lines[1:] if x.split(",")[date] != days[-1])]))
    (raw / "log_new_day.csv").write_text("".join([lines[0], *(x for x in lines[1:] if x.split(",")[date] == days[-1])]))
    features = [f"users={raw / 'user_features_synthetic.csv'}", f"videos={raw / 'video_features_basic_synthetic.csv'}"]
    # 1. convert, validate
    _run("data_tools.convert", f"log={raw / 'log_first.csv'}", *features, f"data.root={data}")
    _run("data_tools.validate", f"data.root={data}")
    # 2. train every day but the last (held out), with the daily preset on data=kuairand
    _run("recsys_hdet.train", "+experiment=retrain_daily", "data=kuairand", f"data.root={data}", *LAYOUT,
         f"run_dir={run}")
    # 3. evaluate; export; score the held-out day with the artifact
    ev = _run("recsys_hdet.evaluate", f"run_dir={run}")
    assert f"report: {run / 'report.html'}" in ev.stdout
    _run("recsys_hdet.export", f"run_dir={run}", f"out={model}")
    _run("recsys_hdet.predict", f"model_dir={model}", f"data.root={data}", f"out={tmp_path / 'scores.parquet'}")
    assert (tmp_path / "scores.parquet").is_file()
    # 4. the trained run becomes version 1; a new day arrives; the job trains it, gates, publishes or rejects
    # adopt reads the run's data preset and layout from its recorded config (no overrides=); the daily job
    # repeats them in overrides= (a setting of every version: a day trained otherwise is refused)
    adopted = _run("pipelines.retrain", "adopt", f"run_dir={run}", f"registry={registry}")
    assert "adopted" in adopted.stdout and "current: v0001" in adopted.stdout
    assert json.loads((registry / "versions" / "v0001" / "manifest.json").read_text())["settings"]["overrides"] == [
        "data=kuairand", *LAYOUT]
    job = [f"registry={registry}", f"data.root={data}", "overrides=[" + ",".join(f"'{o}'" for o in ("data=kuairand", *LAYOUT)) + "]"]
    _run("data_tools.convert", f"data.root={data}", "append=true", f"log={raw / 'log_new_day.csv'}", *features)
    proc = run_command([sys.executable, "-m", "pipelines.retrain", *job, "export_on_publish=true"], timeout=1500,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode in (0, 4), proc.stdout[-3000:] + proc.stderr[-3000:]
    # The run's held-out day, then the appended one: each trained warm, one version each.
    manifests = [json.loads((registry / "versions" / v / "manifest.json").read_text()) for v in ("v0002", "v0003")]
    assert [m["train_days"] for m in manifests] == [[days[-2]], [days[-1]]]
    assert manifests[0]["parent"] == "v0001"
    if proc.returncode == 0:
        assert (registry / "current" / "export" / "model.pt2").is_file()
    status = _run("pipelines.retrain", "status", f"registry={registry}")
    assert "v0001" in status.stdout and "v0003" in status.stdout
