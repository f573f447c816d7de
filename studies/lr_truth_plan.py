"""What the ground-truth study (:mod:`studies.lr_truth`) trains: its modes (:data:`MODES`: the starts, seeds,
layout, windows and checkpoints), the multipliers a branch and an explore round apply, the signal runs
(:data:`SIGNAL_RUNS`), and the runs' names (:func:`pct`, :func:`checkpoint_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

from recsys_hdet.constants import LR_AXES
from studies.runs import StudyError

GROUPS = LR_AXES  # what a branch multiplies
ROUND_MULTIPLIERS = (1.0, 10 ** 0.5, 10.0)  # explore_round: x1, x3.16, x10 of the start, one group (or all)
MULTIPLIERS = (0.5, 1.0, 2.0)
FRACTIONS = (0.25, 0.5, 0.75)
ALPHA = 0.25  # the controller's spread (conf/hdet/controller.yaml)
# A signal run per (start, seed, checkpoint) for each of these (name: its overrides); the scorecard's
# losses are their sync records' "losses", and the probe run's "train_losses" (the window loss).
# discounted_credit_greedy: the same signal with mu = 0 at the last iterate (one step of a T = 50
# window), the greedy hypergradient, as its control; anneal_probe_local: the default signal with
# independent dense replicas between syncs (trainer.dense_gradients=local, local SGD).
SIGNAL_RUNS = {
    "probe": ("hdet.signal=probe",),
    "serving": ("hdet.signal=serving",),
    "averaged_probe": ("hdet.signal=averaged_probe",),
    "anneal_probe": ("hdet.signal=anneal_probe",),
    "discounted_credit": ("hdet.signal=discounted_credit",),
    "discounted_credit_greedy": ("hdet.signal=discounted_credit", "hdet.discounted_credit.mu=0",
                                 "hdet.discounted_credit.fraction=0.02"),
    "anneal_probe_local": ("hdet.signal=anneal_probe", "trainer.dense_gradients=local"),
}


@dataclass
class Mode:
    overrides: Tuple[str, ...]  # every run's
    starts: Dict[str, Tuple[float, float]]  # name -> (embedding, dense) peak LRs
    seeds: Tuple[int, ...]
    sync_every: int  # T: the signal runs' window, and every run's log interval
    windows: int  # syncs a signal run measures
    layout: Tuple[int, int] = (4, 2)  # nproc, sharding_group_size
    reserve_rows: int = 4096
    fractions: Tuple[float, ...] = FRACTIONS  # where the trunk keeps checkpoints
    groups: Tuple[str, ...] = tuple(GROUPS)  # which groups' LRs are branched
    # Explore-then-commit's falsification (--explore-round): where one round starts (0: the pass's start,
    # else a trunk checkpoint), how long it is (it must divide the checkpoint's step: the round is one
    # HDET window), which groups and which starts.
    round_fractions: Tuple[float, ...] = (0.0, 0.25)
    round_steps: int = 125
    round_groups: Tuple[str, ...] = ("embedding", "dense", "all")
    round_starts: Tuple[str, ...] = ("low",)


# The record's plateau start is the recovery grid's best cell (docs/results/lr_recovery/lr_recovery.md: embedding 6,
# dense 0.0095); "low" is every group 10x below it.
MODES = {
    "record": Mode(("+experiment=baseline_low",), {"plateau": (6.0, 0.0095), "low": (0.6, 0.00095)}, (0, 1, 2), 50, 4),
    # Demo data, its last two training days: a pass of ~146 steps. The demo preset's LRs stand for the
    # plateau here (not measured), "low" 10x below.
    "fast": Mode(("+experiment=baseline_low", "data=demo", "data.train_days=2"),
                 {"preset": (0.05, 0.002), "low": (0.005, 0.0002)}, (0, 1, 2), 25, 4),
    # For the harness's own end-to-end test: tiny data, two ranks.
    "tiny": Mode(("data=tiny",), {"preset": (0.05, 0.002)}, (0, 1), 5, 1, layout=(2, 1), reserve_rows=2048,
                 fractions=(0.5,), groups=("dense",), round_fractions=(0.0, 0.5), round_steps=5,
                 round_groups=("dense",), round_starts=("preset",)),
}


def pct(fraction: float) -> str:
    return f"c{round(fraction * 100)}"


def checkpoint_step(record: Dict[str, Any]) -> int:
    """The step a branch or signal run started from: its trainer.branch_from checkpoint's."""
    for o in record["overrides"]:
        if o.startswith("trainer.branch_from="):
            return int(o.rsplit("step-", 1)[1])
    raise StudyError(f"{record['name']}: not a branch (no trainer.branch_from override)")
