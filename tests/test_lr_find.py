"""``python -m recsys_hdet.lr_find``: the LR range test as a command (the recovery study's lr_finder uses the
same suggestion rule)."""

import json
import math
import os
import re
import sys

import pytest

from conftest import run_command
from recsys_hdet.hdet.range_test.rule import range_edge, suggest_multiplier


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


def test_the_smoothing_window_spans_the_same_rates_whatever_the_sweep_s_length():
    """The loss is smoothed over a window of decades of the multiplier, not of steps: on one curve of the rate
    (falling until x10, then rising slowly, where the smoothed minimum trails the loss the most), sweeps of
    100, 200 and 400 steps over x0.001-x10000 suggest within 10% of each other; fastai's fixed 0.98 per step (the
    default, lr_find's) moves the suggestion with the sweep's length (a window of 50 steps is 3.5 decades at 100
    steps, 0.9 at 400). The range test on the replicas reads with a window of 1 decade."""
    from recsys_hdet.hdet.range_test.rule import smoothing, sweep_multiplier
    from recsys_hdet.hdet.range_test.sweep import SMOOTHING_DECADES

    def loss(rate):
        x = math.log10(rate)
        return 1.0 - 0.1 * (x + 3) if x <= 1 else 0.6 + 0.3 * (x - 1)

    def suggestion(n, beta=None):
        curve = [loss(sweep_multiplier(k, 0.001, 10000.0, n)) for k in range(n)]
        if beta is None:
            return suggest_multiplier(list(range(1, n + 1)), curve, 0.001, 10000.0, n)
        return suggest_multiplier(list(range(1, n + 1)), curve, 0.001, 10000.0, n, beta(n))

    window = [suggestion(n, lambda n: smoothing(0.001, 10000.0, n, SMOOTHING_DECADES)) for n in (100, 200, 400)]
    assert max(window) / min(window) < 1.1, window
    assert all(1.0 < m < 3.2 for m in window)  # above the raw minimum's x1, by the window's lag
    classic = [suggestion(n) for n in (100, 400)]
    assert classic[0] / classic[1] > 1.5, classic
    assert SMOOTHING_DECADES == 1.0 and smoothing(0.001, 10000.0, 100, 1.0) == pytest.approx(math.exp(-7 / 99))


def test_the_widened_default_range_suggests_above_x10_where_the_loss_still_falls_at_x100():
    """The finder's default sweep (x0.001 to x10000 over 100 steps) on a planted curve that falls until x1000
    and explodes above it: the suggestion is x100 (the old x0.01-x100 range capped it at x10) and is not
    flagged as an edge; the same curve cut at x100 (the old range's end) can only give x10 or less."""
    from recsys_hdet.hdet.range_test.rule import sweep_multiplier
    from recsys_hdet.optim_schema import RangeTestConfig

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


def test_a_sweep_that_diverged_reads_as_the_end_of_its_range_test_by_what_stopped_it():
    """The console's word for how a sweep ended: the trainer's divergence check ends a range test where its loss
    explodes, which is expected; said by what the check measured (the loss's multiple of its best logged one over
    trainer.diverge_loss, a non-finite loss, or the collapse to the base rate)."""
    from recsys_hdet.lr_find import sweep_outcome

    def records(*losses):
        return [{"step": k, "loss": {"like": x, "avg": x}} for k, x in enumerate(losses, 1)]

    assert sweep_outcome("stopped", records(0.7, 0.6), 2.0) == "done"
    assert sweep_outcome("diverged", records(0.5, 0.25, 5.0), 2.0) == \
        "range test: loss exploded at x20 of its best, step 3 (above trainer.diverge_loss=2) (expected)"
    assert sweep_outcome("diverged", records(0.5, math.nan), 2.0) == \
        "range test: loss exploded at step 2 (non-finite) (expected)"
    # as the trainer logs an interval without a finite step: every loss 0.0 (RECSYS_HDET_FAULTS=nan_state@step=3)
    assert sweep_outcome("diverged", records(0.5, 0.4, 0.0), 2.0) == \
        "range test: loss exploded at step 3 (non-finite) (expected)"
    assert sweep_outcome("diverged", records(0.5, 0.6), 2.0) == \
        "range test: the model collapsed to the base rate at step 2 (trainer.collapse) (expected)"


def _lr_find(run_dir, data_cache, *overrides, faults=None):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore",
           **({"RECSYS_HDET_FAULTS": faults} if faults else {})}
    cmd = [sys.executable, "-m", "recsys_hdet.lr_find", f"run_dir={run_dir}", "data=tiny", *overrides]
    return run_command(cmd, env=env, timeout=300)


