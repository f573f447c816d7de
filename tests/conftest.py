import json
import os
import signal
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A script that imports torch with the project and the training stack refused, as a serving system loads an
# exported program; it ends by printing the refused modules that got imported ("loaded []": none).
_TORCH_ALONE = r"""
import importlib.abc, json, sys
BLOCKED = ("torchrec", "fbgemm_gpu", "hydra", "omegaconf", "polars", "pyarrow", "recsys_hdet", "data_tools", "pipelines")
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not allowed here")
sys.meta_path.insert(0, Refuse())
import torch
{body}
print("loaded", sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def run_torch_alone(body, *args, timeout=300):
    """Runs ``body`` (Python; ``torch``, ``json`` and ``sys`` imported, ``sys.argv[1:]`` = ``args``) in a fresh
    process that cannot import the project or the training stack."""
    return subprocess.run([sys.executable, "-c", _TORCH_ALONE.replace("{body}", body), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """A per-session data cache, so tests never depend on (or write into) the user's .cache/."""
    return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="session")
def tiny_dataset(data_cache):
    """The conf/data/tiny.yaml data set, generated once per session. Returns its root."""
    from data_tools.prepare import ensure_dataset

    from recsys_hdet.config import compose

    cfg = compose("config", ["data=tiny"]).data  # the preset over the schema's defaults
    root = os.path.join(data_cache, "tiny")
    ensure_dataset(root, OmegaConf.to_container(cfg.generator), OmegaConf.to_container(cfg.min_count))
    return root


def call_command(module, entry, argv, monkeypatch):
    """A command's exit status, run in this process as ``python -m module argv`` runs it: ``main(argv)``, or a
    Hydra command's entry point with ``sys.argv``."""
    import importlib

    fn = getattr(importlib.import_module(module), entry)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    try:
        return fn(argv) if entry == "main" else fn()
    except SystemExit as e:
        return e.code


def run_command(cmd, *, timeout, cwd=REPO, env=None):
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), except that a timeout
    kills the command's whole process group: a launcher's spawned workers (grandchildren) die with
    it instead of living on and slowing every later test on the 2 cores."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_train(run_dir, *overrides, data_cache, timeout=300):
    """Runs ``python -m recsys_hdet.train`` as a user would; returns the CompletedProcess."""
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"run_dir={run_dir}", *overrides]
    return run_command(cmd, env=env, timeout=timeout)


def run_evaluate(*args, data_cache, timeout=300):
    """Runs ``python -m recsys_hdet.evaluate`` as a user would; returns the CompletedProcess."""
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    return run_command([sys.executable, "-m", "recsys_hdet.evaluate", *args], env=env, timeout=timeout)


# A plain run on two sharding groups of one rank (two embedding replicas, averaged every step), a check
# every 5 steps: trained once per session (plain_run), the run whose artifacts tests/test_train.py checks and
# the un-spiked reference of tests/test_rollback.py, whose runs add only a planted fault to these overrides.
PLAIN_2X1 = ["data=tiny", "trainer.log_every=5", "trainer.nproc=2", "trainer.sharding_group_size=1",
             "experiment_name=two_proc"]

