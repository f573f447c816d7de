"""Explore-then-commit's rounds (``hdet.explore_rounds``), as pure functions of the config and the
step count: how wide round k spreads the replicas, where each window ends, and which replica won.

The rounds are the LR range test (Smith 2017, arXiv 1506.01186) done by the replicas in parallel, and
narrowed as in successive halving (arXiv 1810.05934): in round k the extreme replicas are
``explore_decades x explore_narrow^k`` decades apart and train apart for ``explore_steps`` steps (no
averaging inside a round), so each is judged over a long horizon rather than one sync window, which
favours the lower LR (the short-horizon bias, Wu et al. 2018, arXiv 1803.02021). At the round's end the
replicas are averaged and the base moves to the best replica's value; after the last round the spread
is 0 and the base is held.

Limits: the best replica is the lowest signal loss of one round (no fit across replicas, no noise
estimate); with two replicas per group (the embedding's in a 2 x 2 layout) a round compares two values.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch


def round_width(config: Any, k: int) -> float:
    """Round ``k``'s alpha (log space): offsets -1 and 1 ``explore_decades x explore_narrow^k`` decades
    apart, ``(1 + alpha)^2 = 10^that``."""
    return 10.0 ** (config.explore_decades * config.explore_narrow ** k / 2.0) - 1.0


def window_bounds(step: int, total_steps: int, config: Any, exploration_steps: int) -> Tuple[int, int]:
    """(start, end) of the window that training step ``step`` (1-based) is in; a sync ends each window.
    Exploration rounds are windows of ``explore_steps``; after them windows end at multiples of
    ``sync_every`` (the first starts where the rounds ended). Without rounds: ``T``-step windows."""
    T = config.sync_every
    if step <= exploration_steps:
        S = config.explore_steps
        start = (step - 1) // S * S
        return start, min(start + S, total_steps)
    start = (step - 1) // T * T
    return max(start, exploration_steps), min(start + T, total_steps)


def best_replica(losses: torch.Tensor, ok: torch.Tensor) -> Optional[int]:
    """The replica with the lowest finite loss (None when none is finite); ties go to the first."""
    if not bool(ok.any()):
        return None
    return int(torch.where(ok, losses, torch.tensor(float("inf"), dtype=torch.float64)).argmin())