def test_lr_find_prints_a_line_per_sweep_and_the_suggested_max_lrs_with_its_cost(tmp_path, tiny_dataset, data_cache):
    """Both sweeps on the tiny data, x0.01 to x100000 over 8 steps: the embedding sweep stops after its steps, the
    dense one explodes at step 6 (its loss above trainer.diverge_loss). The console reads as a range test: one
    line per sweep, the explosion as expected, no step lines (they are in each sweep's train.log), then the
    suggestion and the cost in seconds; the curves and the suggestion are those of the command before it ran
    both sweeps on one launch of the workers (04c29ad: two launches; the values pinned below)."""
    from data_tools.fileio import read_jsonl

    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1",
                    "optim.schedule.range_test.steps=8", "optim.schedule.range_test.low=0.01",
                    "optim.schedule.range_test.high=100000", "optim.lr.embedding=0.04", "optim.lr.transformer=0.003")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "DIVERGED" not in out + proc.stderr and not re.search(r"\beta\b", out) and "step      1/" not in out
    sweep_lines = [line for line in out.splitlines() if line.startswith("sweep ")]
    assert len(sweep_lines) == 2, out
    assert re.fullmatch(r"sweep 1/2 \(embedding\): lr 0\.0004 -> 4000 over 8 steps \.\.\. done in [0-9.]+ s",
                        sweep_lines[0]), out
    assert re.fullmatch(r"sweep 2/2 \(dense: transformer, non_embedding, no_decay\): lr 3e-05 -> 300 \(transformer\), "
                        r"2e-05 -> 200 \(non_embedding, no_decay\) over 8 steps \.\.\. range test: loss exploded at "
                        r"x[0-9.e+]+ of its best, step 6 \(above trainer.diverge_loss=2\) \(expected\); "
                        r"done in [0-9.]+ s",
                        sweep_lines[1]), out
    record = json.loads((run_dir / "lr_find.json").read_text())
    start = record["start"]
    assert start["embedding"] == 0.04 and start["transformer"] == 0.003 and start["no_decay"] == 0.002
    for axis, swept, held, status, steps in (
            ("embedding", ["embedding"], ["transformer", "non_embedding", "no_decay"], "stopped", 8),
            ("dense", ["transformer", "non_embedding", "no_decay"], ["embedding"], "diverged", 6)):
        sweep = record["sweeps"][axis]
        assert sweep["status"] == status and sweep["steps"] == steps and sweep["seconds"] > 0
        logged = [m for m in read_jsonl(os.path.join(sweep["run_dir"], "metrics.jsonl")) if "lr" in m]
        assert [m["step"] for m in logged] == list(range(1, steps + 1))  # the loss every step
        # the training NE, calibration and AUC once, where the sweep stopped (trainer.metrics_every; the diverged
        # sweep never reached it): a record carrying them every step made a sweep's step about 4x a pass's
        assert [m["step"] for m in logged if "ne" in m] == ([8] if status == "stopped" else [])
        for g in held:  # the other axis held at its max LR x low
            assert all(m["lr"][g] == pytest.approx(start[g] * 0.01, rel=1e-9) for m in logged)
        for g in swept:  # x0.01 to x100000 of its max LR, geometrically, over the 8 steps (a record after k steps
            # shows the rate of the next step, k: x100000 from the last step on)
            assert [m["lr"][g] for m in logged] == pytest.approx(
                [start[g] * 0.01 * 1e7 ** (min(k, 7) / 7) for k in range(1, steps + 1)], rel=1e-6)
        losses = [m["loss"]["avg"] for m in read_jsonl(os.path.join(sweep["run_dir"], "metrics.jsonl")) if "loss" in m]
        assert sweep["multiplier"] == suggest_multiplier(list(range(1, steps + 1)), losses, 0.01, 100000.0, 8)
        for g in swept:
            assert record["lr"][g] == pytest.approx(start[g] * sweep["multiplier"], rel=1e-5)
    # As the command gave them before (two launches of the workers, at 04c29ad): the curve is unchanged.
    assert record["lr"] == {"embedding": 400.0, "transformer": 0.003, "non_embedding": 0.002, "no_decay": 0.002}
    assert record["sweeps"]["embedding"]["multiplier"] == pytest.approx(1e4, rel=1e-12)
    assert record["sweeps"]["dense"]["multiplier"] == pytest.approx(1.0, rel=1e-12)

    line = " ".join(f"optim.lr.{g}={record['lr'][g]:.6g}" for g in ("embedding", "transformer", "non_embedding", "no_decay"))
    assert "\nembedding: x1e+04 its max LR: optim.lr.embedding=400\n" in out
    assert ("\ndense: x1 their max LRs: optim.lr.transformer=0.003 optim.lr.non_embedding=0.002 "
            "optim.lr.no_decay=0.002\n") in out
    cost = re.search(r"\nsuggested: (.*)\ncost: ([0-9.]+) s in all \(sweeps: embedding ([0-9.]+) s, dense ([0-9.]+) s; "
                     r"the rest starting up\)\nlr_find: ", out)
    assert cost and cost.group(1) == line, out
    assert float(cost.group(2)) > float(cost.group(3)) + float(cost.group(4)) and record["seconds"] > 0
    # the curves a person reads: per sweep the multiplier, raw and smoothed loss of every logged step, the rule's
    # minimum, cut and flags (lr_find.json), drawn in lr_find.png
    emb, dense = record["sweeps"]["embedding"]["curve"], record["sweeps"]["dense"]["curve"]
    assert len(emb["multipliers"]) == len(emb["loss"]) == len(emb["smoothed"]) == 8 and emb["divisor"] == 10.0
    assert emb["multipliers"][-1] == pytest.approx(1e5) and emb["multiplier"] == record["sweeps"]["embedding"]["multiplier"]
    assert "range_edge_high" in record["sweeps"]["embedding"]["off_map"] and dense["cut_at"] is not None
    assert (run_dir / "lr_find.png").stat().st_size > 10_000
    # the step lines and the divergence check's own words are kept, in each sweep's train.log
    assert "step      8/" in (run_dir / "sweep_embedding" / "train.log").read_text()
    assert "DIVERGED at step 6" in (run_dir / "sweep_dense" / "train.log").read_text()


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_a_sweep_whose_model_turned_non_finite_logs_nan_and_suggests_from_its_finite_steps(tmp_path, tiny_dataset,
                                                                                             data_cache):
    """The model's state turned non-finite after 3 steps of each sweep (a fault injected): the interval with no finite
    step is logged as NaN, not 0.0 (the trainer's mean over no step, which the rule read as the best loss and
    suggested the rate of the blow-up / 10), so the suggestion comes from the finite steps before it."""
    from data_tools.fileio import read_jsonl

    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1",
                    "optim.schedule.range_test.steps=8", "optim.schedule.range_test.low=0.01",
                    "optim.schedule.range_test.high=100000", faults="nan_state@step=3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((run_dir / "lr_find.json").read_text())
    for sweep in record["sweeps"].values():
        logged = [m for m in read_jsonl(os.path.join(sweep["run_dir"], "metrics.jsonl")) if "loss" in m]
        finite = [m["loss"]["avg"] for m in logged if math.isfinite(m["loss"]["avg"])]
        assert len(finite) < len(logged) and all(math.isnan(v) for m in logged[len(finite):] for v in m["loss"].values())
        assert sweep["multiplier"] == suggest_multiplier(list(range(1, len(finite) + 1)), finite, 0.01, 100000.0, 8)
    assert "(non-finite) (expected)" in proc.stdout


