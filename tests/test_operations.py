"""What users and schedulers see around training: ``make demo`` ends with the evaluation report,
the training task returns its held-out NE (what a Hydra sweeper minimizes)."""

import re
import subprocess

import pytest

from conftest import REPO


def test_make_demo_trains_then_evaluates_the_same_run_directory():
    out = subprocess.run(["make", "-n", "demo", "DEMO_RUN=outputs/demo/x"], cwd=REPO, capture_output=True, text=True,
                         timeout=60).stdout
    train = re.search(r"recsys_hdet\.train \+experiment=demo run_dir=(\S+)", out)
    evaluate = re.search(r"recsys_hdet\.evaluate run_dir=(\S+)", out)
    assert train and evaluate, out
    assert train.group(1) == evaluate.group(1) == "outputs/demo/x"
    assert out.index("recsys_hdet.train") < out.index("recsys_hdet.evaluate")


@pytest.mark.slow
def test_an_optuna_sweep_minimizes_the_held_out_ne(tmp_path, data_cache, tiny_dataset):
    """docs/training.md's sweep example, 2 trials on the tiny data set: the sweeper's best value is
    the lowest of the trials' held-out NE (mean over tasks) as their summary.json records it."""
    import json
    import math
    import os
    import sys

    import yaml

    from conftest import run_command

    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    proc = run_command([sys.executable, "-m", "recsys_hdet.train", "-m", "hydra/sweeper=optuna",
                        "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=minimize",
                        "optim.lr.transformer=interval(0.0003,0.003)", "data=tiny", "trainer.nproc=1",
                        "trainer.sharding_group_size=1", "trainer.log_every=10", f"hydra.sweep.dir={tmp_path}"],
                       env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())["best_value"]
    trials = []
    for d in sorted(p for p in os.listdir(tmp_path) if p.isdigit()):
        summary = json.loads((tmp_path / d / "summary.json").read_text())
        trials.append(sum(m["ne"] for m in summary["eval"].values()) / len(summary["eval"]))
    assert len(trials) == 2 and all(math.isfinite(t) for t in trials)
    assert best == pytest.approx(min(trials), rel=1e-12)
