"""TensorBoard scalars (trainer.tensorboard): the writer, its resume purge, and a real run's event
files read back and compared with metrics.jsonl and hdet.jsonl.

Event files are read with TensorBoard's Python reader, ``EventAccumulator`` (conftest's
``tensorboard_scalars``: what ``tensorboard --load_fast=false`` serves from, and what honours
``purge_step``'s SessionLog.START event). The default suite also reads the event files of the real
runs it already makes: tests/test_train.py (a plain run), tests/test_hdet_train.py (an HDET run,
``trainer.tensorboard=false``, and a run that diverges at a sync).
"""
import os
import time

import pytest
from omegaconf import OmegaConf

from conftest import REPO, assert_tensorboard_matches_records, read_json, read_jsonl, run_train, tensorboard_scalars

TASKS = ("contribution", "like", "long_dwell")
GROUPS = ("embedding", "transformer", "non_embedding", "no_decay")


def _metrics_record(step, offset):
    return {"step": step, "examples": step * 512, "loss": {"like": 0.3 + offset + step / 1000, "avg": 0.2 + offset},
            "lr": {"embedding": 0.01 * step, "transformer": 0.001}, "examples_per_sec": 1000.0 + offset}


def _hdet_record(step, offset):
    return {"step": step, "losses": [0.30 + offset, None], "excluded": [1],
            "hparams": {"lr/embedding": {"base": 0.01 + offset, "values": [0.009 + offset, 0.011 + offset],
                                         "velocity": 0.0, "next_base": 0.012}}}


def _next_second():
    # Event files are read in name order, and the name starts with the creation time in whole
    # seconds; a resumed attempt is a later process, so its file sorts after the crashed one's.
    # Two writers of this one test process could be created within one second: wait for the next.
    time.sleep(1.0 - time.time() % 1.0 + 0.02)


def test_a_resumed_writer_continues_the_curves_without_duplicated_steps(tmp_path):
    from recsys_hdet.components.tensorboard import TensorBoardWriter

    log_dir = tmp_path / "tensorboard"
    first = TensorBoardWriter(str(log_dir), start_step=0)
    for step in (10, 20, 30, 40):  # the crashed attempt logged up to step 40...
        first.log_metrics(_metrics_record(step, 0.0))
        first.log_hdet(_hdet_record(step, 0.0))
    first.close()
    _next_second()
    # ...its last checkpoint was after step 20: the resumed attempt starts with 20 steps done and
    # logs 30, 40 again (other values), then goes on. The records up to step 20 stay valid.
    resumed = TensorBoardWriter(str(log_dir), start_step=20)
    for step in (30, 40, 50, 60):
        resumed.log_metrics(_metrics_record(step, 1.0))
        resumed.log_hdet(_hdet_record(step, 1.0))
    resumed.close()
    assert len([f for f in os.listdir(log_dir) if "tfevents" in f]) == 2

    series = tensorboard_scalars(log_dir)
    assert set(series) == {"loss/like", "loss/avg", "lr/embedding", "lr/transformer", "throughput/examples_per_s",
                           "hdet/lr/embedding/base", "hdet/lr/embedding/replica0", "hdet/lr/embedding/replica1",
                           "hdet/lr/embedding/velocity", "hdet/lr/embedding/next_base",
                           "hdet/window_loss/replica0", "hdet/excluded_replicas"}
    for tag, points in series.items():
        steps = [s for s, _ in points]
        assert steps == [10, 20, 30, 40, 50, 60], (tag, steps)  # strictly increasing, no duplicates
    expected = {10: 0.0, 20: 0.0, 30: 1.0, 40: 1.0, 50: 1.0, 60: 1.0}  # the resumed values after step 20
    assert series["loss/like"] == [(s, pytest.approx(0.3 + o + s / 1000, rel=1e-6)) for s, o in expected.items()]
    assert series["throughput/examples_per_s"] == [(s, pytest.approx(1000.0 + o)) for s, o in expected.items()]
    assert series["lr/embedding"] == [(s, pytest.approx(0.01 * s, rel=1e-6)) for s in expected]
    assert series["hdet/lr/embedding/replica1"] == [(s, pytest.approx(0.011 + o, rel=1e-6)) for s, o in expected.items()]
    assert series["hdet/window_loss/replica0"] == [(s, pytest.approx(0.30 + o, rel=1e-6)) for s, o in expected.items()]
    # A null window loss (an excluded replica) is left out, not written as a number.
    assert "hdet/window_loss/replica1" not in series
    assert series["hdet/excluded_replicas"] == [(s, 1.0) for s in expected]


def test_a_fresh_run_in_a_reused_directory_shows_only_the_new_run(tmp_path):
    from recsys_hdet.components.tensorboard import TensorBoardWriter

    old = TensorBoardWriter(str(tmp_path), start_step=0)
    for step in (10, 20, 30):
        old.log_metrics(_metrics_record(step, 0.0))
    old.close()
    _next_second()
    new = TensorBoardWriter(str(tmp_path), start_step=0)  # metrics.jsonl is rewritten; so are the curves
    for step in (10, 20):
        new.log_metrics(_metrics_record(step, 1.0))
    new.close()
    assert tensorboard_scalars(tmp_path)["loss/avg"] == [(10, pytest.approx(1.2)), (20, pytest.approx(1.2))]


