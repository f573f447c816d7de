"""``python -m recsys_hdet.lr_find``: the LR range test as a command (the recovery study's lr_finder uses the
same suggestion rule)."""

import json
import math
import os
import sys

import pytest

from conftest import run_command
from recsys_hdet.lr_find import suggest_multiplier


def _multiplier(step, low=0.01, high=100.0, steps=100):
    return low * (high / low) ** ((step - 1) / (steps - 1)) / 10


def test_the_suggestion_is_a_tenth_of_the_multiplier_at_the_loss_minimum():
    steps = list(range(1, 101))
    valley = [(s - 51) ** 2 / 1000 + 1.0 for s in steps]  # minimum after 51 steps
    assert suggest_multiplier(steps, valley, 0.01, 100.0, 100, beta=0.0) == pytest.approx(_multiplier(51), rel=1e-12)
    # Smoothing lags the minimum (an average of what came before), never leads it.
    smoothed = suggest_multiplier(steps, valley, 0.01, 100.0, 100)
    assert _multiplier(51) < smoothed <= _multiplier(100)
    # The curve is cut where it explodes (> 4x its minimum) or turns non-finite: a lower loss after that is ignored.
    exploding = [2.0, 1.5, 1.0, 5.0, 0.1]
    assert suggest_multiplier([1, 2, 3, 4, 5], exploding, 0.01, 100.0, 5, beta=0.0) == pytest.approx(_multiplier(3, steps=5))
    broken = [2.0, 1.0, math.nan, 0.1]
    assert suggest_multiplier([1, 2, 3, 4], broken, 0.01, 100.0, 4, beta=0.0) == pytest.approx(_multiplier(2, steps=4))
    assert suggest_multiplier([], [], 0.01, 100.0, 100) is None
    assert suggest_multiplier([1], [math.inf], 0.01, 100.0, 100) is None


def _lr_find(run_dir, data_cache, *overrides):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.lr_find", f"hydra.run.dir={run_dir}", "data=tiny", *overrides]
    return run_command(cmd, env=env, timeout=300)


def test_lr_find_sweeps_each_axis_and_prints_the_suggested_max_lrs(tmp_path, tiny_dataset, data_cache):
    from recsys_hdet.components.metrics_log import read_jsonl

    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1",
                    "optim.schedule.range_test.steps=8", "optim.lr.embedding=0.04", "optim.lr.transformer=0.003")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((run_dir / "lr_find.json").read_text())
    start = record["start"]
    assert start["embedding"] == 0.04 and start["transformer"] == 0.003 and start["no_decay"] == 0.002
    for axis, swept, held in (("embedding", ["embedding"], ["transformer", "non_embedding", "no_decay"]),
                              ("dense", ["transformer", "non_embedding", "no_decay"], ["embedding"])):
        sweep = record["sweeps"][axis]
        assert sweep["status"] == "stopped" and sweep["steps"] == 8
        logged = [m for m in read_jsonl(os.path.join(sweep["run_dir"], "metrics.jsonl")) if "lr" in m]
        assert [m["step"] for m in logged] == list(range(1, 9))  # the loss every step
        for g in held:  # the other axis held at its max LR x low
            assert all(m["lr"][g] == pytest.approx(start[g] * 0.01, rel=1e-9) for m in logged)
        for g in swept:  # x0.01 to x100 of its max LR, geometrically, over the 8 steps (a record after k steps
            # shows the rate of the next step, k: x100 from the last step on)
            assert [m["lr"][g] for m in logged] == pytest.approx(
                [start[g] * 0.01 * 1e4 ** (min(k, 7) / 7) for k in range(1, 9)], rel=1e-6)
        losses = [m["loss"]["avg"] for m in read_jsonl(os.path.join(sweep["run_dir"], "metrics.jsonl")) if "loss" in m]
        assert sweep["multiplier"] == suggest_multiplier(list(range(1, 9)), losses, 0.01, 100.0, 8)
        for g in swept:
            assert record["lr"][g] == pytest.approx(start[g] * sweep["multiplier"], rel=1e-5)
    line = " ".join(f"optim.lr.{g}={record['lr'][g]:.6g}" for g in ("embedding", "transformer", "non_embedding", "no_decay"))
    assert f"suggested: {line}" in proc.stdout


@pytest.mark.parametrize("override, named", [("hdet=enabled", "hdet.enabled=true"),
                                             ("optim.dense.type=prodigy", "optim.dense.type=prodigy")])
def test_lr_find_refuses_what_sets_its_own_step_size(tmp_path, tiny_dataset, data_cache, override, named):
    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1", override)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]
    assert not (run_dir / "lr_find.json").exists() and not (run_dir / "sweep_embedding").exists()
