"""The controller's configuration (``hdet=controller``): :class:`HDETConfig`, every field of the paper's spread,
averaging and controller with its default (the paper's form: linear spread 1 +- 1/9, softmax weights with sigma
0.1, T = 1000, the controller from step 100k) and its check; the job's own fields (the signal, the probe rows,
explored hyperparameters, the warm start); and :class:`ControllerForm`, the ``hdet`` group's schema for the form
(conf/hdet/controller.yaml sets the measured values). Import-light (no torch), so the config schema can use it
without the engine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Dict, List, Mapping, Optional

from recsys_hdet.config_values import at_least, fraction, is_number, require
from recsys_hdet.hdet.form import HDETForm


class HDETSpace(StrEnum):
    linear = "linear"   # the paper's spread 1 + alpha u and its base update
    log = "log"         # (1 + alpha)^u, the base controlled as a factor of the schedule


class HDETScore(StrEnum):
    softmax = "softmax"
    zscore = "zscore"
    rank = "rank"
    regression = "regression"
    effect = "effect"
    aimd = "aimd"
    rprop = "rprop"


class HDETDecay(StrEnum):
    schedule = "schedule"
    geometric = "geometric"


SCORES = tuple(s.value for s in HDETScore)
SLOPE_SCORES = ("effect", "aimd", "rprop")  # moved by the pooled fit's slope and its standard error
FIT_SCORES = ("regression", *SLOPE_SCORES)  # those that pool the joint fit of the ranks' losses on their offsets


@dataclass
class HDETConfig:
    # The spread: multipliers 1 + alpha u (space linear) or (1 + alpha)^u (space log), u evenly spaced in [-1, 1]
    # over the replicas.
    alpha: float = 1 / 9
    sync_every: int = 1000  # T: steps between averaging the replicas (the paper's, for a 30 h run)
    # S_warm: steps before the auto-LR controller starts (0: from the first sync, through the warm-up, so that a
    # too-high LR is pulled down before it diverges)
    controller_start: int = 100_000
    beta: float = 0.9  # momentum of the controller's signal
    sigma: float = 0.1  # softmax temperature on window-loss differences, in loss units
    lam: float = 0.5  # lambda: step size of the base update
    autolr: bool = True  # false: spread + converge only (the base follows the schedule)
    seed: int = 0  # seeds the permutation generator (the same on every rank); conf/hdet/controller.yaml sets the run's seed
    # No-signal decay of the controlled base (linear space): schedule keeps the base schedule's shape to its floor;
    # geometric: one constant ratio per sync to the floor.
    decay: HDETDecay = HDETDecay.schedule
    # linear: the paper's spread and base update (sigma, lam, decay, ceiling_multiple); log: geometric spread, the
    # base = schedule x a controlled factor, moved in log units.
    space: HDETSpace = HDETSpace.linear
    # softmax: the paper's weights, absolute sigma in loss units. zscore | rank: scale-free (the correlation of
    # -loss, or of its ranks, with the spread). regression: scale-free, one joint fit of the losses on every
    # group's offset, pooled over syncs (each group's partial correlation; log space). effect: the same fit,
    # moving by the slope's size (effect_scale, min_t, trust_region), resting where it is not told apart from zero.
    # aimd: the same fit; up by aimd_up each sync unless it shows harm (aimd_down). rprop: the same fit's sign; a
    # step that grows while it repeats.
    score: HDETScore = HDETScore.softmax
    # log space: step per sync in natural-log units (None: from travel_decades and the number of controlled syncs)
    log_step: Optional[float] = None
    travel_decades: float = 2.0  # log space: how far a consistent signal moves the base over the run
    # log space: the base stays within these decades of the schedule
    range_decades: List[float] = field(default_factory=lambda: [-2.0, 2.0])
    # score="effect" (log space): moves by the estimated loss change per ln LR, relative to the loss
    effect_scale: float = 0.005  # the relative slope that takes a whole trust-region step (NE differences are
                                 # relative loss differences)
    min_t: float = 2.0  # a slope within min_t standard errors of zero moves nothing (the base rests)
    trust_region: Optional[float] = None  # largest move per sync in ln units (None: ln(1 + alpha), the spread)
    # The pooled fit (scores regression, effect, aimd, rprop): "raw" pools every sync's losses in loss units, so the
    # syncs with the widest loss spread (warm-up) dominate it for the rest of the pass; "per_sync" weighs
    # each sync by the inverse of its loss variance across the ranks (each sync counts alike; the slopes
    # stay in loss units). fit_reset_at: the fraction of the pass at which the fit starts over (0.3: the
    # one-cycle warm-up's end; null: never).
    fit_weighting: str = "raw"
    fit_reset_at: Optional[float] = None
    # score="aimd" (log space): every sync the base is raised by aimd_up unless the pooled fit shows a
    # higher rate to do significant harm (slope > 0 beyond min_t standard errors) or a rank was
    # non-finite; then it is cut by aimd_down (upward-biased: the short-horizon bias pulls the other way).
    aimd_up: float = 1.1
    aimd_down: float = 0.5
    # score="rprop" (log space; Riedmiller and Braun 1993): the base moves against the sign of the pooled
    # fit's slope by a step (ln units) that starts at the spread, ln(1 + alpha), grows by rprop_up while
    # the sign repeats and shrinks by rprop_down when it flips, within rprop_max_step: no significance
    # gate (noise flips the sign, and the step shrinks), and consistent signs travel decades (10 syncs
    # from x1.25: about 2.5 decades).
    rprop_up: float = 1.2
    rprop_down: float = 0.5
    rprop_max_step: float = 1.0
    # Explore-then-commit (log space; recsys_hdet/hdet/controller/rounds.py): the first explore_rounds x explore_steps steps
    # are rounds in which each spread group's replicas train apart (no averaging inside a round) at a wide spread,
    # explore_decades between the extreme replicas in the first round, explore_narrow times that in each next one; at a
    # round's end the replicas are averaged and the base moves to the best replica's value; after the
    # last round the spread is 0 (the plain run from there, syncs every sync_every steps) and the
    # controller moves nothing. 0 rounds: off (the controller of `score` runs throughout).
    explore_rounds: int = 0
    explore_steps: int = 0
    explore_decades: float = 1.0
    explore_narrow: float = 0.5

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "HDETConfig":
        """The controller's fields of a larger mapping (e.g. the ``hdet`` config group), nothing else."""
        names = {f.name for f in dataclasses.fields(HDETConfig)}
        return HDETConfig(**{k: v for k, v in values.items() if k in names})

    @property
    def offset_width(self) -> float:
        """d ln(value) per unit of a replica's offset u in [-1, 1]: ln(1 + alpha) in log space; alpha in
        linear space (to first order)."""
        return math.log(1.0 + self.alpha) if self.space == "log" else self.alpha

    def __post_init__(self) -> None:
        checks = [
            (self.alpha >= 0 and math.isfinite(self.alpha), "alpha", "must be a finite number >= 0"),
            (self.sync_every >= 1, "sync_every", "must be an integer >= 1"),
            (self.controller_start >= 0, "controller_start", "must be an integer >= 0"),
            (0 <= self.beta < 1, "beta", "must be in [0, 1)"),
            (self.sigma > 0 and math.isfinite(self.sigma), "sigma", "must be a finite number > 0"),
            (self.lam >= 0 and math.isfinite(self.lam), "lam", "must be a finite number >= 0"),
            (self.decay in ("schedule", "geometric"), "decay", "must be 'schedule' or 'geometric'"),
            (self.space in ("linear", "log"), "space", "must be 'linear' or 'log'"),
            (self.score in SCORES, "score", "must be one of " + ", ".join(repr(x) for x in SCORES)),
            (self.score != "effect" or self.space == "log", "score", "'effect' moves in log units: needs space=log"),
            (self.effect_scale > 0 and math.isfinite(self.effect_scale), "effect_scale", "must be a finite number > 0"),
            (self.min_t >= 0 and math.isfinite(self.min_t), "min_t", "must be a finite number >= 0"),
            (self.trust_region is None or (self.trust_region >= 0 and math.isfinite(self.trust_region)),
             "trust_region", "must be null or a finite number >= 0"),
            (self.log_step is None or (self.log_step >= 0 and math.isfinite(self.log_step)), "log_step",
             "must be null or a finite number >= 0"),
            (self.travel_decades >= 0 and math.isfinite(self.travel_decades), "travel_decades",
             "must be a finite number >= 0"),
            (self.fit_weighting in ("raw", "per_sync"), "fit_weighting", "must be 'raw' or 'per_sync'"),
            (self.fit_reset_at is None or 0 < self.fit_reset_at < 1, "fit_reset_at", "must be null or in (0, 1)"),
            (self.score != "aimd" or self.space == "log", "score", "'aimd' moves in log units: needs space=log"),
            (self.aimd_up >= 1 and math.isfinite(self.aimd_up), "aimd_up", "must be a finite number >= 1"),
            (0 < self.aimd_down <= 1, "aimd_down", "must be in (0, 1]"),
            (self.score != "rprop" or self.space == "log", "score", "'rprop' moves in log units: needs space=log"),
            (self.rprop_up >= 1 and math.isfinite(self.rprop_up), "rprop_up", "must be a finite number >= 1"),
            (0 < self.rprop_down <= 1, "rprop_down", "must be in (0, 1]"),
            (self.rprop_max_step > 0 and math.isfinite(self.rprop_max_step), "rprop_max_step",
             "must be a finite number > 0"),
            (isinstance(self.explore_rounds, int) and self.explore_rounds >= 0, "explore_rounds",
             "must be an integer >= 0"),
            (self.explore_rounds == 0 or (self.space == "log" and self.explore_steps >= 1), "explore_steps",
             "explore_rounds > 0 needs space=log and explore_steps >= 1 (steps per round)"),
            (self.explore_decades > 0 and math.isfinite(self.explore_decades), "explore_decades",
             "must be a finite number > 0"),
            (0 < self.explore_narrow <= 1, "explore_narrow", "must be in (0, 1]"),
            (len(self.range_decades) == 2 and self.range_decades[0] <= 0 <= self.range_decades[1]
             and all(math.isfinite(x) for x in self.range_decades), "range_decades",
             "must be [low, high] with low <= 0 <= high (decades around the schedule)"),
        ]
        for ok, key, expected in checks:
            if not ok:
                value = getattr(self, key)
                raise ValueError(f"config hdet.{key}={str(value) if isinstance(value, StrEnum) else value!r}: {expected}")


