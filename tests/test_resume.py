"""Crash and resume: a run killed with SIGKILL at a seeded random step and resumed ends bit for bit
where the uninterrupted run ends (CPU, same layout, same seed), HDET off and on; automatic restarts;
the checkpoint faults. Real multi-process runs on tiny data."""
import json
import os
import random
import shutil
import sys

import pytest
import torch

from conftest import REPO, read_json, read_jsonl, run_command, run_train

# Checkpoints every 5 steps, replicas averaged every 3 (plain) or synced every 6 (HDET): most
# checkpoints fall between averages, when the replicas differ.
EVERY = 5
FAST = ["data=tiny", "trainer.log_every=5", f"trainer.periodic_checkpoint.every_steps={EVERY}"]
LAYOUTS = {
    # HDET off: two sharding groups of one rank (embedding replicas averaged every 3 steps, so the
    # checkpoints also fall between averages, when the replicas differ).
    "plain": ["trainer.nproc=2", "trainer.sharding_group_size=1", "trainer.embedding_sync_every=3"],
    # HDET on, 2 x 2: replicas differ by design between syncs (T = 6, checkpoints every 5 steps).
    "hdet": ["trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=controller", "hdet.sync_every=6",
             "hdet.controller_start=0"],
    # Explore-then-commit: two rounds of 10 steps, then the pass handed to the plain control (resumed
    # after the hand-over, its state is the plain control's at the held LRs; tests/test_hdet_hand_over.py).
    "hdet_explore": ["trainer.nproc=2", "trainer.sharding_group_size=1", "trainer.embedding_sync_every=3",
                     "hdet=controller", "hdet.explore_rounds=2", "hdet.explore_steps=10", "hdet.sync_every=5",
                     "hdet.probe_rows=1024", "hdet.anneal_probe.steps=2"],
    # The range test on the replicas: an 8-step sweep before the pass, then the plain run at the committed rates.
    "range_test": ["trainer.nproc=2", "trainer.sharding_group_size=1", "trainer.embedding_sync_every=3",
                   "hdet=enabled", "hdet.range_test.steps=8"],
}


