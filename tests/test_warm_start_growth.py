"""Warm start from a checkpoint whose embedding tables are smaller than the data set's vocabularies
(a daily retraining job: the vocabularies grew since yesterday's model). The checkpoint's rows load
bit for bit into the first rows of each grown table, the new rows keep the model's fresh
initialization; a table that shrinks, changes dimension, or a feature added or removed is refused
by name. Real 2-process gloo jobs (sharded tables) and real training runs on the tiny data set."""
import json
import os
import shutil

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import read_json, run_train
from dist_helpers import NUM_DENSE, spawn

from recsys_hdet.components.model_checkpoint import CheckpointMismatch, grown_tables, load_model
from recsys_hdet.models.ranker import MultiTaskRanker, SparseFeature

OLD = {"user_id": 40, "video_id": 60, "tab": 8, "tag": 30}
GROWN = {"user_id": 40, "video_id": 75, "tab": 8, "tag": 33}  # video_id +15 rows, tag +3, the others as they were


def _features(vocab):
    return [SparseFeature(name, n, multi=name == "tag") for name, n in vocab.items()]


def _ranker(vocab, dim=8, num_dense=NUM_DENSE, device="cpu"):
    return MultiTaskRanker(_features(vocab), num_dense, ["a", "b"], embedding_dim=dim, device=device)


def _torch_save(directory):
    """A DCP directory's tensors, read with DCP's own converter (independent of load_model)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = str(directory) + ".pt"
    dcp_to_torch_save(str(directory), out)
    return torch.load(out, weights_only=False)["model"]


def _save_plain(model, directory):
    """A checkpoint of an unsharded model, as save_model writes it (DCP without a process group)."""
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(directory))
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump({"steps": 7}, f)


def _assert_grown(old, fresh, loaded, grown_keys):
    """Old rows bit-identical to the checkpoint's, new rows the fresh model's; everything else the
    checkpoint's."""
    assert set(loaded) == set(fresh)
    for key, value in loaded.items():
        if key in grown_keys:
            rows = old[key].shape[0]
            assert value.shape[0] > rows and value.shape[1:] == old[key].shape[1:], key
            assert torch.equal(value[:rows], old[key]), key
            assert torch.equal(value[rows:], fresh[key][rows:]), key
            # Not vacuous: the fresh model's rows differ from the checkpoint's, its new rows are not zeros.
            assert not torch.equal(fresh[key][:rows], old[key]), key
            assert value[rows:].abs().sum() > 0, key
        else:
            assert torch.equal(value, old[key]), key


# ---------------------------------------------------------------------------------------------
# One process, an unsharded model (plain tensors)


def test_an_unsharded_model_grows_its_tables(tmp_path):
    torch.manual_seed(1)
    _save_plain(_ranker(OLD), tmp_path / "old")
    torch.manual_seed(2)
    model = _ranker(GROWN)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    lines = []
    assert load_model(model, str(tmp_path / "old"), say=lines.append) == {"steps": 7}
    old = _torch_save(tmp_path / "old")
    _assert_grown(old, fresh, model.state_dict(), {"ebc.embedding_bags.t_video_id.weight",
                                                   "ebc.embedding_bags.t_tag.weight"})
    assert len(lines) == 1 and "video_id 60 -> 75 rows" in lines[0] and "tag 30 -> 33 rows" in lines[0]


