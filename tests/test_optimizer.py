"""The learning rate the fused embedding kernel applies is the one scheduled for that step.

TorchRec's fused optimizer updates inside backward with the rate last pushed into the kernel, so
a write into its param_groups alone lands one step late. Measured from the update itself: with
fused SGD and loss = sum(pooled * c), a row looked up once moves by exactly -lr * c.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from dist_helpers import spawn


class _EmbeddingOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="t_items", embedding_dim=4, num_embeddings=10, feature_names=["items"])],
            device=torch.device("meta"),
        )
        self.head = nn.Linear(4, 1)  # a dense parameter, so DDP has something to wrap

    def forward(self, kjt):
        return self.ebc(kjt)["items"]


def _worker():
    from recsys_hdet.components.lr_scheduler import GroupLRScheduler, OneCycle
    from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params
    from recsys_hdet.optim_schema import DenseOptimizerConfig, EmbeddingOptimizerConfig
    from recsys_hdet.components.replicas import tbe_kernels
    from recsys_hdet.distributed import init_process_groups, shard_model

    pgs = init_process_groups(sharding_group_size=2)
    model = shard_model(_EmbeddingOnly(), pgs, fused_params(EmbeddingOptimizerConfig(type="sgd"), 0.123), ["table_wise"])
    groups = ["embedding", "transformer", "non_embedding", "no_decay"]
    opt = GroupedOptimizer(model, DenseOptimizerConfig(type="adam"), {g: 0.5 for g in groups})
    schedule = OneCycle(max_lr=0.4, total_steps=12, pct_start=0.5)
    scheduler = GroupLRScheduler(opt.groups, {g: schedule for g in groups}, cycle_momentum=False)
    opt.apply_hparams()
    c = torch.tensor([1.0, -2.0, 0.5, 3.0])
    kernels = tbe_kernels(model)
    for step in range(10):
        row = step % 10
        kjt = KeyedJaggedTensor(keys=["items"], values=torch.tensor([row]), lengths=torch.tensor([1], dtype=torch.int32))
        # Every rank looks up the same single row (batch of one per rank).
        weights = [w for k in kernels for w in k.split_embedding_weights() if w.numel()]
        before = [w.clone() for w in weights]
        (model(kjt) * c).sum().backward()
        opt.step()
        opt.zero_grad()
        scheduler.step()
        opt.apply_hparams()
        # The table lives on one rank (table_wise); the ranks' gradients meet there and TorchRec
        # divides them by the world size (as DDP averages dense gradients): the mean of equal grads.
        moved = [(w - b) for w, b in zip(weights, before)]
        delta = moved[0][row] if moved else torch.zeros(4)
        dist.all_reduce(delta)
        expected = -schedule(step)[0] * c
        torch.testing.assert_close(delta, expected, rtol=1e-5, atol=1e-7)
    dist.destroy_process_group()


def test_fused_embedding_update_uses_the_lr_scheduled_for_that_step():
    spawn(_worker, 2)


def _hdet_worker():
    """Two embedding replicas (one sharding group per rank) at different HDET learning rates."""
    from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params
    from recsys_hdet.optim_schema import DenseOptimizerConfig, EmbeddingOptimizerConfig
    from recsys_hdet.components.replicas import tbe_kernels
    from recsys_hdet.distributed import init_process_groups, shard_model
    from recsys_hdet.hdet.controller.config import HDETConfig
    from recsys_hdet.hdet.controller.scheduler import HDETOneCycleLR
    from recsys_hdet.hdet.hparams import ReplicaAxis

    pgs = init_process_groups(sharding_group_size=1)
    model = shard_model(_EmbeddingOnly(), pgs, fused_params(EmbeddingOptimizerConfig(type="sgd"), 0.123), ["table_wise"])
    groups = ["embedding", "transformer", "non_embedding", "no_decay"]
    opt = GroupedOptimizer(model, DenseOptimizerConfig(type="adam"), {g: 0.5 for g in groups})
    sched = HDETOneCycleLR(opt, max_lr=0.4, total_steps=12, pct_start=0.5, cycle_momentum=False,
                           hdet=HDETConfig(alpha=0.5, sync_every=3, controller_start=0),
                           replica_axes={"embedding": ReplicaAxis.per_block(2, 1)}, on_change=opt.apply_hparams)
    c = torch.tensor([1.0, -2.0, 0.5, 3.0])
    weights = [w for k in tbe_kernels(model) for w in k.split_embedding_weights() if w.numel()]
    seen = set()
    for step in range(10):
        row = step
        lr_now = opt.groups["embedding"][0]["lr"]
        seen.add(round(lr_now, 12))
        kjt = KeyedJaggedTensor(keys=["items"], values=torch.tensor([row]), lengths=torch.tensor([1], dtype=torch.int32))
        before = weights[0].clone()
        (model(kjt) * c).sum().backward()
        opt.step()
        opt.zero_grad()
        delta = weights[0][row] - before[row]
        # One replica per rank: this rank's update uses this rank's value, at this very step.
        torch.testing.assert_close(delta, -lr_now * c, rtol=1e-5, atol=1e-7)
        sched.step(loss=1.0 + dist.get_rank())
    values = torch.tensor(sorted(seen))
    everyone = [torch.zeros_like(values) for _ in range(2)]
    dist.all_gather(everyone, values)
    assert not torch.equal(everyone[0], everyone[1]), "the two replicas trained at different rates"
    dist.destroy_process_group()


@pytest.mark.slow  # HDET's retired controller, the default run's budget: `make test-all` runs it
def test_fused_embedding_update_uses_each_replicas_hdet_lr_at_that_step():
    spawn(_hdet_worker, 2)


def _anchor_worker():
    """The dense anchors behind GroupedOptimizer: Prodigy starts from optim.dense.d0; Schedule-Free
    is switched to its evaluation point inside eval_weights() and back to its training point after;
    Adam's eval_weights() changes nothing."""
    from recsys_hdet.components.optimizer import GroupedOptimizer, fused_params
    from recsys_hdet.optim_schema import DenseOptimizerConfig, EmbeddingOptimizerConfig
    from recsys_hdet.distributed import init_process_groups, shard_model

    pgs = init_process_groups(sharding_group_size=2)
    groups = ["embedding", "transformer", "non_embedding", "no_decay"]
    kjt = KeyedJaggedTensor(keys=["items"], values=torch.tensor([3]), lengths=torch.tensor([1], dtype=torch.int32))
    for kind in ("adam", "prodigy", "schedulefree_adamw"):
        torch.manual_seed(0)
        model = shard_model(_EmbeddingOnly(), pgs, fused_params(EmbeddingOptimizerConfig(type="sgd"), 0.1), ["table_wise"])
        opt = GroupedOptimizer(model, DenseOptimizerConfig(type=kind, d0=1e-6), {g: 1.0 if kind == "prodigy" else 0.01 for g in groups})
        head = model.module.head.weight if hasattr(model.module, "head") else model.module.module.head.weight
        for _ in range(5):
            (model.module.head(model(kjt)) if hasattr(model.module, "head") else model(kjt)).sum().backward()
            opt.step()
            opt.zero_grad()
        trained = head.detach().clone()
        with opt.eval_weights():
            inside = head.detach().clone()
        after = head.detach().clone()
        if kind == "schedulefree_adamw":
            assert not torch.equal(inside, trained)  # the averaged point is evaluated
            assert all(not g["train_mode"] for g in opt.dense.param_groups) is False  # back in train mode
            torch.testing.assert_close(after, trained, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(inside, trained) and torch.equal(after, trained)
        if kind == "prodigy":
            assert all(g["d0"] == 1e-6 for g in opt.dense.param_groups)
            assert all(g["d"] > 1e-5 for g in opt.dense.param_groups), [g["d"] for g in opt.dense.param_groups]  # grew from d0
    dist.destroy_process_group()


def test_dense_anchor_optimizers_prodigy_and_schedule_free_evaluate_where_they_should():
    spawn(_anchor_worker, 2)
