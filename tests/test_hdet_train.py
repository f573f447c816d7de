"""HDET in the training job: real multi-process runs of python -m recsys_hdet.train."""
import os

import pytest
import torch

from conftest import read_json, read_jsonl, run_train
from recsys_hdet.hdet import spread_multipliers

FAST = ["data=tiny", "trainer.log_every=10"]


def _checkpoint_tensors(path, out):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(out))
    state = torch.load(out, weights_only=False)["model"]
    return {k: (v.to_dense() if hasattr(v, "to_dense") and v.layout != torch.strided else v) for k, v in state.items()}


def test_alpha_zero_reproduces_the_plain_run_exactly(tmp_path, data_cache, tiny_dataset):
    common = [*FAST, "trainer.nproc=2", "trainer.sharding_group_size=2"]
    plain = run_train(tmp_path / "plain", *common, data_cache=data_cache)
    hdet = run_train(tmp_path / "hdet", *common, "hdet=enabled", "hdet.alpha=0", "hdet.sync_every=5",
                     "hdet.controller_start=0", data_cache=data_cache)
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


def test_two_by_two_hdet_run_spreads_every_group_and_reshuffles(tmp_path, data_cache, tiny_dataset):
    run_dir = tmp_path / "hdet"
    proc = run_train(run_dir, *FAST, "trainer.nproc=4", "trainer.sharding_group_size=2", "hdet=enabled",
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
            multipliers = sorted(v / h["base"] for v in h["values"])
            assert multipliers == pytest.approx(spread_multipliers(n, 0.2).tolist(), rel=1e-9)
            assert sum(multipliers) / n == pytest.approx(1.0, rel=1e-12)
    for name in ("lr/transformer", "lr/non_embedding", "lr/no_decay"):
        orders = [tuple(sorted(range(4), key=r["hparams"][name]["values"].__getitem__)) for r in records]
        assert len(set(orders)) > 1, f"{name} is reshuffled between syncs"
    s = read_json(run_dir / "summary.json")
    assert s["status"] == "completed"