def test_disabled_or_other_ranks_get_a_writer_that_writes_nothing(tmp_path):
    from recsys_hdet.components.tensorboard import NullTensorBoard, TensorBoardWriter, build_tensorboard

    on = OmegaConf.create({"trainer": {"tensorboard": True}})
    off = OmegaConf.create({"trainer": {"tensorboard": False}})
    for cfg, rank in ((off, 0), (on, 1)):
        w = build_tensorboard(cfg, str(tmp_path), rank)
        assert type(w) is NullTensorBoard
        w.log_metrics(_metrics_record(10, 0.0))
        w.log_hdet(_hdet_record(10, 0.0))
        w.close()
    assert os.listdir(tmp_path) == []
    w = build_tensorboard(on, str(tmp_path), 0)
    assert isinstance(w, TensorBoardWriter) and w.log_dir == os.path.join(str(tmp_path), "tensorboard")
    w.close()


@pytest.mark.parametrize("value", ["maybe", "null"])
def test_a_non_bool_trainer_tensorboard_is_refused(value):
    # The typed schema refuses it at composition ("yes"/"no", "1"/"0" are OmegaConf's spellings of a bool).
    from hydra import compose, initialize_config_dir

    from conftest import config_error

    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        assert compose("config", overrides=["data=tiny"]).trainer.tensorboard is True  # on by default
    message = config_error("data=tiny", f"trainer.tensorboard={value}")
    assert "trainer.tensorboard" in message and "(expected bool)" in message, message


@pytest.mark.slow  # two more multi-process runs (130 s measured on 2 busy cores); the default suite checks the runs it makes anyway
def test_an_hdet_run_writes_metrics_and_syncs_as_scalars_and_false_writes_none(tmp_path, data_cache, tiny_dataset):
    # 2 ranks, 2 sharding groups of one: every group's LR (embedding included) has 2 replicas.
    run_dir = tmp_path / "hdet"
    proc = run_train(run_dir, "data=tiny", "trainer.log_every=10", "trainer.nproc=2", "trainer.sharding_group_size=1",
                     "trainer.checkpoint=false", "hdet=controller", "hdet.sync_every=5", "hdet.controller_start=0",
                     data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    series = assert_tensorboard_matches_records(run_dir)  # every tag, step and value of both records

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in metrics]
    assert len(steps) >= 3 and steps[-1] == read_json(run_dir / "summary.json")["steps"]
    for tag in (*(f"loss/{t}" for t in (*TASKS, "avg")), *(f"lr/{g}" for g in GROUPS), "throughput/examples_per_s"):
        assert [s for s, _ in series[tag]] == steps, tag
    assert [v for _, v in series["loss/like"]] == pytest.approx([r["loss"]["like"] for r in metrics], rel=1e-6)
    syncs = read_jsonl(run_dir / "hdet.jsonl")
    sync_steps = [r["step"] for r in syncs]
    assert len(sync_steps) >= 3 and sync_steps[0] == 5
    for name in (f"lr/{g}" for g in GROUPS):
        for tag in ("base", "replica0", "replica1"):
            assert [s for s, _ in series[f"hdet/{name}/{tag}"]] == sync_steps, (name, tag)
        assert f"hdet/{name}/replica2" not in series
        assert [v for _, v in series[f"hdet/{name}/replica1"]] == \
            pytest.approx([r["hparams"][name]["values"][1] for r in syncs], rel=1e-6)
    assert [(s, v) for s, v in series["hdet/window_loss/replica0"]] == \
        [(r["step"], pytest.approx(r["losses"][0], rel=1e-6)) for r in syncs]
    assert len(set(r["hparams"]["lr/transformer"]["values"][0] for r in syncs)) > 1, "the replicas' values move"

    off = tmp_path / "off"
    proc = run_train(off, "data=tiny", "trainer.log_every=10", "trainer.nproc=2", "trainer.sharding_group_size=2",
                     "trainer.checkpoint=false", "trainer.tensorboard=false", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert os.path.isfile(off / "metrics.jsonl") and not os.path.exists(off / "tensorboard")


def test_the_hparams_row_shows_each_group_s_decay_as_trained():
    """optim.schedule.groups.<group>.decay_start / .anneal_strategy: the values the pass trained with (the shared
    one-cycle's where the group has none of its own), not the config's nulls, so that rows of runs compare."""
    from recsys_hdet.components.lr_scheduler import build_schedules, describe_schedules
    from recsys_hdet.components.tensorboard import trained_hparams
    from recsys_hdet.config import compose

    cfg = compose("config", ["+experiment=baseline_low", "optim.schedule.groups.embedding.decay_start=0.7",
                             "optim.schedule.groups.no_decay.anneal_strategy=linear"])
    summary = {"lr": {"max_lr": {g: float(cfg.optim.lr[g]) for g in GROUPS},
                      "schedule": describe_schedules(build_schedules(cfg.optim, GROUPS, 100))}}
    row = trained_hparams(cfg, summary)
    assert {g: (row[f"optim.schedule.groups.{g}.decay_start"], row[f"optim.schedule.groups.{g}.anneal_strategy"])
            for g in GROUPS} == {"embedding": (0.7, "cos"), "transformer": (0.3, "cos"),
                                 "non_embedding": (0.3, "cos"), "no_decay": (0.3, "linear")}
