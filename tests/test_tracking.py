"""``tracking=mlflow`` (issue 58): a tiny run trained, evaluated and exported into a real local MLflow file store,
read back with MLflow's own client: the resolved config as params, the training metrics per step and the held-out
metrics, summary.json, the report and the exported model as artifacts, a retraining day's gate decision."""

import os
import sys

import pytest

from conftest import read_jsonl, run_command, run_evaluate, run_train

mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed: pip install 'recsys-hdet[mlflow]' "
                                              "(make setup installs it; CI runs these tests)")


def _artifacts(client, run_id, path=None):
    out = []
    for f in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, f.path) if f.is_dir else [f.path]
    return out


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_dataset, data_cache):
    """A tiny run with tracking=mlflow into its own file store, then evaluated and exported."""
    tmp = tmp_path_factory.mktemp("tracked")
    run_dir, store = tmp / "run", tmp / "mlruns"
    proc = run_train(run_dir, "data=tiny", "trainer.nproc=1", "trainer.sharding_group_size=1", "trainer.log_every=5",
                     "experiment_name=tracked", "tracking=mlflow", f"tracking.uri={store}", data_cache=data_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_evaluate(f"run_dir={run_dir}", data_cache=data_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    proc = run_command([sys.executable, "-m", "recsys_hdet.export", f"run_dir={run_dir}", f"out={tmp / 'model'}"],
                       env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from recsys_hdet.tracking import tracked_run as tracked

    uri = tracked(str(run_dir))["tracking_uri"]
    assert uri == f"sqlite:///{store}/mlflow.db", uri  # a directory given: a local store there
    return run_dir, uri


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_a_run_is_read_back_from_mlflow_with_params_metrics_and_artifacts(tracked_run):
    from mlflow.tracking import MlflowClient

    from recsys_hdet.run_dir import RunDir

    run_dir, uri = tracked_run
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tracked")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "run" and runs[0].info.status == "FINISHED"
    run = runs[0]
    # the resolved config, every leaf a param
    params = run.data.params
    assert params["optim.lr.embedding"] == "0.05" and params["data.name"] == "tiny" and params["tracking.backend"] == "mlflow"
    from omegaconf import OmegaConf

    from recsys_hdet.config_values import flatten

    assert params["data.root"].startswith("/")
    assert set(params) == set(flatten(OmegaConf.to_container(RunDir(run_dir).config(), resolve=True)))
    # the training metrics, one point per metrics.jsonl record
    records = [r for r in read_jsonl(os.path.join(run_dir, RunDir.METRICS)) if "loss" in r]
    history = client.get_metric_history(run.info.run_id, "train/loss/avg")
    assert [m.step for m in history] == [r["step"] for r in records]
    assert [m.value for m in history] == pytest.approx([r["loss"]["avg"] for r in records])
    assert len(history) >= 2
    summary = RunDir(str(run_dir)).summary()
    for task, m in summary["eval"].items():  # held out: the summary's, at the last step; evaluate's beside them
        assert run.data.metrics[f"heldout/ne/{task}"] == pytest.approx(m["ne"])
        assert f"eval/auc/{task}" in run.data.metrics
        assert [h.step for h in client.get_metric_history(run.info.run_id, f"heldout/ne/{task}")] == [summary["steps"]]
    assert {"train/lr/embedding", "train/examples_per_s"} <= set(run.data.metrics)
    artifacts = _artifacts(client, run.info.run_id)
    for path in ("summary.json", ".hydra/config.yaml", "train.log", "eval.json", "report.html", "export/manifest.json",
                 "export/model.pt2"):
        assert path in artifacts, artifacts
    assert os.path.isfile(os.path.join(os.path.dirname(uri[len("sqlite:///"):]), "artifacts", "tracked",
                                       run.info.run_id, "artifacts", "summary.json"))


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_a_retraining_days_gate_decision_is_logged_on_its_run(tracked_run):
    from mlflow.tracking import MlflowClient

    from recsys_hdet.tracking import log_gate, tracked_run as tracked

    run_dir, uri = tracked_run
    state = tracked(str(run_dir))
    decision = {"decision": "rejected", "reasons": ["like: NE 0.9700 worse"],
                "tasks": {"like": {"candidate_ne": 0.97, "published_ne": 0.95, "candidate_calibration": 1.1}}}
    log_gate(state, "20220410", decision, "v0002")
    run = MlflowClient(tracking_uri=uri).get_run(state["run_id"])
    assert run.data.tags["gate.decision"] == "rejected" and run.data.tags["registry.version"] == "v0002"
    assert run.data.tags["registry.published"] == "False" and "worse" in run.data.tags["gate.reasons"]
    assert run.data.metrics["gate/candidate_ne/like"] == pytest.approx(0.97)
    assert run.data.metrics["gate/published_ne/like"] == pytest.approx(0.95)


def test_tracking_mlflow_without_mlflow_installed_is_refused_before_training(monkeypatch):
    import importlib.util

    from recsys_hdet.config_values import ConfigError
    from recsys_hdet.job_schema import TrackingConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install 'recsys-hdet\\[mlflow\\]'"):
        TrackingConfig(backend="mlflow")
