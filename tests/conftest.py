import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """A per-session data cache, so tests never depend on (or write into) the user's .cache/."""
    return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="session")
def tiny_dataset(data_cache):
    """The conf/data/tiny.yaml data set, generated once per session. Returns its root."""
    from data_tools.prepare import ensure_dataset

    cfg = OmegaConf.load(os.path.join(REPO, "conf", "data", "tiny.yaml"))
    root = os.path.join(data_cache, "tiny")
    ensure_dataset(root, OmegaConf.to_container(cfg.generator), OmegaConf.to_container(cfg.min_count))
    return root


def run_train(run_dir, *overrides, data_cache, timeout=300):
    """Runs ``python -m recsys_hdet.train`` as a user would; returns the CompletedProcess."""
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.train", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
