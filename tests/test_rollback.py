"""Rollback instead of divergence (recsys_hdet/components/rollback.py): real 2-process runs on tiny
data with a planted divergence (the lr_spike fault: every LR x1000 for some steps)."""
import os

import pytest

from conftest import PLAIN_2X1, read_json, read_jsonl, run_train

# Two sharding groups of one rank: embedding replicas, averaged every step as in a plain run. The un-spiked
# reference is the session's plain_run (these overrides, no fault).
PLAIN = PLAIN_2X1


def _run(run_dir, faults, data_cache, *overrides):
    os.environ["RECSYS_HDET_FAULTS"] = faults
    try:
        return run_train(run_dir, *PLAIN, *overrides, data_cache=data_cache)
    finally:
        del os.environ["RECSYS_HDET_FAULTS"]


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_a_planted_divergence_is_rolled_back_and_the_run_completes(tmp_path, data_cache, plain_run):
    ref_dir, ref = plain_run
    # Steps 12-14 train with every LR x1000: the check at step 15 fails, the state of step 10 comes back.
    proc = _run(tmp_path / "spike", "lr_spike@step=12:steps=3", data_cache)
    assert ref.returncode == 0 and proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ROLLBACK 1/3 at step 15" in proc.stdout and "restored the state of step 10" in proc.stdout
    s, r = read_json(tmp_path / "spike" / "summary.json"), read_json(ref_dir / "summary.json")
    assert s["status"] == "completed" and s["steps"] == r["steps"]  # the data position moved on: same pass
    assert s["rollback"]["count"] == 1 and s["rollback"]["snapshot_bytes"] > 0
    event = s["rollback"]["events"][0]
    assert (event["step"], event["restored_step"], event["lr_scale"]) == (15, 10, 0.5)
    assert "above trainer.diverge_loss" in event["reason"]
    records = {m["step"]: m for m in read_jsonl(tmp_path / "spike" / "metrics.jsonl")}
    ref_records = {m["step"]: m for m in read_jsonl(ref_dir / "metrics.jsonl")}
    assert records[15]["rollback"] == event and records[15]["loss"]["avg"] > 2.0
    assert all("rollback" not in m for step, m in records.items() if step != 15)
    # Up to the last good check the runs are the same run; after the rollback every LR is halved.
    assert records[10]["loss"] == ref_records[10]["loss"]
    for step in (20, 30, r["steps"]):
        for group, lr in ref_records[step]["lr"].items():
            assert records[step]["lr"][group] == pytest.approx(0.5 * lr, rel=1e-9), (step, group)
    # The restored model trains on: the next interval's loss is back near the last good one, and the
    # pass's training loss leaves the rolled-back interval out (with it the mean would be ~1e8).
    assert records[20]["loss"]["avg"] < 1.25 * records[10]["loss"]["avg"]
    assert s["train_loss"]["avg"] < 1.25 * r["train_loss"]["avg"]
    for task, m in s["eval"].items():
        assert m["ne"] < 1.1, (task, m)
    assert "final model bit-identical on every replica" in proc.stdout


# The tiny run's mean training NE first falls below trainer.collapse.armed_below (0.99) at the check of
# step 35 (0.973); zero_dense at step 36 leaves a model whose logits no longer depend on its inputs.
COLLAPSE = "zero_dense@step=36"


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
@pytest.mark.parametrize("metrics_every", [None, 25])
def test_a_planted_collapse_to_the_base_rate_is_rolled_back_and_the_run_completes(tmp_path, data_cache, tiny_dataset,
                                                                                  metrics_every):
    """The check reads torchrec's training NE where it is computed, and between two computations
    (``trainer.metrics_every``: here at step 25 and the pass's end only) the interval's loss over its positive rate's
    entropy: the same collapse found at the same check."""
    extra = [] if metrics_every is None else [f"trainer.metrics_every={metrics_every}"]
    proc = _run(tmp_path / "collapse", COLLAPSE, data_cache, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = read_json(tmp_path / "collapse" / "summary.json")
    assert s["status"] == "completed" and s["rollback"]["count"] == 1
    event = s["rollback"]["events"][0]
    assert (event["step"], event["restored_step"]) == (40, 35)
    assert "collapsed to the base-rate predictor" in event["reason"] and "trainer.collapse.ne=0.999" in event["reason"]
    records = {m["step"]: m for m in read_jsonl(tmp_path / "collapse" / "metrics.jsonl")}
    if metrics_every is None:
        assert all(v >= 0.999 for v in records[40]["ne"].values())  # what the check saw
        assert max(records[45]["ne"].values()) < 1.1  # the restored model predicts again
    else:
        # and at the pass's end (over steps 26-46, the rolled-back ones included: the held-out NE below is the
        # restored model's)
        assert [step for step, m in records.items() if "ne" in m] == [25, s["steps"]]
    for task, m in s["eval"].items():
        assert m["ne"] < 1.1, (task, m)


@pytest.mark.slow  # the control of the test above (`make test-all`)
def test_without_the_collapse_check_a_collapsed_run_completes_as_a_base_rate_model(tmp_path, data_cache, tiny_dataset):
    proc = _run(tmp_path / "unchecked", COLLAPSE, data_cache, "trainer.collapse.ne=null")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = read_json(tmp_path / "unchecked" / "summary.json")
    assert s["status"] == "completed" and s["rollback"]["count"] == 0
    assert all(m["ne"] >= 0.999 for m in s["eval"].values()), s["eval"]


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores); `make test-all` runs it
def test_rollbacks_exhausted_end_the_run_as_diverged_with_the_record(tmp_path, data_cache, tiny_dataset):
    # The spike lasts: the checks at 15 and 20 are rolled back, the one at 25 ends the run.
    run_dir = tmp_path / "exhausted"
    proc = _run(run_dir, "lr_spike@step=12:steps=30", data_cache, "trainer.rollback.max_rollbacks=2")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DIVERGED at step 25" in proc.stdout and "after 2 rollback(s)" in proc.stdout
    assert "Traceback" not in proc.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "diverged" and s["steps"] == 25 and "eval" not in s
    assert [e["step"] for e in s["rollback"]["events"]] == [15, 20]
    assert [e["lr_scale"] for e in s["rollback"]["events"]] == [0.5, 0.25]
    assert s["rollback"]["not_rolled_back"].startswith("after 2 rollback(s)")
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "rollback" in m] == [15, 20]
    assert not os.path.exists(run_dir / "checkpoint")


@pytest.mark.slow  # the off path is the old behaviour, also checked by the slow all-NaN HDET test
def test_without_rollback_the_first_failed_check_ends_the_run(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "off"
    proc = _run(run_dir, "lr_spike@step=12:steps=3", data_cache, "trainer.rollback.max_rollbacks=0")
    assert proc.returncode == 3 and "DIVERGED at step 15" in proc.stdout, proc.stdout[-3000:]
    assert "not rolled back: rollback is off (trainer.rollback.max_rollbacks=0)" in proc.stdout
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "diverged" and "rollback" not in s
