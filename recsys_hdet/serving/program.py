"""The serving form of a trained ranker: plain PyTorch, traced once by ``torch.export``.

:class:`ServingRanker` is the unsharded :class:`~recsys_hdet.models.ranker.MultiTaskRanker` with its
TorchRec ``EmbeddingBagCollection`` replaced by one weight tensor per feature (a single-valued
feature is a row lookup, a multi-valued one ``F.embedding_bag`` with the collection's pooling) and
the dense standardization of its training days built in, so the exported program reads a
processed row as DATA_CONTRACT.md stores it and needs neither TorchRec nor this project:

    probs = torch.export.load("model.pt2").module()(dense, ids, [tag_values], [tag_offsets])

- ``dense``: float32 [B, D], the contract's dense columns in ``manifest["dense"]`` order, NaN where null
  (standardized inside: ``(x - mean) / std`` in float64 as the loader does, NaN -> 0, the mean);
- ``ids``: int64 [B, S], the embedding rows of the single-valued features (``manifest["single_features"]``);
- per multi-valued feature (``manifest["multi_features"]``), its rows concatenated (int64 [N]) and the
  offsets of each row's list (int64 [B + 1], starting at 0; an empty list pools to zeros, as TorchRec's
  mean pooling does);
- returns float32 [B, T], one probability per task (``manifest["tasks"]``).

The dense modules are the ranker's own (same code, same parameters); the attention temperature is
the one the run ended with, fixed at export. Limit: the tables are held whole in memory at export
and in the program (one process serves one copy; sharded serving is TorchRec's inference stack).
"""

from __future__ import annotations

import copy
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental import _config as fx_config

from recsys_hdet.models.ranker import MultiTaskRanker


class ServingRanker(nn.Module):
    def __init__(self, ranker: MultiTaskRanker, single_features: Sequence[str], multi_features: Sequence[str],
                 dense_mean: Sequence[float], dense_std: Sequence[float]) -> None:
        super().__init__()
        tables = {name: ranker.ebc.embedding_bags[f"t_{name}"].weight.detach().clone()
                  for name in list(single_features) + list(multi_features)}
        pooling = {c.feature_names[0]: c.pooling.name for c in ranker.ebc.embedding_bag_configs()}
        self.single_features = list(single_features)
        self.multi_features = list(multi_features)
        self.multi_modes = ["mean" if pooling[n] == "MEAN" else "sum" for n in self.multi_features]
        self.single_tables = nn.ParameterList([nn.Parameter(tables[n], requires_grad=False) for n in self.single_features])
        self.multi_tables = nn.ParameterList([nn.Parameter(tables[n], requires_grad=False) for n in self.multi_features])
        self.register_buffer("dense_mean", torch.tensor(list(dense_mean), dtype=torch.float64))
        self.register_buffer("dense_std", torch.tensor(list(dense_std), dtype=torch.float64))
        dense_part = copy.deepcopy(ranker)
        dense_part.ebc = None  # the tables live above; the rest is the ranker's head, unchanged
        self.ranker = dense_part.eval()

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, multi_values: List[torch.Tensor],
                multi_offsets: List[torch.Tensor]) -> torch.Tensor:
        x = (dense.to(torch.float64) - self.dense_mean) / self.dense_std
        x = torch.where(torch.isnan(x), torch.zeros_like(x), x).to(torch.float32)
        pooled = {name: F.embedding(ids[:, i], table)
                  for i, (name, table) in enumerate(zip(self.single_features, self.single_tables))}
        for name, table, mode, values, offsets in zip(self.multi_features, self.multi_tables, self.multi_modes,
                                                      multi_values, multi_offsets):
            pooled[name] = F.embedding_bag(values, table, offsets, mode=mode, include_last_offset=True)
        return torch.sigmoid(MultiTaskRanker.head(self.ranker, pooled, x))


def export_program(module: ServingRanker, example_rows: int = 8) -> "torch.export.ExportedProgram":
    """``torch.export`` of ``module`` with the batch size and each multi-valued feature's value count
    dynamic (traced on ``example_rows`` rows of zeros, two values per list); any batch size from 1."""
    b = example_rows
    dense = torch.zeros(b, module.dense_mean.numel())
    ids = torch.zeros(b, len(module.single_features), dtype=torch.long)
    values = [torch.zeros(2 * b, dtype=torch.long) for _ in module.multi_features]
    offsets = [torch.arange(0, 2 * b + 1, 2, dtype=torch.long) for _ in module.multi_features]
    batch = torch.export.Dim("batch", min=1)
    dynamic = {"dense": {0: batch}, "ids": {0: batch},
               "multi_values": [{0: torch.export.Dim(f"{n}_values", min=0)} for n in module.multi_features],
               "multi_offsets": [{0: batch + 1} for _ in module.multi_features]}
    with torch.no_grad(), size_oblivious():
        return torch.export.export(module, (dense, ids, values, offsets), dynamic_shapes=dynamic, strict=False)


def size_oblivious():
    """Traces sizes as any size: without it ``F.embedding_bag``'s output (a contiguity check that a dimension
    of size 1 skips) adds the guard batch != 1, and the program refuses a one-row batch (predict's last batch
    of 65537 rows, a request of one impression). The general case it traces holds for size 1 too."""
    return fx_config.patch(backed_size_oblivious=True)
