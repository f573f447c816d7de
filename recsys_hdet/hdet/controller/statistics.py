"""The controller's statistics, as pure functions of the replicas' losses (no process group, no
optimizer): the spread's offsets and multipliers, each score's preference for the higher offsets,
the pooled joint least-squares fit of the losses on every hyperparameter's offsets and its effect
estimates, and the effect controller's move. The engine (:mod:`recsys_hdet.hdet.controller.engine`) calls them
at every sync; the studies replay them over recorded syncs (``studies.lr_truth``, ``signal_noise``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch


def spread_offsets(num_replicas: int) -> torch.Tensor:
    """u_r for r in [0, N): evenly spaced, symmetric around 0, in [-1, 1] (0 for one replica), float64."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas}: must be >= 1")
    centre = (num_replicas - 1) / 2.0
    return (torch.arange(num_replicas, dtype=torch.float64) - centre) / max(centre, 0.5)


def spread_multipliers(num_replicas: int, alpha: float, space: str = "linear") -> torch.Tensor:
    """rho_r for r in [0, N), float64. "linear" (the paper): ``1 + alpha u``, mean 1, in
    [1 - alpha, 1 + alpha]. "log": ``(1 + alpha) ** u``, mean log 0, in [1 / (1 + alpha), 1 + alpha]."""
    if alpha < 0:
        raise ValueError(f"hdet.alpha={alpha}: must be >= 0")
    u = spread_offsets(num_replicas)
    return (1.0 + alpha) ** u if space == "log" else 1.0 + alpha * u


def preference(losses: torch.Tensor, ok: torch.Tensor, u: torch.Tensor, score: str, sigma: float) -> float:
    """g: how strongly the replicas' losses favour the higher offsets ``u``. Replicas not ``ok``
    (non-finite) are left out by "softmax" (the paper's ``sum w u - mean u``, w = softmax((mean L -
    L) / sigma), in loss units) and ranked worst by the scale-free scores: "zscore", the correlation
    of ``-L`` with ``u``, and "rank", the correlation of the ranks of ``-L`` with ``u`` (centred-rank
    fitness shaping). Both are in [-1, 1] and unchanged when the losses are scaled or shifted."""
    if score == "softmax":
        if int(ok.sum()) < 2:
            return 0.0
        L, uu = losses[ok], u[ok]
        w = torch.softmax((L.mean() - L) / sigma, dim=0)
        return float((w * uu).sum() - uu.mean())
    fitness = torch.where(ok, -losses, torch.tensor(float("-inf"), dtype=torch.float64))
    finite = torch.isfinite(fitness)
    if int(finite.sum()) == 0:
        return 0.0
    if score == "rank":
        # Average ranks (ties share one), 0 = worst; a non-finite replica is the worst.
        order = fitness.argsort()
        ranks = torch.empty_like(fitness)
        ranks[order] = torch.arange(len(fitness), dtype=torch.float64)
        f = torch.stack([ranks[fitness == x].mean() for x in fitness])
    else:  # zscore: standardised over the finite ones; a non-finite replica one spread below the worst
        good = fitness[finite]
        spread = float(good.std()) if len(good) > 1 and float(good.std()) > 0 else 1.0
        f = torch.where(finite, (fitness - good.mean()) / spread, (good.min() - good.mean()) / spread - 1.0)
    fc, uc = f - f.mean(), u - u.mean()
    denominator = float((fc.square().sum() * uc.square().sum()).sqrt())
    return float((fc * uc).sum()) / denominator if denominator > 0 else 0.0


def new_joint_fit(num_hparams: int) -> Dict[str, Any]:
    """The pooled normal equations of :func:`joint_preferences`, empty."""
    return {"xx": torch.zeros(num_hparams, num_hparams, dtype=torch.float64),
            "xy": torch.zeros(num_hparams, dtype=torch.float64), "yy": 0.0, "dof": 0.0}