def _final_tensors(run_dir):
    """The final checkpoint's tensors, read with DCP's own converter."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = str(run_dir) + ".pt"
    dcp_to_torch_save(str(run_dir / "checkpoint"), out)
    return torch.load(out, weights_only=False)["model"]


def _assert_same_run(a, b):
    sa, sb = read_json(a / "summary.json"), read_json(b / "summary.json")
    assert sa["status"] == sb["status"] == "completed" and sa["steps"] == sb["steps"]
    assert sa["train_loss"] == sb["train_loss"]  # bit for bit
    assert sa["eval"] == sb["eval"]
    ta, tb = _final_tensors(a), _final_tensors(b)
    assert ta.keys() == tb.keys()
    different = [k for k in ta if isinstance(ta[k], torch.Tensor) and not torch.equal(ta[k], tb[k])]
    assert not different, different
    # The logs cover the whole pass once: no record lost, none duplicated.
    assert [r["step"] for r in read_jsonl(a / "metrics.jsonl")] == [r["step"] for r in read_jsonl(b / "metrics.jsonl")]
    ra, rb = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb] and [r["lr"] for r in ra] == [r["lr"] for r in rb]
    if os.path.exists(a / "hdet.jsonl"):
        ha, hb = read_jsonl(a / "hdet.jsonl"), read_jsonl(b / "hdet.jsonl")
        assert [(r["step"], r["hparams"]) for r in ha] == [(r["step"], r["hparams"]) for r in hb]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_cache, tiny_dataset):
    runs = {}
    for name, layout in LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp("ref") / name
        proc = run_train(run_dir, *FAST, *layout, data_cache=data_cache)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = run_dir
    return runs


# kill case -> (layout, extra overrides, the first step it may be killed at); the async case is compared
# with the plain layout's run; the explore case is killed after its hand-over at step 20.
KILL_CASES = {"plain": ("plain", [], 5), "hdet": ("hdet", [], 5),
              "plain_async": ("plain", ["trainer.periodic_checkpoint.async_save=true"], 5),
              "hdet_explore": ("hdet_explore", [], 26), "range_test": ("range_test", [], 5)}


@pytest.mark.slow  # six tiny runs, two of them on four workers: about 3 min on 2 cores
@pytest.mark.parametrize("name", list(KILL_CASES))
def test_a_killed_run_resumes_bit_for_bit(name, uninterrupted, tmp_path, data_cache, monkeypatch):
    layout, extra, earliest = KILL_CASES[name]
    ref = uninterrupted[layout]
    steps = read_json(ref / "summary.json")["steps"]
    kill_step = random.Random(f"kill-{name}").randrange(earliest, steps - 1)  # seeded: the same step every run
    run_dir = tmp_path / "killed"
    monkeypatch.setenv("RECSYS_HDET_FAULTS", f"kill@step={kill_step}:rank=1")
    first = run_train(run_dir, *FAST, *LAYOUTS[layout], *extra, data_cache=data_cache)
    assert first.returncode != 0 and "killed by signal SIGKILL" in first.stderr, first.stderr[-2000:]
    assert not (run_dir / "summary.json").exists()
    ckpts = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoint").glob("step-*"))
    # the kill comes inside step kill_step, before its own checkpoint would be written; an async
    # checkpoint is published by the next one, so the last one written is not yet there
    last = (kill_step - 1) // EVERY * EVERY - (EVERY if extra else 0)
    assert ckpts and ckpts[-1] == last and len(ckpts) <= 2, ckpts  # keep_last = 2
    second = run_train(run_dir, *FAST, *LAYOUTS[layout], *extra, data_cache=data_cache)  # trainer.resume=auto
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoint' / f'step-{ckpts[-1]}'} at step {ckpts[-1]}" in second.stdout
    assert read_json(run_dir / "summary.json")["resumed_from_step"] == ckpts[-1]
    assert not list((run_dir / "checkpoint").glob("step-*"))  # removed once the pass is over
    _assert_same_run(ref, run_dir)
    if layout == "range_test":
        # The commit is the run's state: the resumed attempt trains at the first attempt's rates without sweeping
        # again, range_test.json is the first sweep's, and the sweep's cost is counted once.
        assert "HDET range test committed" in first.stdout and "HDET range test committed" not in second.stdout
        assert "reusing the commit of" in second.stdout
        summary, ref_summary = read_json(run_dir / "summary.json"), read_json(ref / "summary.json")
        assert summary["lr"]["max_lr"] == ref_summary["lr"]["max_lr"] == read_json(run_dir / "range_test.json")["committed"]
        assert summary["hdet"]["range_test"]["reused_from"].endswith(f"step-{ckpts[-1]}")
        assert summary["cost"]["range_test"]["steps"] == 8 and summary["cost"]["total"]["steps"] == steps + 8
        assert read_json(run_dir / "range_test.json")["seconds"] == summary["cost"]["range_test"]["seconds"]
    # A third invocation finds the run finished and does nothing.
    third = run_train(run_dir, *FAST, *LAYOUTS[layout], *extra, data_cache=data_cache)
    assert third.returncode == 0 and "holds a finished run" in third.stdout


@pytest.mark.slow
def test_a_checkpoint_that_fails_to_write_is_discarded_and_training_goes_on(uninterrupted, tmp_path, data_cache,
                                                                           monkeypatch):
    # A full disk on rank 1 at step 10's checkpoint, then a kill at step 12: the resume comes from step 5.
    run_dir = tmp_path / "diskfull"
    monkeypatch.setenv("RECSYS_HDET_FAULTS", "checkpoint_fails@step=10:rank=1,kill@step=12:rank=0")
    first = run_train(run_dir, *FAST, *LAYOUTS["plain"], data_cache=data_cache)
    assert first.returncode != 0
    assert "checkpoint at step 10 FAILED and was discarded" in first.stdout
    assert "No space left on device" in first.stdout
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == ["step-5"]  # the last good one is kept
    second = run_train(run_dir, *FAST, *LAYOUTS["plain"], data_cache=data_cache)
    assert second.returncode == 0 and "at step 5 of" in second.stdout, second.stderr[-2000:]
    _assert_same_run(uninterrupted["plain"], run_dir)


@pytest.mark.slow
def test_max_restarts_restarts_the_job_from_its_checkpoint(uninterrupted, tmp_path, data_cache, monkeypatch):
    run_dir = tmp_path / "restarted"
    monkeypatch.setenv("RECSYS_HDET_FAULTS", "kill@step=10:rank=0")
    proc = run_train(run_dir, *FAST, *LAYOUTS["plain"], "trainer.max_restarts=1", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "worker 0 was killed by signal SIGKILL" in proc.stderr
    assert "restart 1 of trainer.max_restarts=1" in proc.stderr
    _assert_same_run(uninterrupted["plain"], run_dir)


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_and_completes(uninterrupted, tmp_path, data_cache):
    run_dir = tmp_path / "torchrun"
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore",
           "RECSYS_HDET_FAULTS": "kill@step=10:rank=1"}
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc-per-node=2", "--max-restarts=1",
           "-m", "recsys_hdet.train", *FAST, *LAYOUTS["plain"], f"run_dir={run_dir}"]
    proc = run_command(cmd, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_run(uninterrupted["plain"], run_dir)


def test_resume_refuses_a_config_that_changes_the_checkpoints_meaning(tmp_path):
    from recsys_hdet.resume import config_changes

    saved = {"model": {"embedding_dim": 16}, "trainer": {"log_every": 25, "nproc": 4}, "data": {"batch_size": 256}}
    now = {"model": {"embedding_dim": 32}, "trainer": {"log_every": 5, "nproc": 4}, "data": {"batch_size": 256}}
    assert config_changes(saved, now) == (["model.embedding_dim"], ["trainer.log_every"])


def _fake_checkpoint(directory, step, run_dir, config=None):
    """A step-<N> directory laid out as CheckpointManager publishes one (tiny fake shard files)."""
    path = directory / f"step-{step}"
    path.mkdir(parents=True)
    for name, body in ((".metadata", b"m"), ("__0_0.distcp", b"x" * 10), ("__1_0.distcp", b"y" * 12)):
        (path / name).write_bytes(body)
    manifest = {"step": step, "world_size": 2, "run_dir": str(run_dir), "files": ["__0_0.distcp", "__1_0.distcp"],
                "sizes": {"__0_0.distcp": 10, "__1_0.distcp": 12}, "config": config or {}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_a_corrupt_or_foreign_checkpoint_is_named_and_skipped_for_the_previous_one(tmp_path):
    from recsys_hdet.components.checkpoint import CheckpointError, check_step_checkpoint, latest_step_checkpoint

    run_dir = tmp_path / "run"
    ck = run_dir / "checkpoint"
    _fake_checkpoint(ck, 4, run_dir)
    missing = _fake_checkpoint(ck, 8, run_dir)
    (missing / "__1_0.distcp").unlink()
    said = []
    path, manifest = latest_step_checkpoint(str(ck), str(run_dir), say=said.append)
    assert path == str(ck / "step-4") and manifest["step"] == 4
    assert len(said) == 1 and "step-8" in said[0] and "__1_0.distcp" in said[0] and "missing" in said[0]
    truncated = _fake_checkpoint(ck, 12, run_dir)
    (truncated / "__0_0.distcp").write_bytes(b"x" * 3)
    with pytest.raises(CheckpointError, match="truncated"):
        check_step_checkpoint(str(truncated))
    foreign = _fake_checkpoint(ck, 16, tmp_path / "another_run")
    with pytest.raises(CheckpointError, match="another_run"):
        check_step_checkpoint(str(foreign), str(run_dir))
    shutil.rmtree(ck / "step-4")
    (ck / "step-20").mkdir()  # published name, no manifest: never complete
    msgs = []
    assert latest_step_checkpoint(str(ck), str(run_dir), say=msgs.append) is None
    assert "step-20" in msgs[0] and "manifest" in msgs[0] and len(msgs) == 4


def _train(run_dir, *overrides, data_cache):
    return run_train(run_dir, "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1", *overrides,
                     data_cache=data_cache, timeout=120)


def test_resume_never_refuses_a_run_directory_that_holds_a_run(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    proc = _train(run_dir, "trainer.resume=never", data_cache=data_cache)
    assert proc.returncode == 2 and "trainer.resume=never" in proc.stderr and str(run_dir) in proc.stderr


def test_resume_from_a_checkpoint_with_another_model_names_the_keys(tmp_path, data_cache, tiny_dataset):
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    # The resolved config the checkpoint was written with: the same run, a wider embedding.
    import hydra

    with hydra.initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        cfg = hydra.compose("config", overrides=["data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1",
                                                 "model.embedding_dim=32"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    ck = _fake_checkpoint(tmp_path / "elsewhere", 4, run_dir, saved)
    proc = _train(run_dir, f"trainer.resume={ck}", "trainer.log_every=5", data_cache=data_cache)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "model.embedding_dim (32 -> 16)" in proc.stderr and "cannot resume" in proc.stderr
    bad = _train(run_dir, f"trainer.resume={tmp_path / 'nothing'}", data_cache=data_cache)
    assert bad.returncode == 2 and "manifest" in bad.stderr


def test_a_second_job_on_the_same_run_directory_refuses(tmp_path, data_cache, tiny_dataset):
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        held.write("pid 12345\n")
        held.flush()
        proc = _train(run_dir, data_cache=data_cache)
    assert proc.returncode == 2 and "in use by another training job (pid 12345)" in proc.stderr


@pytest.mark.slow
def test_a_run_killed_after_a_rollback_resumes_bit_for_bit(tmp_path, data_cache, tiny_dataset, monkeypatch):
    # Steps 17-19 train with every LR x1000: the check at 20 is rolled back to the state of step 15,
    # the LRs are halved, and step 20's checkpoint holds the result; the kill at step 22 comes before
    # the next one. The resumed run must carry the cut LRs, the rollback record and the pass's loss sums.
    spike = "lr_spike@step=17:steps=3"
    ref, run_dir = tmp_path / "ref", tmp_path / "killed"
    monkeypatch.setenv("RECSYS_HDET_FAULTS", spike)
    assert run_train(ref, *FAST, *LAYOUTS["plain"], data_cache=data_cache).returncode == 0
    monkeypatch.setenv("RECSYS_HDET_FAULTS", f"{spike},kill@step=22:rank=1")
    first = run_train(run_dir, *FAST, *LAYOUTS["plain"], data_cache=data_cache)
    assert first.returncode != 0 and "ROLLBACK 1/3 at step 20" in first.stdout, first.stdout[-2000:]
    second = run_train(run_dir, *FAST, *LAYOUTS["plain"], data_cache=data_cache)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "at step 20 of" in second.stdout and "ROLLBACK" not in second.stdout
    _assert_same_run(ref, run_dir)
    a, b = read_json(ref / "summary.json"), read_json(run_dir / "summary.json")
    assert a["rollback"]["events"] == b["rollback"]["events"] and len(a["rollback"]["events"]) == 1
