"""Warm noisy initialization (method section 4).

Starting from a trained checkpoint theta_0, each replica perturbs every tensor independently:
``theta += eps``, ``eps ~ N(0, (nu * ||theta|| / sqrt(d))^2)``, where d is the tensor's number of
elements: noise whose per-element size is ``nu`` times the tensor's RMS value. The caller passes
a generator seeded per replica (and per shard owner), so replicas draw different noise and a run
is reproducible. Sharded embedding tables are perturbed per local shard, with the shard's norm.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch


@torch.no_grad()
def perturb_(tensors: Iterable[torch.Tensor], nu: float, generator: torch.Generator) -> None:
    if nu < 0 or not math.isfinite(nu):
        raise ValueError(f"config hdet.warm_init.nu={nu}: must be a finite number >= 0")
    for t in tensors:
        if not t.is_floating_point() or t.numel() == 0:
            continue
        scale = nu * float(t.norm()) / math.sqrt(t.numel())
        noise = torch.randn(t.shape, generator=generator, dtype=t.dtype, device="cpu") * scale
        t.add_(noise.to(t.device))