# ----------------------------------------------------------------------------------------------
# The job's HDET fields


class HDETSignal(StrEnum):
    train = "train"
    serving = "serving"
    probe = "probe"
    averaged_probe = "averaged_probe"
    anneal_probe = "anneal_probe"
    discounted_credit = "discounted_credit"


# The signals that score rows reserved from training (hdet.probe_rows).
PROBE_SIGNALS = (HDETSignal.probe, HDETSignal.averaged_probe, HDETSignal.anneal_probe, HDETSignal.discounted_credit)


class AveragedTensors(StrEnum):
    dense = "dense"
    all = "all"


@dataclass
class AveragedProbeConfig:
    """``signal=averaged_probe``: the probe rows scored at the window's averaged iterate."""
    fraction: float = 0.5   # the iterates of this last part of each window are averaged
    tensors: AveragedTensors = AveragedTensors.all   # dense: the dense parameters only; all: the embedding rows too
                                                     # (one more copy)

    def __post_init__(self) -> None:
        fraction("hdet.averaged_probe.fraction", self.fraction, low_open=True, high_open=False)


@dataclass
class AnnealProbeConfig:
    """``signal=anneal_probe``: the probe rows scored after a short cooldown to LR 0."""
    steps: int = 4   # cooldown steps, LR x (steps - i) / (steps + 1), on the first steps x data.batch_size reserved
                     # rows; the probe scores the rest

    def __post_init__(self) -> None:
        at_least("hdet.anneal_probe.steps", self.steps, 1)


