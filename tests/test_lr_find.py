"""``python -m recsys_hdet.lr_find``: the LR range test as a command (the recovery study's lr_finder uses the
same suggestion rule)."""

import json
import math
import os
import sys

import pytest

from conftest import run_command
from recsys_hdet.components.range_rule import range_edge, suggest_multiplier


def test_the_suggestion_is_a_tenth_of_the_multiplier_the_best_loss_was_trained_at():
    # 5 steps from x0.01 to x100: the 0-based steps k run at x0.01, x0.1, x1, x10, x100. A record after k steps
    # holds the loss of step k - 1, computed before its update, which ran at that step's multiplier; so the
    # minimum at the record after 3 steps points at x1 and the suggestion is x0.1 (fastai's rule, unsmoothed).
    assert suggest_multiplier([1, 2, 3, 4, 5], [2.0, 1.5, 1.0, 1.2, 1.3], 0.01, 100.0, 5, beta=0.0) \
        == pytest.approx(0.1, rel=1e-12)
    assert suggest_multiplier([1, 2, 3, 4, 5], [2.0, 1.5, 1.4, 1.2, 1.1], 0.01, 100.0, 5, beta=0.0) \
        == pytest.approx(10.0, rel=1e-12)  # still falling at the end: the largest this range allows
    # Cut where the loss explodes (> 4x its minimum) or turns non-finite: a lower loss after that is ignored.
    assert suggest_multiplier([1, 2, 3, 4, 5], [2.0, 1.5, 1.0, 5.0, 0.1], 0.01, 100.0, 5, beta=0.0) \
        == pytest.approx(0.1, rel=1e-12)
    assert suggest_multiplier([1, 2, 3, 4, 5], [2.0, 1.0, math.nan, 0.1, 0.1], 0.01, 100.0, 5, beta=0.0) \
        == pytest.approx(0.01, rel=1e-12)
    assert suggest_multiplier([], [], 0.01, 100.0, 100) is None
    assert suggest_multiplier([1], [math.inf], 0.01, 100.0, 100) is None
    # Smoothing (0.98, bias-corrected) lags the minimum: on a valley whose raw minimum follows 51 of 100 steps the
    # suggestion lies above the raw one and below the end of the range.
    steps = list(range(1, 101))
    valley = [(k - 51) ** 2 / 1000 + 1.0 for k in steps]
    raw = suggest_multiplier(steps, valley, 0.01, 100.0, 100, beta=0.0)
    assert raw == pytest.approx(0.01 * 1e4 ** (50 / 99) / 10, rel=1e-12)
    assert raw < suggest_multiplier(steps, valley, 0.01, 100.0, 100) < 10.0
    # Within one sweep step of an end of the range (5 steps: a decade a step) is flagged; further in is not.
    assert range_edge(10.0, 0.01, 100.0, 5) == "high" and range_edge(0.001, 0.01, 100.0, 5) == "low"
    assert range_edge(1.0, 0.01, 100.0, 5) == "high" and range_edge(0.01, 0.01, 100.0, 5) == "low"
    assert range_edge(0.1, 0.01, 100.0, 5) is None and range_edge(0.99, 0.01, 100.0, 5) is None


def test_the_widened_default_range_suggests_above_x10_where_the_loss_still_falls_at_x100():
    """The finder's default sweep (x0.001 to x10000 over 100 steps) on a planted curve that falls until x1000
    and explodes above it: the suggestion is x100 (the old x0.01-x100 range capped it at x10) and is not
    flagged as an edge; the same curve cut at x100 (the old range's end) can only give x10 or less."""
    from recsys_hdet.components.range_rule import sweep_multiplier
    from recsys_hdet.config_schema import RangeTestConfig

    rt = RangeTestConfig()
    low, high, n = rt.low, rt.high, rt.steps
    assert (low, high, n) == (0.001, 10000.0, 100)
    rates = [sweep_multiplier(k, low, high, n) for k in range(n)]
    # the loss of the record after k steps is that of a model trained at the rates of steps 0..k-1: falling in
    # log(rate) until x1000, exploding after it
    losses = [1.0 - 0.05 * math.log10(r / low) if r <= 1000 * 1.0001 else 1.0 + 10 * math.log10(r / 1000)
              for r in rates]
    m = suggest_multiplier(list(range(1, n + 1)), losses, low, high, n, beta=0.0)
    assert m == pytest.approx(100.0, rel=0.15) and m > 10.0
    assert range_edge(m, low, high, n) is None
    smoothed = suggest_multiplier(list(range(1, n + 1)), losses, low, high, n)
    assert 10.0 < smoothed <= m * 1.0001
    old = [(k + 1, x) for k, (r, x) in enumerate(zip(rates, losses)) if r <= 100 * 1.0001]
    assert suggest_multiplier([k for k, _ in old], [x for _, x in old], low, high, n, beta=0.0) <= 10.0 * 1.0001


def _lr_find(run_dir, data_cache, *overrides):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "recsys_hdet.lr_find", f"run_dir={run_dir}", "data=tiny", *overrides]
    return run_command(cmd, env=env, timeout=300)


def test_lr_find_sweeps_each_axis_and_prints_the_suggested_max_lrs(tmp_path, tiny_dataset, data_cache):
    from data_tools.fileio import read_jsonl

    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1",
                    "optim.schedule.range_test.steps=8", "optim.schedule.range_test.low=0.01",
                    "optim.schedule.range_test.high=100", "optim.lr.embedding=0.04", "optim.lr.transformer=0.003")
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
def test_lr_find_refuses_what_sets_its_own_step_size_and_writes_nothing(tmp_path, tiny_dataset, data_cache, override,
                                                                        named):
    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1", override)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]
    assert not run_dir.exists()


def test_a_sweep_that_fails_ends_the_search_without_a_suggestion(tmp_path, monkeypatch):
    """A sweep whose run failed (here: its workers' exit status 1, no summary) gives no suggestion, even
    with losses logged before it failed; the command then exits 1."""
    from recsys_hdet import api, lr_find
    from recsys_hdet.api import compose_config

    def failing_train(cfg, run_dir, **_):
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            for k in (1, 2, 3):
                f.write(json.dumps({"step": k, "loss": {"avg": 1.0 / k}}) + "\n")
        return api.TrainResult(str(run_dir), 1, None)

    monkeypatch.setattr(api, "train", failing_train)
    record = lr_find.find(compose_config(["data=tiny"]), str(tmp_path / "find"))
    assert record["sweeps"]["embedding"]["exit_status"] == 1 and record["sweeps"]["embedding"]["multiplier"] is None
    assert "dense" not in record["sweeps"] and "lr" not in record
    # A directory that already holds a range test is refused, not read again.
    with pytest.raises(lr_find.ConfigError, match="already holds an LR range test"):
        lr_find.find(compose_config(["data=tiny"]), str(tmp_path / "find"))
