"""The README's path from one's own data to the daily job, end to end, as a user runs it: KuaiRand-schema
CSVs (the synthetic generator's, in KuaiRand's format) converted and validated, a run trained with the
daily preset on ``data=kuairand``, evaluated, exported and scored with ``predict``, adopted as the
registry's version 1, a new day's log appended, and the retraining job run on it (publishing with
``export_on_publish``, or rejecting: both are the job working), then ``status``."""

import json
import os
import sys

import pytest

from conftest import run_command

GENERATOR = ["--seed", "5", "--n-users", "600", "--n-videos", "1500", "--n-authors", "300", "--n-music", "200",
             "--n-tags", "60", "--days", "4", "--impressions-per-day", "20000", "--signal-scale", "1.5",
             "--target-contribution", "0.06", "--target-like", "0.12", "--target-long-dwell", "0.35"]
LAYOUT = ["trainer.nproc=2", "trainer.sharding_group_size=1", "data.batch_size=64"]  # enough steps to calibrate


def _run(*args, timeout=900):
    proc = run_command([sys.executable, "-m", *args], timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode in (0,), f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_from_kuairand_csvs_to_the_daily_job(tmp_path):
    raw, data, run, model, registry = (tmp_path / n for n in ("raw", "data", "run", "model", "registry"))
    _run("data_tools.generate", "--out", str(raw), *GENERATOR)
    lines = (raw / "log_synthetic.csv").read_text().splitlines(keepends=True)
    date = lines[0].rstrip("\n").split(",").index("date")
    days = sorted({line.split(",")[date] for line in lines[1:]})
    (raw / "log_first.csv").write_text("".join([lines[0], *(x for x in lines[1:] if x.split(",")[date] != days[-1])]))
    (raw / "log_new_day.csv").write_text("".join([lines[0], *(x for x in lines[1:] if x.split(",")[date] == days[-1])]))
    features = ["--users", str(raw / "user_features_synthetic.csv"), "--videos", str(raw / "video_features_basic_synthetic.csv")]
    # 1. convert, validate
    _run("data_tools.convert", "--log", str(raw / "log_first.csv"), *features, "--out", str(data))
    _run("data_tools.validate", str(data))
    # 2. train every day but the last (held out), with the daily preset on data=kuairand
    _run("recsys_hdet.train", "+experiment=retrain_daily", "data=kuairand", f"data.root={data}", *LAYOUT,
         f"hydra.run.dir={run}")
    # 3. evaluate; export; score the held-out day with the artifact
    ev = _run("recsys_hdet.evaluate", f"run_dir={run}")
    assert f"report: {run / 'report.html'}" in ev.stdout
    _run("recsys_hdet.export", f"run_dir={run}", f"out={model}")
    _run("recsys_hdet.predict", f"model_dir={model}", f"input={data}", f"out={tmp_path / 'scores.parquet'}")
    assert (tmp_path / "scores.parquet").is_file()
    # 4. the trained run becomes version 1; a new day arrives; the job trains it, gates, publishes or rejects
    job = [f"registry={registry}", f"data_root={data}", "overrides=[" + ",".join(f"'{o}'" for o in ("data=kuairand", *LAYOUT)) + "]"]
    adopted = _run("pipelines.retrain", "adopt", f"run_dir={run}", *job)
    assert "adopted" in adopted.stdout and "current: v0001" in adopted.stdout
    _run("data_tools.convert", "--append-to", str(data), "--log", str(raw / "log_new_day.csv"), *features)
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