@dataclass
class DiscountedCreditConfig:
    """``signal=discounted_credit``."""
    mu: float = 0.9         # discount of past windows' displacements (0: greedy)
    fraction: float = 0.5   # the iterates of this last part of each window are averaged

    def __post_init__(self) -> None:
        require(is_number(self.mu) and 0 <= self.mu < 1, "hdet.discounted_credit.mu", self.mu, "must be in [0, 1)")
        fraction("hdet.discounted_credit.fraction", self.fraction, low_open=True, high_open=False)


@dataclass
class ExploreConfig:
    """Scalar hyperparameters beyond LR, steered like the LRs; null: not explored. Each a mapping:
    ``spread`` and its bounds (``max``; ``max_multiple`` for weight decay; ``min``/``max`` for the
    attention temperature)."""
    dropout: Optional[Dict[str, float]] = None           # additive, e.g. {spread: 0.05, max: 0.7}
    # multiplicative, decoupled (needs optim.dense.type=adamw), e.g. {spread: 0.5, max_multiple: 1.0}
    weight_decay: Optional[Dict[str, float]] = None
    temperature: Optional[Dict[str, float]] = None       # multiplicative attention temperature, e.g.
                                                         # {spread: 0.2, min: 0.25, max: 4.0}
    label_smoothing: Optional[Dict[str, float]] = None   # additive, e.g. {spread: 0.02, max: 0.2}

    def __post_init__(self) -> None:
        for name, spec in vars(self).items():
            if spec is None:
                continue
            spread = spec.get("spread")
            require(is_number(spread) and spread >= 0, f"hdet.explore.{name}.spread", spread, "must be a number >= 0")
            if name in ("dropout", "label_smoothing"):
                fraction(f"hdet.explore.{name}.max", spec.get("max", -1), low_open=True)


