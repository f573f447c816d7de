"""The model's optimizers, seen as one set of named parameter groups.

- ``embedding``: TorchRec's fused embedding optimizer. It applies its update inside backward with
  the learning rate last *pushed* into the kernel; a write into its ``param_groups`` alone would
  reach the kernel one step late. :meth:`GroupedOptimizer.apply_hparams` pushes it right after
  the schedule changes it, so the rate scheduled for step t is the rate applied at step t.
  On CPU fbgemm's fused kernels offer (rowwise) Adagrad and SGD only, so the embedding optimizer
  is configurable separately (rowwise Adagrad by default; Adam on CUDA).
- ``transformer``, ``non_embedding``, ``no_decay``: one ``torch.optim.Adam`` (or AdamW) over the
  dense parameters, one param group each, all-reduced by DDP. Two parameter-free anchors a user
  would try first for the dense groups (``optim.dense.type``): ``prodigy`` (Prodigy: Adam whose
  step size is estimated from the distance travelled; the group's LR is a multiplier, 1.0 by
  default) and ``schedulefree_adamw`` (Schedule-Free AdamW: no decay schedule, the evaluated weights
  are an average of the iterates; as its authors run it, the dense groups' LR is constant
  (lr_scheduler.Constant) and the optimizer warms up by itself over ``optim.dense.warmup_steps``,
  by default as many steps as the one-cycle's rise; the embedding group keeps the plain schedule). Neither has a fused embedding counterpart: the embedding group
  keeps its fused optimizer. Schedule-Free trains at one point and is evaluated at another: the
  job switches it to its evaluation weights (:meth:`GroupedOptimizer.eval_weights`) for every
  forward pass outside training and for the saved model.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping

import torch
from torch import nn

from recsys_hdet.models.ranker import PARAM_GROUPS, dense_parameter_groups

EMBEDDING_OPTIMIZERS = {
    "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "adagrad": "EXACT_ADAGRAD",
    "sgd": "EXACT_SGD",
    "adam": "ADAM",  # CUDA only in fbgemm
}


def fused_params(embedding_cfg: Mapping[str, Any], initial_lr: float) -> Dict[str, Any]:
    """The ``fused_params`` for TorchRec's sharder, from ``optim.embedding``."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    name = str(embedding_cfg.type)
    if name not in EMBEDDING_OPTIMIZERS:
        raise ValueError(f"optim.embedding.type={name!r}: choose one of {sorted(EMBEDDING_OPTIMIZERS)}")
    params: Dict[str, Any] = {
        "optimizer": getattr(EmbOptimType, EMBEDDING_OPTIMIZERS[name]),
        "learning_rate": initial_lr,
        "eps": float(embedding_cfg.eps),
    }
    if name == "adam":  # fbgemm's own betas (optim.embedding declares none)
        params["beta1"], params["beta2"] = 0.9, 0.999
    return params


def schedulefree_warmup(optim_cfg: Mapping[str, Any], total_steps: int) -> int:
    """Schedule-Free AdamW's own warm-up in steps: ``optim.dense.warmup_steps``, or by default (null) the
    one-cycle's rise, ``pct_start x total_steps`` (0 for every other optimizer)."""
    dense = optim_cfg.dense
    if str(dense.type) != "schedulefree_adamw":
        return 0
    steps = dense.warmup_steps
    return int(steps) if steps is not None else round(float(optim_cfg.schedule.pct_start) * total_steps)


