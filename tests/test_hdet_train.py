"""HDET in the training job: real multi-process runs of python -m recsys_hdet.train."""
import math
import os

import pytest
import torch

from omegaconf import OmegaConf

from conftest import assert_tensorboard_matches_records, read_json, read_jsonl, run_train
from recsys_hdet.components.lr_scheduler import build_one_cycle
from recsys_hdet.hdet.controller.statistics import spread_multipliers

FAST = ["data=tiny", "trainer.log_every=10"]


def _checkpoint_tensors(path, out):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(out))
    state = torch.load(out, weights_only=False)["model"]
    return {k: (v.to_dense() if hasattr(v, "to_dense") and v.layout != torch.strided else v) for k, v in state.items()}


@pytest.mark.slow  # HDET's retired controller, the default run's budget: `make test-all` runs it
def test_alpha_zero_reproduces_the_plain_run_exactly(tmp_path, data_cache, tiny_dataset):
    # 2 x 2: two sharding groups (embedding replicas) of two ranks, so the embedding replicas'
    # averaging cadence is part of the invariant, not only the dense replicas'.
    common = [*FAST, "trainer.nproc=4", "trainer.sharding_group_size=2"]
    plain = run_train(tmp_path / "plain", *common, "trainer.tensorboard=false", data_cache=data_cache)
    # signal=train: the default probe signal reserves hdet.probe_rows rows of each day from training, so
    # a probe run trains on other rows than the plain one; the engine's invariant (alpha = 0 changes
    # nothing in training) is checked with the signal that leaves the data alone.
    hdet = run_train(tmp_path / "hdet", *common, "hdet=controller", "hdet.alpha=0", "hdet.sync_every=5",
                     "hdet.controller_start=0", "hdet.signal=train", data_cache=data_cache)
    assert plain.returncode == 0 and hdet.returncode == 0, hdet.stdout[-2000:] + hdet.stderr[-2000:]
    a = _checkpoint_tensors(tmp_path / "plain" / "checkpoint", tmp_path / "a.pt")
    b = _checkpoint_tensors(tmp_path / "hdet" / "checkpoint", tmp_path / "b.pt")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert read_json(tmp_path / "plain" / "summary.json")["train_loss"] == read_json(tmp_path / "hdet" / "summary.json")["train_loss"]
    lr_plain = [r["lr"] for r in read_jsonl(tmp_path / "plain" / "metrics.jsonl")]
    lr_hdet = [r["lr"] for r in read_jsonl(tmp_path / "hdet" / "metrics.jsonl")]
    assert lr_plain == lr_hdet
    # ...and HDET did run (mutant: HDET silently off at alpha = 0): a sync every 5 steps and at the end.
    steps = read_json(tmp_path / "hdet" / "summary.json")["steps"]
    expected = [*range(5, steps + 1, 5), *([steps] if steps % 5 else [])]
    assert [r["step"] for r in read_jsonl(tmp_path / "hdet" / "hdet.jsonl")] == expected
    assert read_json(tmp_path / "hdet" / "summary.json")["hdet"]["syncs"] == len(expected)
    assert "HDET sync at step 5:" in hdet.stdout
    assert not os.path.exists(tmp_path / "plain" / "hdet.jsonl")
    # TensorBoard: the HDET run's event files hold both records' scalars; trainer.tensorboard=false writes none.
    series = assert_tensorboard_matches_records(tmp_path / "hdet")
    assert [s for s, _ in series["hdet/lr/transformer/replica1"]] == expected
    assert not os.path.exists(tmp_path / "plain" / "tensorboard")


