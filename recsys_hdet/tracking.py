"""MLflow tracking beside TensorBoard (``tracking=mlflow``, the config group conf/tracking/; the optional extra
``pip install 'recsys-hdet[mlflow]'``).

Design:

- The run directory stays the record; MLflow gets a copy of it, as TensorBoard does, so the two never
  disagree: the resolved config (``RunDir.CONFIG``) as params (dotted keys, ``optim.lr.embedding``), every
  ``RunDir.METRICS`` record as metrics at its step (``train/loss/<task>``, ``train/lr/<group>``,
  ``train/ne/<task>``, ...), the held-out metrics of ``RunDir.SUMMARY`` at the last step (``heldout/<metric>/<task>``),
  ``summary.json``, the config and ``train.log`` as artifacts; the MLflow run is named after the run directory
  and ends FINISHED (exit status 0) or FAILED.
- The training command logs once its workers are done, from the launching process (never from a worker: one
  writer, no MLflow import in the training loop), so a metric appears in MLflow when the job ends, not while
  it trains (TensorBoard shows the live curves). A resumed job logs into the same MLflow run the steps it added
  (``RunDir.TRACKING`` records the store, the run id and the last step logged).
- Later commands log into the run's MLflow run when its directory has one: ``evaluate`` its metrics
  (``eval/<metric>/<task>``), ``eval.json`` and ``report.html``; ``export`` the serving artifact (``export/``);
  the retraining job each day's gate decision and version (tags ``gate.*``, ``registry.*``; metrics
  ``gate/...``) on the day's run (train the days with ``overrides=[tracking=mlflow]``).
- The store (:func:`store`): ``tracking.uri`` (a server, or a local directory), else ``MLFLOW_TRACKING_URI``,
  else the local store ``outputs/mlflow/`` of the working directory (``mlflow.db`` and ``artifacts/``;
  ``mlflow ui --backend-store-uri sqlite:///outputs/mlflow/mlflow.db``).

Limits: a tracking failure (a server that is down) is a warning, never the run's failure: the run directory
holds everything; mlflow is imported only here, and only when a run asks for it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from data_tools.fileio import read_json, read_jsonl, write_json_atomic
from recsys_hdet.config_values import flatten
from recsys_hdet.run_dir import RunDir

DEFAULT_STORE = os.path.join("outputs", "mlflow")  # the working directory's, beside the runs' outputs/<experiment>/
TRAIN_METRICS = ("loss", "lr", "ne", "calibration", "auc")  # RunDir.METRICS's per-task or per-group figures
HELD_OUT = ("ne", "auc", "logloss", "calibration")


def enabled(cfg: Any) -> bool:
    """Whether ``cfg`` (a training config; one recorded before tracking existed has none) asks for MLflow."""
    tracking = cfg.get("tracking") if hasattr(cfg, "get") else None
    return bool(tracking) and str(tracking.get("backend")) == "mlflow"


def store(uri: Optional[str]) -> Tuple[str, Optional[str]]:
    """(the tracking URI, the artifact root of the experiments this module creates; None: the server's). ``uri``
    with a scheme (``http://...``, ``sqlite:///...``, ``databricks``) is MLflow's; a path, a local store in that
    directory (``mlflow.db`` and ``artifacts/``); none, ``MLFLOW_TRACKING_URI``, else the local store
    :data:`DEFAULT_STORE`. (A local store is SQLite: MLflow 3 refuses its file store, ``./mlruns``, unless
    ``MLFLOW_ALLOW_FILE_STORE=true``; ``tracking.uri=file:/path`` still names one.)"""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_STORE
    if ":" in uri:
        return uri, None
    root = os.path.abspath(uri)
    os.makedirs(root, exist_ok=True)
    return f"sqlite:///{os.path.join(root, 'mlflow.db')}", "file:" + os.path.join(root, "artifacts")


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _log(client: Any, run_id: str, metrics: Iterable[tuple] = (), params: Mapping[str, Any] = {},
         tags: Mapping[str, Any] = {}) -> None:
    """Metrics ``(key, value, step)``, params and tags in MLflow's batches (at most 1000 metrics, 100 params)."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    points = [Metric(k, v, now, int(step)) for k, v, step in metrics if _number(v) is not None]
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i:i + 1000])
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i:i + 100])
    if tags:
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def _metric_points(record: Mapping[str, Any]) -> List[tuple]:
    step = int(record["step"])
    points = [(f"train/{m}/{name}", v, step) for m in TRAIN_METRICS for name, v in (record.get(m) or {}).items()]
    return points + [("train/examples_per_s", record.get("examples_per_sec"), step)]


def _warn(what: str, e: BaseException) -> None:
    print(f"warning: tracking: MLflow {what} failed ({type(e).__name__}: {e}); the run directory holds it all",
          file=sys.stderr, flush=True)


