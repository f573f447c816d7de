"""Multi-task feed ranker.

Sparse features go through one TorchRec ``EmbeddingBagCollection`` (one table per feature, sharded
by the planner once the model is wrapped in ``DistributedModelParallel``); dense features through a
small MLP that projects them to one more token. A pre-norm self-attention block mixes the feature
tokens (this is the "transformer" parameter group of the paper's backbone), a shared trunk reads the
flattened tokens, and one tower per task emits a logit.

Parameter groups (see :func:`parameter_group_of`):
- ``embedding``: the EBC tables (trained by TorchRec's fused optimizer)
- ``transformer``: weight matrices of the interaction block
- ``no_decay``: every bias and normalization parameter
- ``non_embedding``: every other dense weight (dense MLP, trunk, towers)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, PoolingType

from recsys_hdet.constants import PARAM_GROUPS


@dataclass(frozen=True)
class SparseFeature:
    name: str
    vocab: int
    multi: bool = False


class InteractionBlock(nn.TransformerEncoderLayer):
    """Pre-norm self-attention over the feature tokens, with an attention temperature.

    The parameters are PyTorch's ``TransformerEncoderLayer``'s (so checkpoints and parameter
    groups keep their names); the attention is computed here so that its logits can be divided
    by ``attention_temperature`` (1.0: standard scaled dot-product attention), a scalar HDET can
    explore. Always pre-norm.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                         batch_first=True, norm_first=True)
        self.attention_temperature = 1.0

    def forward(self, src: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # type: ignore[override]
        x = src + self._attention(self.norm1(src))
        return x + self._ff_block(self.norm2(x))

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn
        batch, tokens, dim = x.shape
        heads = attn.num_heads
        q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
        split = lambda t: t.view(batch, tokens, heads, dim // heads).transpose(1, 2)
        scale = 1.0 / (math.sqrt(dim // heads) * self.attention_temperature)
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=scale,
                                             dropout_p=attn.dropout if self.training else 0.0)
        out = attn.out_proj(out.transpose(1, 2).reshape(batch, tokens, dim))
        return self.dropout1(out)


def _mlp(sizes: Sequence[int], dropout: float) -> nn.Sequential:
    layers: List[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class MultiTaskRanker(nn.Module):
    def __init__(
        self,
        sparse_features: Sequence[SparseFeature],
        num_dense: int,
        tasks: Sequence[str],
        embedding_dim: int = 16,
        attention_heads: int = 2,
        trunk: Sequence[int] = (256, 128),
        tower: Sequence[int] = (64,),
        dropout: float = 0.0,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.feature_names = [f.name for f in sparse_features]
        self.tasks = list(tasks)
        tables = [
            EmbeddingBagConfig(
                name=f"t_{f.name}",
                embedding_dim=embedding_dim,
                num_embeddings=f.vocab,
                feature_names=[f.name],
                pooling=PoolingType.MEAN if f.multi else PoolingType.SUM,
            )
            for f in sparse_features
        ]
        # "meta" device: DistributedModelParallel materializes only the local shards.
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device(device))
        self.dense_proj = nn.Sequential(nn.Linear(num_dense, embedding_dim), nn.ReLU())
        self.interaction = InteractionBlock(embedding_dim, attention_heads, 2 * embedding_dim, dropout)
        num_tokens = len(sparse_features) + 1
        self.trunk = _mlp([num_tokens * embedding_dim, *trunk], dropout)
        self.towers = nn.ModuleDict(
            {t: nn.Sequential(_mlp([trunk[-1], *tower], dropout), nn.Linear(tower[-1], 1)) for t in tasks}
        )

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Returns logits of shape [batch, num_tasks], tasks in ``self.tasks`` order."""
        return self.head(self.ebc(sparse), dense)

    def head(self, pooled: KeyedTensor, dense: torch.Tensor) -> torch.Tensor:
        """Everything after the embedding lookup: the logits from the pooled embeddings."""
        tokens = [pooled[name] for name in self.feature_names] + [self.dense_proj(dense)]
        x = torch.stack(tokens, dim=1)  # [B, F+1, D]
        x = self.interaction(x)
        h = self.trunk(x.flatten(1))
        return torch.cat([self.towers[t](h) for t in self.tasks], dim=1)


class TrainingRanker(MultiTaskRanker):
    """The ranker as TorchRec's train pipelines call it: ``forward(batch)`` returns ``(loss, output)``
    (TorchRec's ``DLRMTrain`` convention), the batch being anything with ``dense``, ``sparse`` and
    ``labels`` (:class:`recsys_hdet.components.dataloader.Batch`). The embedding lookup reads only
    ``batch.sparse``, so TrainPipelineSparseDist can start its input distribution a batch ahead.

    A subclass rather than a wrapper module so that parameter names, checkpoints and parameter
    groups are the plain ranker's; :meth:`MultiTaskRanker.forward` stays reachable as ``logits``.

    ``output`` is ``(per-task loss, served per-task loss or None, predicted probabilities, labels)``,
    all detached (the probabilities and labels feed torchrec.metrics while training): the served loss
    (eval mode: no dropout; no label smoothing) of the same batch is computed only when
    ``serving_loss_wanted`` is set (HDET's serving signal). It reuses the one embedding lookup (a
    pipelined module may run once per step) and is taken before the optimizer step, so it is the
    loss the model as it was before this step serves on rows it has not trained on.
    """

    def __init__(self, *args, task_weights: Sequence[float], loss_settings, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task_weights = torch.tensor([float(w) for w in task_weights])  # not a buffer: no state
        self.loss_settings = loss_settings  # read every step: HDET may explore the label smoothing
        self.serving_loss_wanted = False

    def logits(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return MultiTaskRanker.forward(self, dense, sparse)

    def forward(self, batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor]]:  # type: ignore[override]
        pooled = self.ebc(batch.sparse)
        logits = self.head(pooled, batch.dense)
        served = None
        if self.serving_loss_wanted:
            with torch.no_grad(), _eval_mode(self):
                served = F.binary_cross_entropy_with_logits(self.head(pooled, batch.dense), batch.labels,
                                                            reduction="none").mean(0)
        ls = self.loss_settings.label_smoothing
        targets = batch.labels * (1 - ls) + 0.5 * ls if ls > 0 else batch.labels
        per_task = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(0)
        loss = (per_task * self.task_weights.to(per_task.device)).sum()
        return loss, (per_task.detach(), served, torch.sigmoid(logits.detach()), batch.labels)


@contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    was_training = module.training
    module.train(False)
    try:
        yield
    finally:
        module.train(was_training)


def parameter_group_of(name: str) -> str:
    """Which of :data:`PARAM_GROUPS` a (possibly DMP/DDP-prefixed) parameter name belongs to."""
    if ".ebc." in f".{name}" or "embedding_bags" in name:
        return "embedding"
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("bias") or ".norm" in name or leaf.startswith("norm"):
        return "no_decay"
    if ".interaction." in f".{name}":
        return "transformer"
    return "non_embedding"


def dense_parameter_groups(named_params: Mapping[str, nn.Parameter] | Dict) -> Dict[str, List[nn.Parameter]]:
    """Splits the dense (non-embedding) parameters into the three dense groups, in a fixed order."""
    groups: Dict[str, List[nn.Parameter]] = {g: [] for g in PARAM_GROUPS if g != "embedding"}
    for name, p in named_params.items():
        group = parameter_group_of(name)
        if group == "embedding":
            continue
        groups[group].append(p)
    return groups


def build_model(cfg, meta, device: str = "meta", training: Optional[Mapping[str, Any]] = None) -> "MultiTaskRanker":
    """The ranker the config's ``model`` and ``tasks`` describe, with one table per sparse feature of
    the data set (``meta``: a DatasetMeta). On the "meta" device: DistributedModelParallel
    materializes only the shards each rank holds. ``training``: ``{"task_weights", "loss_settings"}``
    for the :class:`TrainingRanker` a train pipeline drives (else the plain ranker, for scoring)."""
    m = cfg.model
    cls = TrainingRanker if training is not None else MultiTaskRanker
    model = cls(
        sparse_features=[SparseFeature(n, int(s["vocab"]), bool(s.get("multi", False))) for n, s in meta.sparse.items()],
        num_dense=len(meta.dense),
        tasks=list(cfg.tasks),
        embedding_dim=int(m.embedding_dim),
        attention_heads=int(m.attention_heads),
        trunk=list(m.trunk),
        tower=list(m.tower),
        dropout=float(m.dropout),
        device=device,
        **(training or {}),
    )
    if m.compile_dense:
        # torch.compile of the dense modules in place (nn.Module.compile: parameter names, checkpoints
        # and groups unchanged); the embedding collection stays eager (TorchRec shards it). The
        # attention temperature is a Python float the compiled block guards on: an HDET run exploring
        # it recompiles at every new value.
        for module in (model.dense_proj, model.interaction, model.trunk, *model.towers.values()):
            module.compile(dynamic=False)
    return model
