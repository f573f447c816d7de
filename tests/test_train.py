"""Real multi-process training runs (gloo), started the way a user starts them."""
import math
import os
import sys

import pytest

from conftest import PLAIN_2X1, assert_tensorboard_matches_records, read_json, read_jsonl, run_command, run_train

TASKS = ("contribution", "like", "long_dwell")
FAST = ["data=tiny", "trainer.log_every=10"]


@pytest.fixture(scope="module")
def two_proc_run(plain_run):
    # conftest's PLAIN_2X1, trained once per session (tests/test_rollback.py compares its spiked run with it):
    # two sharding groups of one rank, each holding full tables (two embedding replicas, averaged),
    # experiment_name=two_proc.
    return plain_run


def test_two_process_run_writes_the_artifact_contract(two_proc_run):
    run_dir, proc = two_proc_run
    # train.log holds the run's console output, the workers' lines included
    log = (run_dir / "train.log").read_text()
    console = [line for line in proc.stdout.splitlines() if not line.startswith("[data_tools]")]
    assert console and "held-out" in proc.stdout and log.splitlines() == console, log[-2000:]
    s = read_json(run_dir / "summary.json")
    assert s["experiment"] == "two_proc" and s["status"] == "completed"
    assert s["steps"] > 0 and s["examples"] == s["steps"] * 256 * 2
    assert set(s["train_loss"]) == {*TASKS, "avg"}
    assert all(0 < v < 1 for v in s["train_loss"].values())
    for task in TASKS:
        m = s["eval"][task]
        assert set(m) >= {"auc", "ne", "logloss", "calibration"}
        assert 0 < m["logloss"] < 1 and math.isfinite(m["ne"])
        assert set(s["oracle"][task]) == {"ne", "logloss"}
        # No model beats the generator's true probabilities by more than noise.
        assert s["oracle"][task]["logloss"] < m["logloss"] + 0.01
    assert s["eval"]["long_dwell"]["auc"] > 0.6 and s["eval"]["like"]["auc"] > 0.55
    assert s["examples_per_sec"] > 0 and s["wall_seconds"] > 0 and s["peak_rss_mb"] > 50
    assert 0 < s["data_wait_seconds"] < s["train_seconds"] and 0 < s["data_wait_fraction"] < 1
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records][-1] == s["steps"]
    for r in records:
        assert set(r) >= {"step", "examples", "loss", "lr", "examples_per_sec"}
        assert set(r["loss"]) == {*TASKS, "avg"}
        assert set(r["lr"]) == {"embedding", "transformer", "non_embedding", "no_decay"}
        # torchrec.metrics over the interval, per task
        assert set(r["ne"]) == set(r["calibration"]) == set(r["auc"]) == set(TASKS)
        assert all(math.isfinite(r[m][t]) and r[m][t] > 0 for m in ("ne", "calibration", "auc") for t in TASKS)
    # The model learns: every task's interval NE falls from the first interval (predictions near 0.5 for
    # rare events: NE and calibration far above 1) to the last, which beats the base rate on long_dwell
    # and ranks better than chance.
    first, last = records[0], records[-1]
    assert all(last["ne"][t] < first["ne"][t] for t in TASKS)
    assert last["ne"]["long_dwell"] < 1 and last["auc"]["long_dwell"] > 0.6
    # (the metric's own arithmetic: tests/test_train_metrics.py)
    # What later jobs need of the run's learning rates, in summary.json (metrics.jsonl's values).
    lr = s["lr"]
    assert lr["trajectory"]["step"] == [r["step"] for r in records]
    for g in ("embedding", "transformer", "non_embedding", "no_decay"):
        assert lr["trajectory"][g] == [r["lr"][g] for r in records] and lr["final"][g] == records[-1]["lr"][g]
        assert lr["max_lr"][g] > 0
    assert "controlled_max_lr" not in lr  # no controller in a plain run
    assert os.path.isfile(run_dir / "checkpoint" / ".metadata")
    assert not os.path.exists(run_dir / "checkpoint.tmp")
    assert "held-out" in proc.stdout and "ex/s" in proc.stdout
    assert "2 embedding replicas" in proc.stdout


# The launcher's console copy (ConsoleLog) closed with a spawned child's multiprocessing resource tracker
# alive, as at the end of every run: the tracker, started by the first spawn, keeps the descriptors 1 and 2 it
# started with until the launcher exits.
_CLOSE_AFTER_A_SPAWN = """
import multiprocessing, sys, time
from recsys_hdet.components.console_log import ConsoleLog
log = ConsoleLog(sys.argv[1])
print("before the spawn", flush=True)
multiprocessing.get_context("spawn").Lock()  # a named semaphore: starts the resource tracker, as a spawn does
start = time.monotonic()
log.close()
print(f"closed in {time.monotonic() - start:.3f} s")
"""


def test_the_console_log_closes_without_waiting_on_the_resource_tracker(tmp_path):
    """Mutant: the tracker started under the log's pipes holds their write ends, and close() waits out its
    5 s timeout on each copy (a run's command then ended 10 s after its last line)."""
    proc = run_command([sys.executable, "-c", _CLOSE_AFTER_A_SPAWN, str(tmp_path / "train.log")], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "train.log").read_text() == "before the spawn\n"
    closed = float(proc.stdout.split("closed in ")[1].split(" s")[0])
    assert closed < 2.5, proc.stdout