class GroupedOptimizer:
    """Dense Adam and the fused embedding optimizer behind one list of named groups.

    ``groups[name]`` is a list of param_group dicts (the fused optimizer has one per sharded
    kernel). Schedules write ``lr`` (and ``betas``) into them, then call :meth:`apply_hparams`.

    Not TorchRec's ``CombinedOptimizer``/``KeyedOptimizer``: those key state by parameter name for
    checkpointing and step every optimizer alike, while the schedules, HDET and rollback address the four
    LR groups by name across the dense optimizer's and the fused kernels' param_groups, and a fused kernel
    takes a new LR only when it is pushed (:meth:`apply_hparams`; written late, it reaches the kernel a
    step late). The model's state (the fused optimizer's included) is checkpointed by DCP, not here.
    """

    def __init__(self, model: nn.Module, dense_cfg: Mapping[str, Any], initial_lrs: Mapping[str, float],
                 warmup_steps: int = 0) -> None:
        fused = getattr(model, "fused_optimizer", None)
        if fused is None:
            raise ValueError("the model has no fused embedding optimizer: wrap it in DistributedModelParallel first")
        self.fused = fused
        named = {n: p for n, p in model.named_parameters() if p.requires_grad}
        dense_groups = dense_parameter_groups(named)
        kind = str(dense_cfg.type)
        betas = tuple(float(b) for b in dense_cfg.betas)
        groups = [
            {"params": params, "name": name, "lr": initial_lrs[name], "weight_decay": float(wd)}
            for name, params in dense_groups.items()
            if params
            for wd in [0.0 if name == "no_decay" else dense_cfg.weight_decay]
        ]
        common = dict(lr=initial_lrs["transformer"], betas=betas, eps=float(dense_cfg.eps))
        if kind in ("adam", "adamw"):
            # One fused kernel over all tensors: ~2x faster per step than the per-tensor loop on CPU
            # for this many small tensors (benchmarks/run.py, BENCHMARKS.md).
            opt_cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
            self.dense = opt_cls(groups, **common, fused=bool(dense_cfg.fused))
        elif kind == "prodigy":
            from prodigyopt import Prodigy

            # decouple: AdamW-style weight decay; safeguard_warmup: the warm-up's small LR does not
            # inflate the distance estimate (the authors' advice with a warm-up).
            self.dense = Prodigy(groups, **common, decouple=True, safeguard_warmup=True,
                                 d0=float(dense_cfg.d0))
        elif kind == "schedulefree_adamw":
            from schedulefree import AdamWScheduleFree

            # Its own warm-up (warmup_steps); the dense groups' schedule is constant (build_schedules).
            self.dense = AdamWScheduleFree(groups, **common, warmup_steps=int(warmup_steps))
            self.dense.train()
        else:
            raise ValueError(f"optim.dense.type={kind!r}: choose adam, adamw, prodigy or schedulefree_adamw")
        self.schedule_free = kind == "schedulefree_adamw"
        self.groups: Dict[str, List[Dict[str, Any]]] = {g: [] for g in PARAM_GROUPS}
        for pg in self.dense.param_groups:
            self.groups[pg["name"]].append(pg)
        for pg in self.fused.param_groups:
            pg["lr"] = initial_lrs["embedding"]
            pg["name"] = "embedding"
            self.groups["embedding"].append(pg)
        self.apply_hparams()

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """Every param_group dict, each with its ``name``: what LR schedulers iterate over."""
        return [pg for pgs in self.groups.values() for pg in pgs]

    def group_lrs(self) -> Dict[str, float]:
        """Each group's step size as logged: its ``lr``, times Prodigy's estimate ``d`` where the
        optimizer is Prodigy (its ``lr`` is a multiplier of ``d``)."""
        return {name: float(pgs[0]["lr"]) * float(pgs[0].get("d", 1.0)) for name, pgs in self.groups.items() if pgs}

    def apply_hparams(self) -> None:
        """Pushes the fused groups' ``lr`` into the embedding kernels now (see the module docstring)."""
        self.fused.step()

    def step(self) -> None:
        # The fused embedding update already happened in backward.
        self.dense.step()

    @contextmanager
    def eval_weights(self) -> Iterator[None]:
        """The dense weights to evaluate and save: Schedule-Free's averaged point while inside (its
        ``eval()``; back to its training point after), the live weights for every other optimizer."""
        if not self.schedule_free:
            yield
            return
        self.dense.eval()
        try:
            yield
        finally:
            self.dense.train()

    def zero_grad(self) -> None:
        self.dense.zero_grad(set_to_none=True)

    def state_dict(self) -> Dict[str, Any]:
        return {"dense": self.dense.state_dict(), "fused": self.fused.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dense.load_state_dict(state["dense"])
        self.fused.load_state_dict(state["fused"])
        self.apply_hparams()
