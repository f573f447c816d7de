"""Beyond learning rate: several scalar hyperparameters explored at once (real gloo jobs)."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from dist_helpers import spawn
from recsys_hdet.hdet.controller.config import HDETConfig
from recsys_hdet.hdet.controller.engine import HDETEngine
from recsys_hdet.hdet.hparams import ReplicaAxis, ScalarHParam


def _engine(hparams, world, **cfg):
    return HDETEngine(hparams, HDETConfig(**cfg), dist.get_rank(), total_steps=cfg.pop("total", 600),
                      converge=lambda excluded: None)


def _planted_worker(out_path):
    """The loss depends on 'dropout' only (optimum 0.2); 'lr_a' and 'wd' do not matter at all."""
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    axis = ReplicaAxis.per_rank(world)
    current = {}
    hp = [
        ScalarHParam("lr_a", axis, lambda s: 0.01, floor=1e-5, ceiling=0.1, apply=lambda v: current.__setitem__("lr_a", v)),
        ScalarHParam("wd", axis, lambda s: 0.1, floor=0.0, ceiling=1.0, apply=lambda v: current.__setitem__("wd", v)),
        ScalarHParam("dropout", axis, lambda s: 0.5, floor=0.0, ceiling=0.7, space="additive", spread=0.1,
                     apply=lambda v: current.__setitem__("dropout", v)),
    ]
    engine = HDETEngine(hp, HDETConfig(alpha=0.2, sync_every=10, controller_start=20, sigma=0.02, beta=0.5, lam=1.0),
                        dist.get_rank(), total_steps=600, converge=lambda excluded: None)
    g = torch.Generator().manual_seed(dist.get_rank())
    records = []
    for step in range(600):
        noise = 0.002 * float(torch.randn(1, generator=g))
        r = engine.step((current["dropout"] - 0.2) ** 2 + noise)
        if r:
            records.append({k: v["next_base"] for k, v in r["hparams"].items()})
    if dist.get_rank() == 0:
        torch.save(records, out_path)
    dist.destroy_process_group()


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores); `make test-all` runs it
def test_controller_steers_the_hparam_that_matters_and_leaves_the_others(tmp_path):
    path = str(tmp_path / "planted.pt")
    spawn(_planted_worker, 4, path)
    records = torch.load(path)
    final = records[-1]
    assert final["dropout"] < 0.3, [r["dropout"] for r in records]
    assert abs(final["dropout"] - 0.2) < 0.08
    # Independent permutations: the irrelevant hparams' bases stay near their (constant) schedules.
    assert final["lr_a"] == pytest.approx(0.01, rel=0.25)
    assert final["wd"] == pytest.approx(0.1, rel=0.25)


def _adversarial_worker(name, direction):
    dist.init_process_group("gloo")
    axis = ReplicaAxis.per_rank(dist.get_world_size())
    current = {}
    specs = {
        "dropout": dict(schedule=lambda s: 0.3, floor=0.0, ceiling=0.6, space="additive", spread=0.2),
        "temp": dict(schedule=lambda s: 1.0, floor=0.5, ceiling=2.0),
    }
    hp = [ScalarHParam(name, axis, apply=lambda v: current.__setitem__("v", v), **specs[name])]
    engine = HDETEngine(hp, HDETConfig(alpha=0.5, sync_every=5, controller_start=0, sigma=0.001, beta=0.0, lam=5.0),
                        dist.get_rank(), total_steps=400, converge=lambda excluded: None)
    lo, hi = specs[name]["floor"], specs[name]["ceiling"]
    for step in range(400):
        # Winner-take-all losses, at a huge scale, always favouring the extreme value.
        r = engine.step(-direction * 1e3 * current["v"])
        if name == "dropout":
            assert lo <= current["v"] <= hi, current  # additive values are clamped too
        if r:
            assert lo <= r["hparams"][name]["next_base"] <= hi
    assert engine.state[name].base == (hi if direction > 0 else lo)
    dist.destroy_process_group()


@pytest.mark.slow  # more multi-process runs than the default suite has time for; `make test-all` runs it
@pytest.mark.parametrize("name", ["dropout", "temp"])
@pytest.mark.parametrize("direction", [1, -1])
def test_bounds_hold_under_adversarial_losses(name, direction):
    spawn(_adversarial_worker, 4, name, direction)


def _applied_worker():
    """Values reach the modules, the optimizer and the loss on the step they change."""
    from recsys_hdet.components.hparam_bindings import LossSettings
    from recsys_hdet.hdet.controller.explored import build_explored_hparams
    from recsys_hdet.hdet.controller.scheduler import HDETOneCycleLR
    from recsys_hdet.models.ranker import MultiTaskRanker, SparseFeature, dense_parameter_groups

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = MultiTaskRanker([SparseFeature("a", 10)], 2, ["x"], embedding_dim=4, dropout=0.3)
    named = dict(model.named_parameters())
    groups = dense_parameter_groups(named)
    opt = torch.optim.AdamW([{"params": p, "name": n, "weight_decay": 0.05} for n, p in groups.items()], lr=0.01)
    by_name = {}
    for pg in opt.param_groups:
        by_name.setdefault(pg["name"], []).append(pg)
    loss = LossSettings(0.05)
    explore = {"dropout": {"spread": 0.1, "max": 0.7}, "weight_decay": {"spread": 0.5, "max_multiple": 2.0},
               "temperature": {"spread": 0.3, "min": 0.25, "max": 4.0}, "label_smoothing": {"spread": 0.04, "max": 0.2}}
    extra = build_explored_hparams(explore, {"dropout": 0.3, "weight_decay": 0.05, "temperature": 1.0,
                                             "label_smoothing": 0.05}, model, by_name, loss,
                                   ReplicaAxis.per_rank(dist.get_world_size()))
    sched = HDETOneCycleLR(opt, max_lr=0.01, total_steps=60, hdet=HDETConfig(alpha=0.2, sync_every=4, controller_start=8),
                           extra_hparams=extra)
    engine = sched.engine
    seen = set()
    for step in range(60):
        mine = {h.name: engine.my_value(h) for h in extra}
        seen.add(round(mine["dropout"], 9))
        dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
        assert dropouts and all(p == mine["dropout"] for p in dropouts)
        assert model.interaction.self_attn.dropout == mine["dropout"]
        assert model.interaction.attention_temperature == mine["temperature"]
        assert all(pg["weight_decay"] == mine["weight_decay"] for g in ("transformer", "non_embedding") for pg in by_name[g])
        assert all(pg["weight_decay"] == 0.05 for pg in by_name["no_decay"]), "no_decay is never decayed by exploration"
        assert loss.label_smoothing == mine["label_smoothing"]
        sched.step(1.0 + 0.1 * dist.get_rank())
    assert len(seen) > 2, "dropout changed over the run"
    dist.destroy_process_group()


@pytest.mark.slow  # HDET's retired controller, the default run's budget: `make test-all` runs it
def test_explored_values_are_applied_where_they_take_effect():
    spawn(_applied_worker, 2)


def test_attention_temperature_changes_the_output_and_one_is_standard_attention():
    from recsys_hdet.models.ranker import InteractionBlock

    torch.manual_seed(0)
    block = InteractionBlock(8, 2, 16, dropout=0.0).eval()
    reference = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True).eval()
    reference.load_state_dict(block.state_dict())
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(block(x), reference(x), rtol=1e-5, atol=1e-6)
        block.attention_temperature = 3.0
        assert not torch.allclose(block(x), reference(x), atol=1e-4)