@pytest.mark.slow  # the probe-signal test keeps a 2 x 2 HDET run in the default suite
def test_two_by_two_hdet_run_spreads_every_group_and_reshuffles(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "hdet"
    proc = run_train(run_dir, *FAST, "trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=controller",
                     "hdet.alpha=0.2", "hdet.sync_every=4", "hdet.controller_start=8", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "HDET sync at step 4: base lr embedding=" in proc.stdout
    records = read_jsonl(run_dir / "hdet.jsonl")
    assert len(records) >= 4
    expected_replicas = {"lr/embedding": 2, "lr/transformer": 4, "lr/non_embedding": 4, "lr/no_decay": 4}
    for r in records:
        assert set(r) >= {"step", "losses", "hparams", "excluded"} and r["excluded"] == []
        assert len(r["losses"]) == 4
        assert set(r["hparams"]) == set(expected_replicas)
        for name, n in expected_replicas.items():
            h = r["hparams"][name]
            assert set(h) >= {"base", "values", "velocity"}
            # The default spread is geometric (hdet.space=log): 1.2^u, whose geometric mean is the base.
            multipliers = sorted(v / h["base"] for v in h["values"])
            assert multipliers == pytest.approx(spread_multipliers(n, 0.2, "log").tolist(), rel=1e-9)
            assert math.exp(sum(math.log(m) for m in multipliers) / n) == pytest.approx(1.0, rel=1e-12)
    for name in ("lr/transformer", "lr/non_embedding", "lr/no_decay"):
        orders = [tuple(sorted(range(4), key=r["hparams"][name]["values"].__getitem__)) for r in records]
        assert len(set(orders)) > 1, f"{name} is reshuffled between syncs"
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "completed"
    # The controller's last bases in max-LR units, for a job that carries them: the last sync's base
    # over the one-cycle value it replaces, times the configured max LR.
    last, steps = records[-1], s["steps"]
    for g in ("embedding", "transformer", "non_embedding", "no_decay"):
        schedule = build_one_cycle(OmegaConf.load(run_dir / ".hydra" / "config.yaml").optim.schedule, s["lr"]["max_lr"][g], steps)
        expected = schedule.max_lr * last["hparams"][f"lr/{g}"]["next_base"] / schedule(min(last["step"], steps - 1))[0]
        assert s["lr"]["controlled_max_lr"][g] == pytest.approx(expected, rel=1e-12)


def _fault_run(run_dir, faults, data_cache, *overrides):
    env_faults = {"RECSYS_HDET_FAULTS": faults}
    os.environ.update(env_faults)
    try:
        # The default controller (anneal-then-probe) with 1024 reserved rows, 2 x 256 of them for the
        # cooldown: the default 4096 would take a third of the tiny data set's training rows.
        return run_train(run_dir, *FAST, "trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=controller",
                         "hdet.sync_every=4", "hdet.controller_start=0", "hdet.probe_rows=1024",
                         "hdet.anneal_probe.steps=2", *overrides,
                         data_cache=data_cache)
    finally:
        del os.environ["RECSYS_HDET_FAULTS"]


@pytest.mark.slow  # HDET's retired controller, the default run's budget: `make test-all` runs it
def test_a_non_finite_replica_in_a_real_run_is_excluded_restored_and_training_goes_on(tmp_path, data_cache, tiny_dataset):
    """Mutants: the trainer's converge closure averaging nothing, or averaging NaN state in; DDP's
    gradient all-reduce letting one rank's NaN poison every rank; "diverged" on any non-finite rank."""
    run_dir = tmp_path / "nan"
    # After step 6, rank 3 (sharding group 1) holds a NaN dense parameter.
    proc = _fault_run(run_dir, "nan_state@step=6:rank=3", data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [r for r in read_jsonl(run_dir / "hdet.jsonl") if "event" not in r]  # sync records
    by_step = {r["step"]: r for r in records}
    # Rank 3's NaN output reaches its sharding-group peer (rank 2) through the embedding all-to-all's
    # gradients; the other sharding group's ranks stay finite (the gradient all-reduce skips NaN).
    assert by_step[4]["excluded"] == [] and by_step[8]["excluded"] == [2, 3]
    assert by_step[8]["losses"][2] is None and by_step[8]["losses"][3] is None
    assert all(x is not None for x in by_step[8]["losses"][:2])
    later = [r for r in records if r["step"] > 8]
    assert later and all(r["excluded"] == [] and None not in r["losses"] for r in later), "restored at the sync"
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "completed"
    assert all(math.isfinite(s["eval"][t]["ne"]) and s["eval"][t]["ne"] < 1.2 for t in s["eval"])
    assert "excluded ranks [2, 3]" in proc.stdout
    assert "final model bit-identical on every replica" in proc.stdout


@pytest.mark.slow  # a real 4-rank fault run; the one-replica fault run stays in the default suite
def test_the_run_diverges_only_when_no_replica_is_finite(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "all_nan"
    proc = _fault_run(run_dir, "nan_state@step=6", data_cache, "trainer.rollback.max_rollbacks=0")  # every rank
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DIVERGED at step 8: every replica non-finite at the sync" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert read_jsonl(run_dir / "hdet.jsonl")[-1] == {"step": 8, "losses": [None] * 4, "hparams": {},
                                                      "excluded": [0, 1, 2, 3]}
    # The event files were flushed on the way out: they end with the diverged sync and interval.
    series = assert_tensorboard_matches_records(run_dir)
    assert series["hdet/excluded_replicas"][-1] == (8, 4.0) and series["loss/avg"][-1][0] == 8
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "diverged" and s["steps"] == 8 and "eval" not in s
    assert not os.path.exists(run_dir / "checkpoint")


@pytest.mark.slow  # a real 4-rank fault run
def test_every_replica_non_finite_is_rolled_back_and_the_hdet_run_completes(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "all_nan_rollback"
    proc = _fault_run(run_dir, "nan_state@step=6", data_cache)  # every rank; rollback on (the default)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ROLLBACK 1/3 at step 8: every replica non-finite at the sync" in proc.stdout
    lines = read_jsonl(run_dir / "hdet.jsonl")
    events = [r for r in lines if r.get("event") == "rollback"]
    assert len(events) == 1 and events[0]["step"] == 8 and events[0]["restored_step"] == 0
    later = [r for r in lines if "event" not in r and r["step"] > 8]
    assert later and all(r["excluded"] == [] and None not in r["losses"] for r in later)
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "completed" and s["rollback"]["count"] == 1
    assert all(math.isfinite(s["eval"][t]["ne"]) for t in s["eval"])
    assert "final model bit-identical on every replica" in proc.stdout
    assert_tensorboard_matches_records(run_dir)  # the event line adds no scalars


@pytest.mark.slow  # more multi-process runs than the default suite has time for; `make test-all` runs it
def test_serving_signal_judges_replicas_by_the_served_loss(tmp_path, data_cache, tiny_dataset):
    """hdet.signal=serving scores the replicas by the loss without smoothing (or dropout); train by the
    training objective. With label smoothing 0.4 the smoothed BCE can never fall below the entropy of
    a 0.2/0.8 target, H(0.2) = 0.5004 nats per task, while the served loss falls well below it."""
    floor = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
    windows = {}
    for signal in ("train", "serving"):
        run_dir = tmp_path / signal
        proc = run_train(run_dir, *FAST, "trainer.nproc=2", "trainer.sharding_group_size=2", "hdet=controller",
                         "hdet.sync_every=10", f"hdet.signal={signal}", "loss.label_smoothing=0.4",
                         "trainer.checkpoint=false", data_cache=data_cache)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        windows[signal] = [r["losses"] for r in read_jsonl(run_dir / "hdet.jsonl")]
    assert all(x > floor for w in windows["train"] for x in w), windows["train"]
    assert all(x < floor - 0.05 for w in windows["serving"][1:] for x in w), windows["serving"]


@pytest.mark.slow  # more multi-process runs than the default suite has time for; `make test-all` runs it
def test_warm_start_is_pretrained_on_first_use_and_each_replica_gets_its_own_noise(tmp_path, data_cache, tiny_dataset):
    """trainer.warm_start_preset trains the missing checkpoint first; hdet.warm_init.nu perturbs every
    replica by N(0, (nu ||theta|| / sqrt(d))^2) per tensor. With learning rates of 1e-9 nothing else
    moves the weights, so the final average of R = 2 replicas (2 ranks = 2 sharding groups of 1, for
    the dense and the embedding groups alike) is theta_0 plus noise of norm nu ||theta_0|| / sqrt(2)."""
    pre = tmp_path / "pre"
    nu = 0.01
    tiny_lr = [f"optim.lr.{g}=1e-9" for g in ("embedding", "transformer", "non_embedding", "no_decay")]
    proc = run_train(tmp_path / "warm", *FAST, "trainer.nproc=2", "trainer.sharding_group_size=1", "hdet=controller",
                     "hdet.autolr=false", f"hdet.warm_init.nu={nu}", f"trainer.warm_start={pre / 'checkpoint'}",
                     "trainer.warm_start_preset=baseline_low",
                     "trainer.warm_start_overrides=['data=tiny','trainer.nproc=2','trainer.sharding_group_size=1',"
                     "'data.train_days=1']", *tiny_lr, data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training it first with +experiment=baseline_low" in proc.stdout
    assert read_json(pre / "summary.json")["status"] == "completed"
    assert f"HDET warm init: every replica perturbed with nu={nu}" in proc.stdout
    before = _checkpoint_tensors(pre / "checkpoint", tmp_path / "before.pt")
    after = _checkpoint_tensors(tmp_path / "warm" / "checkpoint", tmp_path / "after.pt")
    large = [k for k, t in before.items() if t.is_floating_point() and t.numel() >= 1000]
    assert any(k.startswith("ebc.") for k in large) and any(not k.startswith("ebc.") for k in large)
    for k in large:
        relative = float((after[k] - before[k]).norm() / before[k].norm())
        assert relative == pytest.approx(nu / math.sqrt(2), rel=0.1), k


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores); `make test-all` runs it
def test_probe_signal_scores_every_replica_on_the_same_rows(tmp_path, data_cache, tiny_dataset):
    """hdet.signal=probe at alpha = 0 on 2 sharding groups x 2 ranks: the two ranks of a sharding
    group hold the same model (identical dense copies, the same tables), so scored on the same probe
    rows their losses are equal bit for bit, while their window training losses (each rank's own
    data) are not. Mutants: the probe not wired (training losses scored), probe rows differing by rank."""
    run_dir = tmp_path / "probe"
    proc = run_train(run_dir, *FAST, "trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=controller",
                     "hdet.alpha=0", "hdet.sync_every=5", "hdet.signal=probe", "hdet.probe_rows=1024",
                     "trainer.checkpoint=false", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every replica scores the same 1024 rows" in proc.stdout
    records = read_jsonl(run_dir / "hdet.jsonl")
    assert len(records) >= 3
    for r in records:
        probe, train = r["losses"], r["train_losses"]
        assert probe[0] == probe[1] and probe[2] == probe[3], probe
        assert train[0] != train[1] and train[2] != train[3], train
        assert probe != train


@pytest.mark.slow  # two more 2-rank runs (~80 s); the hook's arithmetic is in the default run (test_comm_hook.py)
def test_local_dense_gradients_train_apart_between_syncs_and_end_on_one_model(tmp_path, data_cache, tiny_dataset):
    """trainer.dense_gradients=local (local SGD): at alpha = 0 the only difference from the allreduce run
    is that each rank follows its own dense gradient between syncs, so the losses differ; the syncs
    average the replicas, so the run ends on one model (the trainer refuses to save differing replicas)."""
    common = [*FAST, "trainer.nproc=2", "trainer.sharding_group_size=2", "hdet=controller", "hdet.alpha=0",
              "hdet.sync_every=5", "hdet.signal=train", "trainer.tensorboard=false"]
    runs = {g: run_train(tmp_path / g, *common, f"trainer.dense_gradients={g}", data_cache=data_cache)
            for g in ("allreduce", "local")}
    for proc in runs.values():
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "final model bit-identical on every replica" in proc.stdout
    losses = {g: read_json(tmp_path / g / "summary.json")["train_loss"] for g in runs}
    assert losses["allreduce"] != losses["local"]