def test_equal_shapes_take_the_plain_load(tmp_path):
    torch.manual_seed(1)
    _save_plain(_ranker(OLD), tmp_path / "old")
    torch.manual_seed(2)
    model = _ranker(OLD)
    lines = []
    load_model(model, str(tmp_path / "old"), say=lines.append)
    assert not lines
    old = _torch_save(tmp_path / "old")
    assert all(torch.equal(v, old[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("change, expected", [
    (dict(vocab={**OLD, "video_id": 50}), "feature 'video_id': the table shrinks from 60 rows in the checkpoint to 50"),
    (dict(vocab={**OLD, "author_id": 9}), "feature 'author_id' is not in the checkpoint"),
    (dict(vocab={k: v for k, v in OLD.items() if k != "tab"}),
     "feature 'tab' is in the checkpoint but not in the model"),
    (dict(dim=16), "feature 'video_id': embedding dim [8] in the checkpoint, [16] in the model"),
    (dict(num_dense=NUM_DENSE + 1), "dense_proj.0.weight: shape [8, 4] in the checkpoint, [8, 5] in the model "
                                    "(the dense inputs differ)"),
])
def test_anything_but_growth_is_refused_by_name(tmp_path, change, expected):
    torch.manual_seed(1)
    _save_plain(_ranker(OLD), tmp_path / "old")
    kwargs = {"vocab": OLD, **change}
    model = _ranker(**kwargs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointMismatch, match="does not fit the model") as e:
        load_model(model, str(tmp_path / "old"))
    assert expected in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # refused before reading


def test_grown_tables_names_only_the_grown_keys(tmp_path):
    torch.manual_seed(1)
    _save_plain(_ranker(OLD), tmp_path / "old")
    saved = dcp.FileSystemReader(str(tmp_path / "old")).read_metadata().state_dict_metadata
    grown = grown_tables(_ranker(GROWN).state_dict(), saved)
    assert grown == {"model.ebc.embedding_bags.t_video_id.weight": (torch.Size([60, 8]), torch.Size([75, 8])),
                     "model.ebc.embedding_bags.t_tag.weight": (torch.Size([30, 8]), torch.Size([33, 8]))}
    assert grown_tables(_ranker(OLD).state_dict(), saved) == {}


# ---------------------------------------------------------------------------------------------
# Two gloo ranks, sharded as training shards them (recsys_hdet.distributed.shard_model)

# name -> (sharding group size, sharding types, embedding dim, the layout whose checkpoint it loads).
# Column-wise at dim 256: the planner splits each table into two 128-column shards, one per rank
# (checked below). Two sharding groups of one rank (each holds full tables, as in training's 2-D
# layout) load the table-wise layout's checkpoint: another layout than the one that saved it.
LAYOUTS = {"table_wise": (2, ["table_wise"], 8, "table_wise"), "column_wise": (2, ["column_wise"], 256, "column_wise"),
           "two_groups": (1, ["table_wise"], 8, "table_wise"),
           "data_parallel": (2, ["data_parallel"], 8, "data_parallel")}


def _local_chunks(state):
    """{key: [(global offsets, a copy of this rank's chunk)]}: what this rank holds of each tensor."""
    from torch.distributed.tensor import DTensor

    out = {}
    for key, value in state.items():
        if isinstance(value, DTensor):
            local = value.to_local()
            if hasattr(local, "local_shards"):  # TorchRec's LocalShardsWrapper: shards at global offsets
                shards = [(tuple(o), t.detach().clone()) for o, t in zip(local.local_offsets(), local.local_shards())]
            else:
                (chunk,) = value.__create_chunk_list__()
                shards = [(tuple(chunk.offsets), local.detach().clone())]
            if value.device_mesh.get_coordinate() is not None and any(t.numel() for _, t in shards):
                out[key] = shards  # else: a table held by the other rank
        elif hasattr(value, "local_shards"):  # ShardedTensor
            out[key] = [(tuple(s.metadata.shard_offsets), s.tensor.detach().clone()) for s in value.local_shards()]
        else:
            out[key] = [((0,) * value.dim(), value.detach().clone())]
    return out


def _sharded(pgs, vocab, types, dim, seed):
    from recsys_hdet.components.optimizer import fused_params
    from recsys_hdet.optim_schema import DenseOptimizerConfig, EmbeddingOptimizerConfig
    from recsys_hdet.distributed import shard_model

    torch.manual_seed(seed)
    return shard_model(_ranker(vocab, dim=dim, device="meta"), pgs, fused_params(EmbeddingOptimizerConfig(type="rowwise_adagrad"), 0.1),
                       types)


def _grow_worker(out_dir, layouts):
    import torch.distributed as dist

    from recsys_hdet.components.model_checkpoint import save_model
    from recsys_hdet.distributed import init_process_groups
    from dist_helpers import random_batch

    rank = int(os.environ["RANK"])
    for name in layouts:
        sgs, types, dim, source = LAYOUTS[name]
        pgs = init_process_groups(sgs)
        base = os.path.join(out_dir, name)
        checkpoint = os.path.join(out_dir, source, "old")
        if source == name:
            save_model(_sharded(pgs, OLD, types, dim, seed=1), checkpoint, {"steps": 3})
        model = _sharded(pgs, GROWN, types, dim, seed=2)
        if rank == 0:
            with open(os.path.join(base, "plan.txt"), "w") as f:
                f.write(str(model.plan))
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(base, "fresh"))
        fresh = _local_chunks(model.state_dict())
        lines = []
        info = load_model(model, checkpoint, say=lines.append)
        assert info["steps"] == 3 and len(lines) == 1, (info, lines)
        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(base, "loaded"))
        # Every rank's own shards too (the DCP copies above hold one replica of replicated state).
        torch.save({"fresh": fresh, "loaded": _local_chunks(model.state_dict())}, os.path.join(base, f"rank{rank}.pt"))
        dense, kjt, _ = random_batch(5)  # ids below the old vocabularies: the model runs after the load
        assert torch.isfinite(model(dense, kjt)).all()
        # A table that shrinks is refused by name, on every rank, before anything is read.
        small = _sharded(pgs, {**OLD, "video_id": 50}, types, dim, seed=3)
        try:
            load_model(small, checkpoint)
        except CheckpointMismatch as e:
            if rank == 0:
                with open(os.path.join(base, "shrink.txt"), "w") as f:
                    f.write(str(e))
        else:
            raise AssertionError("a shrinking table was loaded")
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("grow")
    for name in LAYOUTS:
        os.makedirs(out / name)
    spawn(_grow_worker, 2, str(out), list(LAYOUTS))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sharded_tables_grow_bit_for_bit(sharded_runs, layout):
    base = sharded_runs / layout
    old = _torch_save(sharded_runs / LAYOUTS[layout][3] / "old")
    fresh, loaded = _torch_save(base / "fresh"), _torch_save(base / "loaded")
    _assert_grown(old, fresh, loaded, {"ebc.embedding_bags.t_video_id.weight", "ebc.embedding_bags.t_tag.weight"})
    for rank in range(2):  # each rank's shards: the checkpoint's rows where it has them, else its fresh rows
        local = torch.load(base / f"rank{rank}.pt", weights_only=False)
        assert set(local["loaded"]) == set(local["fresh"]) and local["loaded"], rank
        for key, chunks in local["loaded"].items():
            for (offsets, got), (fresh_offsets, fresh) in zip(chunks, local["fresh"][key]):
                assert offsets == fresh_offsets and got.shape == fresh.shape
                if got.dim() != 2:
                    assert torch.equal(got, old[key]), key
                    continue
                (r0, c0), (n, m) = offsets, got.shape
                rows = min(old[key].shape[0] - r0, n)
                assert torch.equal(got[:rows], old[key][r0:r0 + rows, c0:c0 + m]), (rank, key)
                assert torch.equal(got[rows:], fresh[rows:]), (rank, key)
    plan = (base / "plan.txt").read_text()
    if layout == "table_wise":  # the tables are spread over both ranks
        assert "rank:0/cpu" in plan and "rank:1/cpu" in plan and "column_wise" not in plan
    if layout == "column_wise":  # every table split into two column shards, one per rank
        assert plan.count("[0, 128]") == len(GROWN) and "[75, 128]" in plan
    message = (base / "shrink.txt").read_text()
    assert "feature 'video_id': the table shrinks from 60 rows in the checkpoint to 50 in the model" in message


# ---------------------------------------------------------------------------------------------
# Real runs on the tiny data set: train, grow the vocabularies, warm start and evaluate

FAST = ["data=tiny", "trainer.log_every=10", "data.train_days=1", "trainer.nproc=2", "trainer.sharding_group_size=2"]
TASKS = ("contribution", "like", "long_dwell")
GROWTH = {"video_id": 100, "tag": 5}


def _grown_copy(root, dest, growth):
    """A copy of a processed data set whose vocabularies gained rows (no new ids in its days, as
    when ids are appended to the vocabulary but have not occurred in the days trained on)."""
    shutil.copytree(root, dest)
    with open(os.path.join(dest, "meta.json")) as f:
        meta = json.load(f)
    for name, rows in growth.items():
        meta["sparse"][name]["vocab"] += rows
    with open(os.path.join(dest, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return str(dest)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, data_cache, tiny_dataset):
    run_dir = tmp_path_factory.mktemp("base") / "r"
    proc = run_train(run_dir, *FAST, "experiment_name=grow_base", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    grown = _grown_copy(tiny_dataset, tmp_path_factory.mktemp("grown") / "tiny_grown", GROWTH)
    return run_dir, grown


@pytest.mark.slow  # two real runs; the default suite keeps the 2-rank layout tests, and the slow retraining test warm-starts on grown tables
def test_a_warm_start_on_grown_vocabularies_trains_and_a_shrink_is_refused(base_run, tiny_dataset, tmp_path,
                                                                          data_cache):
    run_dir, grown = base_run
    recorded = read_json(run_dir / "checkpoint" / "meta.json")["model_inputs"]["sparse"]
    proc = run_train(tmp_path / "warm", *FAST, f"data.root={grown}", "data.generator=null",
                     f"trainer.warm_start={run_dir / 'checkpoint'}",
                     "optim.lr.embedding=1e-9", "optim.lr.transformer=1e-9", "optim.lr.non_embedding=1e-9",
                     "optim.lr.no_decay=1e-9", data_cache=data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    grow_lines = [line for line in proc.stdout.splitlines() if "embedding tables grow" in line]
    # One line from the launcher (train.py: the data set's vocabularies grew), one from the load.
    assert len(grow_lines) == 2, proc.stdout[-3000:]
    for name, rows in GROWTH.items():
        assert f"{name} {recorded[name]} -> {recorded[name] + rows} (+{rows} rows)" in grow_lines[0]
        assert f"{name} {recorded[name]} -> {recorded[name] + rows} rows" in grow_lines[1]
    assert "warm start from" in proc.stdout
    # The grown model's checkpoint: the base checkpoint's rows, nearly untouched at lr 1e-9.
    warm = read_json(tmp_path / "warm" / "checkpoint" / "meta.json")["model_inputs"]["sparse"]
    assert warm == {k: v + GROWTH.get(k, 0) for k, v in recorded.items()}
    cold_eval = read_json(run_dir / "summary.json")["eval"]
    warm_eval = read_json(tmp_path / "warm" / "summary.json")["eval"]
    for task in TASKS:
        assert warm_eval[task]["logloss"] == pytest.approx(cold_eval[task]["logloss"], abs=2e-3)

    # Back on the original data set, the grown checkpoint's tables would shrink: refused by name.
    proc = run_train(tmp_path / "shrink", *FAST, f"trainer.warm_start={tmp_path / 'warm' / 'checkpoint'}",
                     data_cache=data_cache)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, rows in GROWTH.items():
        assert f"{name} shrinks {recorded[name] + rows} -> {recorded[name]} rows" in proc.stderr
    assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "shrink" / "checkpoint")


@pytest.mark.slow  # a real run and two scorings; `make test-all` runs it
def test_evaluation_scores_a_checkpoint_on_grown_vocabularies_as_on_its_own(base_run, tiny_dataset, tmp_path):
    # recsys_hdet.evaluation builds the model from the data set it scores (here: the grown copy)
    # and loads the smaller checkpoint into it; the held-out day's ids all have old rows, so every
    # score is the one the checkpoint gives on its own data set.
    from recsys_hdet.evaluation import load_run, score_run

    run_dir, grown = base_run
    own = score_run(load_run(str(run_dir), data_root=tiny_dataset), nproc=2, scratch=str(tmp_path))
    on_grown = score_run(load_run(str(run_dir), data_root=grown), nproc=2, scratch=str(tmp_path))
    assert own.shape == on_grown.shape and own.shape[0] > 0
    np.testing.assert_array_equal(own, on_grown)