@dataclass
class WarmInitConfig:
    nu: float = 0.0   # > 0: perturb each replica by nu x RMS per tensor after trainer.warm_start

    def __post_init__(self) -> None:
        require(is_number(self.nu) and self.nu >= 0, "hdet.warm_init.nu", self.nu, "must be >= 0")


@dataclass
class ControllerForm(HDETConfig, HDETForm):
    """``hdet=controller``: the paper's spread, averaging and controller (:mod:`recsys_hdet.hdet.controller`). The
    controller's fields are :class:`HDETConfig`'s (declared, defaulted, explained and checked there, once), plus
    the job's own fields below; conf/hdet/controller.yaml holds only the values where the measured form differs
    from these defaults (the paper's form)."""
    enabled: bool = True   # false: plain data-parallel training (hdet=disabled says it in one word)
    # null: the embedding replicas (sharding groups) are averaged at every sync when the embedding LR is spread,
    # else every trainer.embedding_sync_every steps as in a plain run (alpha = 0 is the plain run); N: every N
    # steps regardless
    embedding_sync_every: Optional[int] = None
    ceiling_multiple: float = 2.0   # the controlled base stays within [schedule floor, this x max_lr]
    # The replicas' loss signal. train: the training loss. serving: the loss as the model serves (no dropout or
    # smoothing) on the batch about to be trained: a held-out estimate in one pass; one extra forward per step.
    # probe: at each sync every replica scores the same rows, reserved from the day being trained (differences
    # come from parameters, not data). averaged_probe: the same rows, scored at the window's averaged iterate.
    # anneal_probe: the same rows, scored after a short cooldown to LR 0 from a copy of the replica's state,
    # which is then restored. discounted_credit: the same rows, scored at the replicas' averaged iterate moved
    # along each group's discounted sum of past displacements by the replica's offset (MARTHE's hypergradient
    # read from the spread).
    signal: HDETSignal = HDETSignal.anneal_probe
    probe_rows: int = 4096   # probe signals: rows reserved (never trained on) from each training day
    averaged_probe: AveragedProbeConfig = field(default_factory=AveragedProbeConfig)
    anneal_probe: AnnealProbeConfig = field(default_factory=AnnealProbeConfig)
    discounted_credit: DiscountedCreditConfig = field(default_factory=DiscountedCreditConfig)
    # Probe signals (not discounted_credit): each replica scores avg + c (own - avg), avg being the replicas'
    # average: 1.0 scores the replica itself; "replicas" uses c = 1 / (replicas on the group's axis), which weighs
    # a replica's own noise as the averaged model feels it (the replica alone shows N x its noise;
    # docs/results/hdet_history.md).
    # A number in (0, 1], or "replicas".
    probe_mix: Any = 1.0
    explore: ExploreConfig = field(default_factory=ExploreConfig)   # hyperparameters beyond LR (null: not explored)
    warm_init: WarmInitConfig = field(default_factory=WarmInitConfig)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        super().__post_init__()  # the controller's checks
        if self.embedding_sync_every is not None:
            at_least("hdet.embedding_sync_every", self.embedding_sync_every, 1)
        require(is_number(self.ceiling_multiple) and self.ceiling_multiple >= 1, "hdet.ceiling_multiple",
                self.ceiling_multiple, "must be >= 1")
        if self.signal in PROBE_SIGNALS:
            at_least("hdet.probe_rows", self.probe_rows, 1)
        mix = self.probe_mix
        require(mix == "replicas" or (is_number(mix) and 0 < mix <= 1), "hdet.probe_mix", mix,
                "'replicas' or a number in (0, 1]")
