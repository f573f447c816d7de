"""Branching a run from another run's kept checkpoint (trainer.periodic_checkpoint.keep_at,
trainer.branch_from, trainer.stop_at_step): what the LR ground-truth study is built on. Real
2-process runs on tiny data."""
import os

import pytest

from conftest import read_json, read_jsonl, run_train

COMMON = ["data=tiny", "trainer.log_every=5", "trainer.nproc=2", "trainer.sharding_group_size=1",
          "data.reserve_rows=1024"]


# Branching serves the studies (studies/lr_truth.py); slow: the default run's budget. `make test-all` runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trunk(tmp_path_factory, data_cache, tiny_dataset):
    run_dir = tmp_path_factory.mktemp("trunk") / "run"
    proc = run_train(run_dir, *COMMON, "trainer.periodic_checkpoint.keep_at=[0.25,0.5,0.75]", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_kept_checkpoints_outlive_the_run_on_divergence_checks(trunk):
    steps = read_json(trunk / "summary.json")["steps"]
    kept = sorted(int(p.name.split("-")[1]) for p in (trunk / "checkpoint").glob("step-*"))
    assert kept == [round(f * steps / 5) * 5 for f in (0.25, 0.5, 0.75)], (kept, steps)


def test_a_branch_at_the_same_lr_is_the_trunk_and_a_changed_lr_takes_over_at_the_branch(trunk, tmp_path, data_cache):
    step = sorted(int(p.name.split("-")[1]) for p in (trunk / "checkpoint").glob("step-*"))[1]
    ckpt = trunk / "checkpoint" / f"step-{step}"
    same = run_train(tmp_path / "x1", *COMMON, f"trainer.branch_from={ckpt}", data_cache=data_cache)
    assert same.returncode == 0 and f"branched from {ckpt} at step {step}" in same.stdout, same.stderr[-2000:]
    a, b = read_json(trunk / "summary.json"), read_json(tmp_path / "x1" / "summary.json")
    assert (a["eval"], a["train_loss"], a["steps"]) == (b["eval"], b["train_loss"], b["steps"])  # bit for bit
    trunk_records = {r["step"]: r for r in read_jsonl(trunk / "metrics.jsonl")}
    assert [r["step"] for r in read_jsonl(tmp_path / "x1" / "metrics.jsonl")][0] == step + 5
    # Doubled dense LRs from the branch point on; stopped early, no evaluation.
    doubled = [f"optim.lr.{g}={2 * 0.002}" for g in ("transformer", "non_embedding", "no_decay")]
    proc = run_train(tmp_path / "x2", *COMMON, f"trainer.branch_from={ckpt}", *doubled,
                     f"trainer.stop_at_step={step + 10}", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = read_json(tmp_path / "x2" / "summary.json")
    assert s["status"] == "stopped" and s["steps"] == step + 10 and "eval" not in s
    for r in read_jsonl(tmp_path / "x2" / "metrics.jsonl"):
        assert r["lr"]["transformer"] == pytest.approx(2 * trunk_records[r["step"]]["lr"]["transformer"], rel=1e-12)
        assert r["lr"]["embedding"] == trunk_records[r["step"]]["lr"]["embedding"]
    assert not os.path.exists(tmp_path / "x2" / "checkpoint")


def test_a_branch_that_would_train_something_else_is_refused(trunk, tmp_path, data_cache):
    ckpt = next((trunk / "checkpoint").glob("step-*"))
    proc = run_train(tmp_path / "other", *COMMON, f"trainer.branch_from={ckpt}", "data.batch_size=128",
                     data_cache=data_cache)
    assert proc.returncode == 2 and "data.batch_size (256 -> 128)" in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "other")
