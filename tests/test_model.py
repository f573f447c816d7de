import pytest
import torch
from torchrec import KeyedJaggedTensor

from recsys_hdet.distributed import ParallelLayout
from recsys_hdet.models.ranker import MultiTaskRanker, SparseFeature, dense_parameter_groups, parameter_group_of

FEATURES = [SparseFeature("user_id", 50), SparseFeature("video_id", 80), SparseFeature("tag", 20, multi=True)]


def _model():
    torch.manual_seed(0)
    return MultiTaskRanker(FEATURES, num_dense=3, tasks=["contribution", "like", "long_dwell"], embedding_dim=8)


def test_forward_shape_and_every_parameter_in_exactly_one_group():
    model = _model()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["user_id", "video_id", "tag"],
        values=torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        lengths=torch.tensor([1, 1, 1, 1, 2, 1], dtype=torch.int32),
    )
    out = model(torch.randn(2, 3), kjt)
    assert out.shape == (2, 3)
    names = dict(model.named_parameters())
    groups = {n: parameter_group_of(n) for n in names}
    assert {g for g in groups.values()} == {"embedding", "transformer", "non_embedding", "no_decay"}
    assert all(groups[n] == "embedding" for n in names if n.startswith("ebc."))
    assert all(groups[n] == "no_decay" for n in names if n.endswith("bias") or ".norm" in n)
    assert groups["interaction.self_attn.in_proj_weight"] == "transformer"
    assert groups["interaction.linear1.weight"] == "transformer"
    assert groups["trunk.0.weight"] == "non_embedding"
    dense = dense_parameter_groups(names)
    n_dense = sum(len(v) for v in dense.values())
    assert n_dense == sum(1 for g in groups.values() if g != "embedding")


def test_group_names_survive_dmp_and_ddp_prefixes():
    assert parameter_group_of("_dmp_wrapped_module.module.ebc.embedding_bags.t_user_id.weight") == "embedding"
    assert parameter_group_of("_dmp_wrapped_module.module.interaction.norm1.weight") == "no_decay"
    assert parameter_group_of("_dmp_wrapped_module.module.interaction.self_attn.out_proj.weight") == "transformer"
    assert parameter_group_of("_dmp_wrapped_module.module.towers.like.1.weight") == "non_embedding"


def test_layout_groups_partition_the_world():
    layout = ParallelLayout(rank=5, world_size=8, sharding_group_size=4)
    assert layout.replicas == 2 and layout.sharding_group == 1
    assert layout.sharding_group_ranks() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.replica_group_ranks() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    import pytest
    with pytest.raises(ValueError, match="sharding_group_size=3"):
        ParallelLayout(0, 8, 3)


@pytest.mark.slow  # torch.compile takes about a minute on 2 cores; `make test-all` runs it
def test_compiled_dense_modules_keep_names_and_match_eager_outputs_and_gradients():
    """model.compile_dense: the dense modules compiled in place (names, groups and checkpoints
    unchanged) compute what the eager model does, forward and backward, within float tolerance."""
    from omegaconf import OmegaConf

    from recsys_hdet.models.ranker import build_model

    meta = type("Meta", (), {"sparse": {f.name: {"vocab": f.vocab, "multi": f.multi} for f in FEATURES}, "dense": ["a", "b", "c"]})
    cfg = lambda compiled: OmegaConf.create({"tasks": ["contribution", "like", "long_dwell"], "model": {
        "embedding_dim": 8, "attention_heads": 2, "trunk": [32, 16], "tower": [8], "dropout": 0.0, "compile_dense": compiled}})
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["user_id", "video_id", "tag"], values=torch.tensor([1, 2, 3, 4, 5, 6, 7]),
                                              lengths=torch.tensor([1, 1, 1, 1, 2, 1], dtype=torch.int32))
    dense = torch.randn(2, 3)
    outs, grads = [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg(compiled), meta, device="cpu")
        out = model(dense, kjt)
        out.sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10  # the same names: nothing renamed
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6), n
