"""The same multi-task ranker and one-pass training, written with plain PyTorch (no TorchRec).

What a user without TorchRec would write: one ``nn.EmbeddingBag(sparse=True)`` per feature,
replicated on every rank, the whole model in ``DistributedDataParallel`` (sparse embedding
gradients are all-reduced as sparse tensors over gloo), ``torch.optim.Adagrad`` for the tables
(sparse-aware) and Adam for the rest, each with its own ``OneCycleLR``. The interaction block is
``nn.TransformerEncoderLayer`` (pre-norm), the trunk and towers the same MLPs as
``recsys_hdet.models.ranker``; same data files, same day order, same shuffle within a day, same
per-rank slices of each global batch. It serves as a benchmark contender only.

    python -m benchmarks.torch_reference --data .cache/data/bench --nproc 4 --batch-size 512 \
        --train-days 4 --out result.json
"""

from __future__ import annotations

import argparse
import warnings
import json
import os
import resource
import sys
import time
from typing import Dict, List

import numpy as np
import polars as pl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from data_tools.contract import label_column, read_meta


class ReferenceRanker(nn.Module):
    def __init__(self, sparse: Dict[str, Dict], num_dense: int, num_tasks: int, dim: int = 16, heads: int = 2,
                 trunk=(256, 128), tower=(64,)) -> None:
        super().__init__()
        self.single = [n for n, s in sparse.items() if not s["multi"]]
        self.multi = [n for n, s in sparse.items() if s["multi"]]
        self.tables = nn.ModuleDict({
            n: nn.EmbeddingBag(s["vocab"], dim, mode="mean" if s["multi"] else "sum", sparse=True)
            for n, s in sparse.items()
        })
        self.dense_proj = nn.Sequential(nn.Linear(num_dense, dim), nn.ReLU())
        self.interaction = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True,
                                                      norm_first=True)
        sizes = [(len(sparse) + 1) * dim, *trunk]
        self.trunk = nn.Sequential(*[m for a, b in zip(sizes[:-1], sizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        tsizes = [trunk[-1], *tower]
        self.towers = nn.ModuleList(
            nn.Sequential(*[m for a, b in zip(tsizes[:-1], tsizes[1:]) for m in (nn.Linear(a, b), nn.ReLU())],
                          nn.Linear(tower[-1], 1)) for _ in range(num_tasks))

    def forward(self, dense, single_ids, multi):
        tokens = [self.tables[n](single_ids[:, j:j + 1]) for j, n in enumerate(self.single)]
        tokens += [self.tables[n](values, offsets) for n, (values, offsets) in zip(self.multi, multi)]
        x = torch.stack(tokens + [self.dense_proj(dense)], dim=1)
        h = self.trunk(self.interaction(x).flatten(1))
        return torch.cat([t(h) for t in self.towers], dim=1)


def _load_day(root: str, meta: Dict, day: str, seed: int):
    single = [n for n, s in meta["sparse"].items() if not s["multi"]]
    multi = [n for n, s in meta["sparse"].items() if s["multi"]]
    labels = [label_column(t) for t in meta["tasks"]]
    df = pl.read_parquet(os.path.join(root, meta["days"][day]["file"]), columns=single + multi + meta["dense"] + labels)
    df = df[np.random.default_rng([seed, int(day)]).permutation(df.height)]
    lists = [df[n] for n in multi]
    return (torch.from_numpy(df.select(single).to_numpy().astype(np.int64)),
            [(torch.from_numpy(c.list.len().to_numpy().astype(np.int64)),
              torch.from_numpy(c.explode().drop_nulls().to_numpy().astype(np.int64))) for c in lists],
            # the same work as the product's loader: standardize (stats of this day here), missing -> 0
            torch.from_numpy(np.nan_to_num((lambda x: (x - np.nanmean(x, 0)) / (np.nanstd(x, 0) + 1e-6))(
                df.select(meta["dense"]).to_numpy().astype(np.float64)), nan=0.0).astype(np.float32)),
            torch.from_numpy(df.select(labels).to_numpy().astype(np.float32)))


def _worker(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")  # sparse-gradient and DDP notices, printed once per step otherwise
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    meta = read_meta(args.data)
    days = sorted(meta["days"])[args.skip_days:len(meta["days"]) - 1][:args.train_days]
    B, G = args.batch_size, args.batch_size * world
    steps = sum(int(meta["days"][d]["rows"]) // G for d in days)
    torch.manual_seed(args.seed)
    model = ReferenceRanker(meta["sparse"], len(meta["dense"]), len(meta["tasks"]))
    ddp = nn.parallel.DistributedDataParallel(model)
    emb = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    optims = [torch.optim.Adagrad(emb, lr=args.lr_embedding), torch.optim.Adam(rest, lr=args.lr_dense)]
    # Adagrad has no momentum to cycle; Adam's beta1 cycles as in the pipeline.
    scheds = [torch.optim.lr_scheduler.OneCycleLR(optims[0], args.lr_embedding, total_steps=steps, cycle_momentum=False),
              torch.optim.lr_scheduler.OneCycleLR(optims[1], args.lr_dense, total_steps=steps)]
    loss_sum, done = 0.0, 0
    start = time.monotonic()
    for day in days:
        single, multi, dense, labels = _load_day(args.data, meta, day, args.seed)
        offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]) for lens, _ in multi]
        for b in range(int(meta["days"][day]["rows"]) // G):
            idx = torch.arange(b * G + rank * B, b * G + (rank + 1) * B)
            bag_inputs = []
            for (lens, values), offs in zip(multi, offsets):
                row_lens, starts = lens[idx], offs[idx]
                rel = torch.arange(int(row_lens.sum())) - torch.repeat_interleave(row_lens.cumsum(0) - row_lens, row_lens)
                bag_inputs.append((values[torch.repeat_interleave(starts, row_lens) + rel],
                                   torch.cat([torch.zeros(1, dtype=torch.int64), row_lens.cumsum(0)[:-1]])))
            logits = ddp(dense[idx], single[idx], bag_inputs)
            loss = F.binary_cross_entropy_with_logits(logits, labels[idx], reduction="none").mean(0).sum()
            loss.backward()
            for o in optims:
                o.step()
                o.zero_grad()
            for s in scheds:
                if done + 1 < steps:
                    s.step()
            loss_sum += float(loss.detach())
            done += 1
    seconds = time.monotonic() - start
    rss = [0.0] * world
    dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"steps": done, "examples": done * G, "train_seconds": seconds,
                       "examples_per_sec": done * G / seconds, "train_loss_avg": loss_sum / max(done, 1) / len(meta["tasks"]),
                       "peak_rss_mb": max(rss), "peak_rss_mb_per_worker": rss}, f, indent=2)
    dist.barrier()
    # Leave without tearing down the process group or the interpreter: gloo's background threads
    # can crash a finished worker there (SIGSEGV: seen once before, and twice in a row on
    # 2026-11-26, after the results were written), as in recsys_hdet.distributed.launch.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="processed data set directory (contract.META_FILE)")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512, help="examples per rank per step")
    ap.add_argument("--skip-days", type=int, default=2)
    ap.add_argument("--train-days", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr-embedding", type=float, default=0.02)
    ap.add_argument("--lr-dense", type=float, default=0.001)
    ap.add_argument("--out", required=True, help="where to write the result JSON")
    args = ap.parse_args(argv)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