# HDET on 2 sharding groups x 2 ranks, spread but not controlled (autolr=false: the signal changes nothing in
# training), 2048 reserved probe rows: hdet_run is this with the last-iterate probe (hdet.signal=probe), and
# tests/test_hdet_signals.py's runs are this with another signal, which must train it bit for bit.
HDET_2X2 = ["data=tiny", "trainer.log_every=10", "trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=controller",
            "hdet.alpha=0.25", "hdet.sync_every=5", "hdet.autolr=false", "hdet.probe_rows=2048",
            "hdet.anneal_probe.steps=3", "trainer.tensorboard=false"]


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory, tiny_dataset, data_cache):
    """PLAIN_2X1's finished run: (run directory, the command's CompletedProcess)."""
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    proc = run_train(run_dir, *PLAIN_2X1, data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


@pytest.fixture(scope="session")
def hdet_run(tmp_path_factory, tiny_dataset, data_cache):
    """A finished tiny HDET run (HDET_2X2 with hdet.signal=probe: 4 workers, 2 sharding groups x 2), evaluated
    with 2 workers: its ``predictions.parquet`` is what the evaluation and the exported model are checked
    against, and its training what every probing signal's run must reproduce (tests/test_hdet_signals.py)."""
    run_dir = tmp_path_factory.mktemp("eval") / "hdet"
    proc = run_train(run_dir, *HDET_2X2, "hdet.signal=probe", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ev = run_evaluate(f"run_dir={run_dir}", "nproc=2", "batch_size=1000", data_cache=data_cache)
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-3000:]
    return run_dir


def config_error(*overrides):
    """What the launcher says for these overrides before any worker starts: the composition's error
    (the typed schema refuses an unknown key, a wrong type, a bad choice), else validate_config's."""
    import pytest
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from recsys_hdet.config import ConfigError, compose_error, validate_config

    try:
        with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
    except ConfigCompositionException as e:
        message = compose_error(e)
        assert message, f"a composition error the launcher would not name: {e} ({e.__cause__})"
        return message
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    return str(e.value)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tensorboard_scalars(log_dir):
    """{tag: [(step, value), ...]} from a run's TensorBoard event files, read by TensorBoard's Python
    reader (EventAccumulator: what ``tensorboard --load_fast=false`` serves, and the reader that
    honours a resumed writer's purge_step), every point kept (size_guidance 0, no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected_tensorboard_scalars(run_dir):
    """The scalars a run's metrics.jsonl and hdet.jsonl records stand for (README, "Watching a run"):
    {tag: [(step, value), ...]}."""
    import pathlib

    run_dir = pathlib.Path(run_dir)
    out = {}

    def add(tag, step, value):
        if value is not None:  # hdet.jsonl's null: a non-finite (excluded) replica, not plotted
            out.setdefault(tag, []).append((step, value))

    for r in read_jsonl(run_dir / "metrics.jsonl"):
        for task, v in r["loss"].items():
            add(f"loss/{task}", r["step"], v)
        for group, v in r["lr"].items():
            add(f"lr/{group}", r["step"], v)
        for metric in ("ne", "calibration", "auc"):
            for task, v in r[metric].items():
                add(f"{metric}/{task}", r["step"], v)
        add("throughput/examples_per_s", r["step"], r["examples_per_sec"])
    if (run_dir / "hdet.jsonl").exists():
        for r in read_jsonl(run_dir / "hdet.jsonl"):
            if "event" in r:  # a rollback's line, not a sync: no scalars
                continue
            for name, entry in r["hparams"].items():
                add(f"hdet/{name}/base", r["step"], entry["base"])
                for k, v in enumerate(entry["values"]):
                    add(f"hdet/{name}/replica{k}", r["step"], v)
                for key in ("velocity", "next_base", "log_offset"):
                    add(f"hdet/{name}/{key}", r["step"], entry.get(key))
            for k, v in enumerate(r["losses"]):
                add(f"hdet/window_loss/replica{k}", r["step"], v)
            for k, v in enumerate(r.get("train_losses") or []):
                add(f"hdet/window_train_loss/replica{k}", r["step"], v)
            add("hdet/excluded_replicas", r["step"], len(r["excluded"]))
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    if summary.get("eval"):  # a completed pass: the held-out metrics at its last step, and the HParams row
        for task, m in summary["eval"].items():
            for metric in ("ne", "auc", "logloss", "calibration"):
                add(f"heldout/{metric}/{task}", summary["steps"], m[metric])
            add(f"hparam/heldout_ne/{task}", summary["steps"], m["ne"])
        mean = sum(m["ne"] for m in summary["eval"].values()) / len(summary["eval"])
        add("heldout/ne/mean", summary["steps"], mean)
        add("hparam/heldout_ne_mean", summary["steps"], mean)
    return out


def assert_tensorboard_matches_records(run_dir):
    """The run's tensorboard/ event files hold exactly the scalars of its JSON-lines records: the
    same tags, the same steps, equal values (float32 in the event file, so to a relative 1e-6)."""
    import pytest

    expected = expected_tensorboard_scalars(run_dir)
    assert expected, f"no records in {run_dir}"
    got = tensorboard_scalars(os.path.join(str(run_dir), "tensorboard"))
    assert set(got) == set(expected), (sorted(set(got) ^ set(expected)))
    if "hparam/heldout_ne_mean" in expected:  # the HParams tab's row: the run's settings
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(os.path.join(str(run_dir), "tensorboard"))
        acc.Reload()
        assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams"), acc.PluginTagToContent("hparams")
    for tag, points in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6, nan_ok=True), tag
    return got