def test_tensorboard_scalars_are_the_metrics_records(two_proc_run):
    # trainer.tensorboard is on by default: rank 0 writes tensorboard/ beside metrics.jsonl.
    run_dir, _ = two_proc_run
    series = assert_tensorboard_matches_records(run_dir)
    assert {"loss/like", "loss/avg", "lr/embedding", "throughput/examples_per_s"} <= set(series)
    # After the pass: the held-out metrics and the HParams row (the matching above checks their values).
    assert {"heldout/ne/like", "heldout/auc/long_dwell", "heldout/ne/mean", "hparam/heldout_ne_mean"} <= set(series)


def test_lr_follows_one_cycle_per_group(two_proc_run):
    from recsys_hdet.components.lr_scheduler import OneCycle

    run_dir, _ = two_proc_run
    total = read_json(run_dir / "summary.json")["steps"]
    records = read_jsonl(run_dir / "metrics.jsonl")
    max_lrs = {"embedding": 0.05, "transformer": 0.002, "non_embedding": 0.002, "no_decay": 0.002}
    for r in records:
        # Logged after the step: the rate set for the next step (the last step keeps its own).
        at = min(r["step"], total - 1)
        for group, max_lr in max_lrs.items():
            assert r["lr"][group] == pytest.approx(OneCycle(max_lr, total)(at)[0], rel=1e-12)


@pytest.mark.slow  # one more tiny run (about a minute on 2 busy cores); `make test-all` runs it
def test_a_group_s_own_decay_is_trained_and_shown_as_trained(tmp_path, data_cache, tiny_dataset):
    """optim.schedule.groups end to end: the logged LRs follow each group's schedule (the embedding group held at its
    peak to 0.7 of the pass, the transformer group linear from the rise's end, the others the shared one-cycle), and
    summary.json's lr.schedule and the TensorBoard HParams row name each group's decay as trained."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from recsys_hdet.components.lr_scheduler import DelayedDecay, OneCycle

    run_dir = tmp_path / "own_decay"
    proc = run_train(run_dir, *PLAIN_2X1, "optim.schedule.groups.embedding.decay_start=0.7",
                     "optim.schedule.groups.transformer.anneal_strategy=linear", "trainer.checkpoint=false",
                     data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = read_json(run_dir / "summary.json")
    total = s["total_steps"]
    schedules = {"embedding": DelayedDecay(0.05, total, decay_start=0.7, decay_strategy="cos"),
                 "transformer": DelayedDecay(0.002, total, decay_start=0.3, decay_strategy="linear"),
                 "non_embedding": OneCycle(0.002, total), "no_decay": OneCycle(0.002, total)}
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        for group, schedule in schedules.items():
            assert r["lr"][group] == schedule(min(r["step"], total - 1))[0], (group, r["step"])
    assert {g: (d["shared"], d["decay_start"], d["shape"]) for g, d in s["lr"]["schedule"].items()} == {
        "embedding": (False, 0.7, "cos"), "transformer": (False, 0.3, "linear"),
        "non_embedding": (True, 0.3, "cos"), "no_decay": (True, 0.3, "cos")}
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    row = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info.hparams
    assert row["optim.schedule.groups.embedding.decay_start"].number_value == 0.7
    assert row["optim.schedule.groups.no_decay.decay_start"].number_value == 0.3
    assert row["optim.schedule.groups.transformer.anneal_strategy"].string_value == "linear"


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores); `make test-all` runs it
def test_warm_start_loads_the_checkpoint_under_another_layout(two_proc_run, tmp_path, data_cache):
    run_dir, _ = two_proc_run
    proc = run_train(tmp_path / "warm", *FAST, "trainer.nproc=2", "trainer.sharding_group_size=2",
                     f"trainer.warm_start={run_dir / 'checkpoint'}", "data.train_days=1", "trainer.checkpoint=false",
                     "optim.lr.embedding=1e-9", "optim.lr.transformer=1e-9", "optim.lr.non_embedding=1e-9",
                     "optim.lr.no_decay=1e-9", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warm start from" in proc.stdout
    cold = read_json(run_dir / "summary.json")["eval"]
    warm = read_json(tmp_path / "warm" / "summary.json")["eval"]
    # With (almost) no further learning, the warm-started model scores as the checkpoint did.
    for task in TASKS:
        assert warm[task]["logloss"] == pytest.approx(cold[task]["logloss"], abs=2e-3)


def test_exploding_loss_ends_as_diverged(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "div"
    proc = run_train(run_dir, *FAST, "trainer.nproc=2", "trainer.sharding_group_size=2",
                     "optim.lr.embedding=500", "optim.lr.transformer=5", "optim.lr.non_embedding=5",
                     "optim.lr.no_decay=5", "optim.schedule.div_factor=1", "trainer.diverge_loss=1.0",
                     data_cache=data_cache)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "DIVERGED" in proc.stdout and "Traceback" not in proc.stderr
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "diverged" and "eval" not in s
    # Every rollback was tried first (the LRs halved three times are still ~60x too high).
    assert s["rollback"]["count"] == 3 and "after 3 rollback(s)" in proc.stdout
    assert not os.path.exists(run_dir / "checkpoint")