def log_training(cfg: Any, run_dir: str, exit_status: int, summary: Optional[Mapping[str, Any]]) -> None:
    """The finished job of ``run_dir`` (its config ``cfg``) as an MLflow run (see the module); nothing unless
    ``tracking=mlflow``."""
    if not enabled(cfg):
        return
    try:
        _log_training(cfg, run_dir, exit_status, summary)
    except Exception as e:  # noqa: BLE001 - the run is complete whatever the tracker says
        _warn("logging", e)


def _log_training(cfg: Any, run_dir: str, exit_status: int, summary: Optional[Mapping[str, Any]]) -> None:
    from omegaconf import OmegaConf

    files = RunDir(run_dir)
    state_path = files.path(RunDir.TRACKING)
    state = read_json(state_path) if os.path.isfile(state_path) else None
    if state is None:
        uri, artifacts = store(cfg.tracking.uri)
        client = _client(uri)
        name = str(cfg.tracking.experiment or cfg.experiment_name)
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(
            name, artifact_location=artifacts and f"{artifacts}/{name}")
        run = client.create_run(experiment_id, run_name=os.path.basename(os.path.abspath(run_dir)),
                                tags={"run_dir": os.path.abspath(run_dir), "mlflow.source.name": "recsys_hdet.train"})
        state = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run.info.run_id, "logged_step": 0}
        write_json_atomic(state_path, state)
        config = OmegaConf.to_container(files.config(), resolve=True)
        _log(client, state["run_id"], params=flatten(config))
    client = _client(state["tracking_uri"])
    records = [r for r in read_jsonl(files.path(RunDir.METRICS)) if "step" in r and r["step"] > state["logged_step"]] \
        if os.path.isfile(files.path(RunDir.METRICS)) else []
    points = [p for r in records for p in _metric_points(r)]
    if summary and summary.get("eval"):
        step = int(summary["steps"])
        points += [(f"heldout/{m}/{task}", values.get(m), step) for task, values in summary["eval"].items() for m in HELD_OUT]
    _log(client, state["run_id"], points, tags={"status": (summary or {}).get("status", "failed"),
                                                "exit_status": exit_status})
    for name in (RunDir.SUMMARY, RunDir.CONFIG, RunDir.TRAIN_LOG):
        if os.path.isfile(files.path(name)):
            client.log_artifact(state["run_id"], files.path(name), os.path.dirname(name) or None)
    client.set_terminated(state["run_id"], "FINISHED" if exit_status == 0 else "FAILED")
    state["logged_step"] = max([state["logged_step"], *(int(r["step"]) for r in records)])
    write_json_atomic(state_path, state)


def tracked_run(run_dir: str) -> Optional[Dict[str, Any]]:
    """The MLflow run ``run_dir`` was logged to (``RunDir.TRACKING``: its store and run id), or None."""
    path = RunDir(run_dir).path(RunDir.TRACKING)
    return read_json(path) if os.path.isfile(path) else None


def log_evaluation(run_dir: str, result: Mapping[str, Any], files: Iterable[str]) -> None:
    """An evaluation of ``run_dir`` (``eval.json``'s content ``result``; ``files``: what it wrote) into the run's
    MLflow run, when it has one."""
    state = tracked_run(run_dir)
    if not state:
        return
    try:
        client = _client(state["tracking_uri"])
        step = int(result.get("checkpoint_steps") or 0)
        _log(client, state["run_id"], [(f"eval/{m}/{task}", values.get(m), step)
                                       for task, values in (result.get("eval") or {}).items() for m in HELD_OUT],
             tags={"eval.days": ",".join(map(str, result.get("days") or []))})
        for path in files:
            if path.endswith((".json", ".html")):  # eval.json, report.html (not the predictions: rows, not a result)
                client.log_artifact(state["run_id"], path)
    except Exception as e:  # noqa: BLE001 - the evaluation is written whatever the tracker says
        _warn("logging the evaluation", e)


def log_export(run_dir: str, model_dir: str) -> None:
    """The serving artifact exported from ``run_dir`` (the directory ``model_dir``) as the run's ``export/``."""
    state = tracked_run(run_dir)
    if not state:
        return
    try:
        _client(state["tracking_uri"]).log_artifacts(state["run_id"], model_dir, "export")
    except Exception as e:  # noqa: BLE001
        _warn("logging the export", e)


def log_gate(state: Optional[Mapping[str, Any]], day: str, decision: Mapping[str, Any], version: str) -> None:
    """The retraining job's day: its gate decision and the version it became (published or rejected) on the
    day's MLflow run (``state``: :func:`tracked_run` of the day's run directory), when it has one."""
    if not state:
        return
    try:
        tasks = decision.get("tasks") or {}
        points = [(f"gate/{k}/{task}", r.get(k), 0) for task, r in tasks.items()
                  for k in ("candidate_ne", "published_ne", "candidate_calibration")]
        _log(_client(state["tracking_uri"]), state["run_id"], points,
             tags={"gate.day": day, "gate.decision": decision.get("decision"), "registry.version": version,
                   "registry.published": decision.get("decision") == "published",
                   "gate.reasons": "; ".join(decision.get("reasons") or []) or "-"})
    except Exception as e:  # noqa: BLE001 - the version is recorded whatever the tracker says
        _warn("logging the gate", e)