def joint_preferences(fit: Dict[str, Any], X: torch.Tensor, rank_loss: torch.Tensor, rank_ok: torch.Tensor,
                      usable: Sequence[int], beta: float, weighting: str = "raw") -> Dict[int, float]:
    """score="regression": adds one sync to ``fit`` (in place) and returns, for every hparam index in
    ``usable``, the partial correlation of -loss with its offset from ONE least-squares fit of the
    ranks' losses on all hparams' offsets at once (``X``: rank x hparam offsets).

    Why: the hparams' permutations are independent, so a per-hparam correlation (zscore, rank)
    counts the other hparams' effects as noise; with two embedding replicas and three dense
    groups spread over four ranks that noise decides the sign of the embedding group's signal.
    The fit is pooled over syncs (normal equations decayed by ``beta`` per sync, each sync's losses
    and offsets centred over the ranks), so the pooling is the momentum; the partial correlation
    ``t / sqrt(t^2 + dof)`` is in [-1, 1] and unchanged when the losses are scaled or shifted. A
    non-finite rank scores one spread above the worst finite one (the strongest signal). No
    signal (0) until the pooled fit has more degrees of freedom than hparams.
    """
    effects = joint_effects(fit, X, rank_loss, rank_ok, usable, beta, weighting)
    return {i: float(-slope / se / math.sqrt((slope / se) ** 2 + dof)) if se > 0 else 0.0
            for i, (slope, se, dof) in effects.items()}


def joint_effects(fit: Dict[str, Any], X: torch.Tensor, rank_loss: torch.Tensor, rank_ok: torch.Tensor,
                  usable: Sequence[int], beta: float, weighting: str = "raw") -> Dict[int, Tuple[float, float, float]]:
    """The fit behind :func:`joint_preferences` (it adds the sync to ``fit``): for every hparam index
    in ``usable``, ``(slope, standard error, residual dof)``, the slope being d loss / d offset in
    loss units (offsets in [-1, 1]), from one least-squares fit of the ranks' losses on all hparams'
    offsets, pooled over syncs. ``(0, 0, 0)`` until the pooled fit has more dof than hparams.

    ``weighting``: "raw" adds every sync as it is, so a sync whose losses spread 1000x wider (warm-up)
    outweighs the later ones by 10^6 for as long as beta leaves it any weight; "per_sync" adds each sync
    weighted by the inverse of its losses' variance across the ranks (weighted least squares: the
    slopes stay in loss units, each sync counts alike)."""
    finite = torch.isfinite(rank_loss) & rank_ok
    if not usable or int(finite.sum()) < 2:
        return {}
    y = rank_loss.clone()
    good = y[finite]
    y[~finite] = good.max() + (good.std() if len(good) > 1 else 0.0) + 1e-12
    Xc, yc = X - X.mean(0), y - y.mean()
    if weighting == "per_sync":
        weight = 1.0 / max(float(yc @ yc) / max(len(y) - 1, 1), 1e-300)
        Xc, yc = Xc * math.sqrt(weight), yc * math.sqrt(weight)
    fit["xx"] = beta * fit["xx"] + Xc.T @ Xc
    fit["xy"] = beta * fit["xy"] + Xc.T @ yc
    fit["yy"] = beta * fit["yy"] + float(yc @ yc)
    fit["dof"] = beta * fit["dof"] + (len(y) - 1)
    idx = torch.tensor(list(usable))
    A, b = fit["xx"][idx][:, idx], fit["xy"][idx]
    dof = fit["dof"] - len(usable)
    if dof <= 0:
        return {i: (0.0, 0.0, 0.0) for i in usable}
    A = A + torch.eye(len(usable), dtype=torch.float64) * 1e-9 * float(A.diagonal().mean())
    coef = torch.linalg.solve(A, b)
    rss = max(fit["yy"] - float(coef @ b), 1e-30 * max(fit["yy"], 1e-300))
    se = torch.sqrt(rss / dof * torch.linalg.inv(A).diagonal())
    return {i: (float(c), float(e), float(dof)) for i, c, e in zip(usable, coef, se)}


def effect_move(effect: Tuple[float, float, float], width: float, loss_level: float, effect_scale: float,
                min_t: float, trust: float) -> float:
    """score="effect"'s move of ln(base / schedule) at one sync, from the pooled fit's ``(slope,
    standard error, dof)`` (:func:`joint_effects`; slope in loss units per offset, an offset of 1
    being a factor ``exp(width)``): ``-trust * clip(slope / width / loss_level / effect_scale, -1, 1)``,
    0 where the slope is within ``min_t`` standard errors of zero or the loss level is unknown."""
    slope, se, _ = effect
    if not math.isfinite(loss_level) or loss_level <= 0 or se <= 0 or abs(slope) < min_t * se:
        return 0.0
    relative = slope / width / loss_level
    return -trust * min(max(relative / effect_scale, -1.0), 1.0)