@pytest.mark.parametrize("override, named", [("hdet=enabled", "hdet.enabled=true"),
                                             ("optim.dense.type=prodigy", "optim.dense.type=prodigy")])
def test_lr_find_refuses_what_sets_its_own_step_size_and_writes_nothing(tmp_path, tiny_dataset, data_cache, override,
                                                                        named):
    run_dir = tmp_path / "find"
    proc = _lr_find(run_dir, data_cache, "trainer.nproc=1", "trainer.sharding_group_size=1", override)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]
    assert not run_dir.exists()


def test_a_sweep_that_fails_ends_the_search_without_a_suggestion(tmp_path, monkeypatch):
    """A sweep whose run failed (here: the workers' exit status 1, no summary; the sweep after it never ran) gives
    no suggestion, even with losses logged before it failed; the command then exits 1."""
    from recsys_hdet import api, lr_find
    from recsys_hdet.api import compose_config

    def failing_sweeps(sweeps, run_dir):
        first = os.path.join(run_dir, f"sweep_{next(iter(sweeps))}")
        os.makedirs(first)
        with open(os.path.join(first, "metrics.jsonl"), "w") as f:
            for k in (1, 2, 3):
                f.write(json.dumps({"step": k, "loss": {"avg": 1.0 / k}}) + "\n")
        return {axis: api.TrainResult(os.path.join(run_dir, f"sweep_{axis}"), 1, None) for axis in sweeps}

    monkeypatch.setattr(lr_find, "run_sweeps", failing_sweeps)
    record = lr_find.find(compose_config(["data=tiny"]), str(tmp_path / "find"))
    assert record["sweeps"]["embedding"]["exit_status"] == 1 and record["sweeps"]["embedding"]["multiplier"] is None
    assert "dense" not in record["sweeps"] and "lr" not in record
    # A directory that already holds a range test is refused, not read again.
    with pytest.raises(lr_find.ConfigError, match="already holds an LR range test"):
        lr_find.find(compose_config(["data=tiny"]), str(tmp_path / "find"))