def replica_losses(replica_of_rank: Sequence[int], num_replicas: int, rank_loss: torch.Tensor, rank_ok: torch.Tensor):
    """Each replica's loss (the mean over its ranks) and whether every one of its ranks is finite."""
    owner = torch.tensor(list(replica_of_rank))
    losses = torch.zeros(num_replicas, dtype=torch.float64)
    ok = torch.ones(num_replicas, dtype=torch.bool)
    for r in range(num_replicas):
        members = owner == r
        ok[r] = bool(rank_ok[members].all())
        losses[r] = rank_loss[members].mean() if ok[r] else float("nan")
    return losses, ok


def decay_gamma(schedule: Callable[[int], float], config: Any, step: int, total_steps: int, floor: float, base: float,
                syncs_left: int) -> float:
    """Linear space's per-sync decay of a controlled base; with no signal the base reaches the schedule's
    end at the last window. "schedule": the base schedule's own ratio over the coming window (from the
    last step of the window just scored to the last step of the next one), so with no signal the base
    keeps the schedule's shape (and equals it, if it started equal). "geometric": one constant ratio per
    sync from the current base down to the floor."""
    if syncs_left <= 0:
        return 0.0
    if config.decay == "schedule":
        last = step - 1
        now = schedule(min(last, total_steps - 1))
        nxt = schedule(min(last + config.sync_every, total_steps - 1))
        return 1.0 - nxt / now if now > 0 else 0.0
    return 1.0 - (floor / base) ** (1.0 / syncs_left) if base > floor else 0.0


def additive_drift(schedule: Callable[[int], float], config: Any, step: int, total_steps: int, floor: float,
                   base: float, syncs_left: int) -> float:
    """The additive counterpart of :func:`decay_gamma`: the schedule's change over the coming window
    ("schedule"), or an equal step per sync down to the floor ("geometric")."""
    if syncs_left <= 0:
        return 0.0
    if config.decay == "schedule":
        last = step - 1
        return schedule(min(last + config.sync_every, total_steps - 1)) - schedule(min(last, total_steps - 1))
    return (floor - base) / syncs_left


def aimd_move(effect: Optional[Tuple[float, float, float]], any_excluded: bool, min_t: float, up: float,
              down: float) -> float:
    """score="aimd"'s move of ln(base / schedule) at one sync: ``ln(down)`` when a rank was non-finite or
    the pooled fit's slope (``(slope, se, dof)``, loss per offset: > 0 means a higher rate does worse) is
    more than ``min_t`` standard errors above zero, else ``ln(up)``: additive increase, multiplicative
    decrease, biased upward against the short-horizon bias (Wu et al. 2018, arXiv 1803.02021)."""
    slope, se, _ = effect if effect is not None else (0.0, 0.0, 0.0)
    harm = any_excluded or (se > 0 and slope > min_t * se)
    return math.log(down if harm else up)


def rprop_move(effect: Optional[Tuple[float, float, float]], last_sign: int, step: float, up: float, down: float,
               max_step: float) -> Tuple[float, int, float]:
    """score="rprop"'s move of ln(base / schedule) at one sync: ``(move, sign, step)``. ``sign`` is the
    direction the pooled fit's slope (``(slope, se, dof)``: > 0 means a higher rate does worse) points to
    (-1 down, +1 up); the step grows by ``up`` (to ``max_step``) when it repeats ``last_sign`` and shrinks
    by ``down`` when it flips (Rprop: Riedmiller and Braun 1993). No slope (no fit yet, or exactly 0): no
    move, sign and step kept."""
    slope = effect[0] if effect is not None else 0.0
    if not math.isfinite(slope) or slope == 0.0:
        return 0.0, last_sign, step
    sign = -1 if slope > 0 else 1
    if last_sign:
        step = min(step * up, max_step) if sign == last_sign else step * down
    return sign * step, sign, step
