"""The recovery study's contenders (:mod:`studies.lr_recovery`), each defined once: its overrides at a start
(:data:`VARIANTS`, :func:`variant_overrides`; the LR finders' sweeps, :data:`FINDERS`), its label in the report
(:data:`LABELS`), and the groups the study and its report read them by (the HDET forms, the controller issue's
variants, the retired narrow finder, whose recorded rows are read and never trained again).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from recsys_hdet.constants import LR_AXES
from studies.hdet_forms import HDET_ANNEAL_EFFECT
from studies.range_tests import FINDER_WINDOW_DECADES, HDET_RANGE_TEST, HDET_RANGE_TEST_REVISED, NARROW_SWEEP, SWEEP
from studies.starts import lr_overrides

# The two LRs the study reports per start: the embedding group's, and the dense groups' geometric mean.
REPORTED = LR_AXES

# The controller issue's variants (docs/results/hdet_history.md, "Choosing the default": pre-registered before their first
# recovery run), each the default's signal and spread with one change: explore-then-commit (two rounds of 125
# steps in the one-cycle's 293-step warm-up, a decade then half of one between the extreme replicas, then
# the plain run at the held LRs); the effect controller with the fixed estimator (each sync weighted alike,
# the fit started over at the warm-up's end); AIMD and Rprop on that estimator.
def _changed(base: Sequence[str], *changes: str) -> Tuple[str, ...]:
    """``base`` with ``changes`` (key=value overrides) in place of its overrides of the same keys."""
    keys = {c.split("=", 1)[0] for c in changes}
    return (*(o for o in base if o.split("=", 1)[0] not in keys), *changes)


FIXED_FIT = ("hdet.fit_weighting=per_sync", "hdet.fit_reset_at=0.3")
HDET_EXPLORE = _changed(HDET_ANNEAL_EFFECT, "hdet.explore_rounds=2", "hdet.explore_steps=125",
                        "hdet.explore_decades=1.0", "hdet.explore_narrow=0.5")
HDET_EFFECT_FIXED = _changed(HDET_ANNEAL_EFFECT, *FIXED_FIT)
HDET_AIMD = _changed(HDET_ANNEAL_EFFECT, "hdet.score=aimd", "hdet.aimd_up=1.1", "hdet.aimd_down=0.5", *FIXED_FIT)
HDET_RPROP = _changed(HDET_ANNEAL_EFFECT, "hdet.score=rprop", "hdet.rprop_up=1.2", "hdet.rprop_down=0.5",
                      "hdet.rprop_max_step=1.0", *FIXED_FIT)


def prodigy(embedding: float, dense: float) -> List[str]:
    """Prodigy as its authors run it: d0 = 1e-6 (its default), the dense groups' LR multiplier 1 under the
    plain run's schedule; the start's dense LR does not enter."""
    return [*lr_overrides(embedding, 1.0), "optim.dense.type=prodigy", "optim.dense.d0=1e-06"]


def schedulefree(embedding: float, dense: float) -> List[str]:
    """Schedule-Free AdamW at the start's dense LR, constant, with its own warm-up (as long as the
    one-cycle's rise); the embedding group on the plain run's schedule (components/lr_scheduler.py)."""
    return [*lr_overrides(embedding, dense), "optim.dense.type=schedulefree_adamw"]


# variant -> the overrides added to the start's LRs, or a function of the start's LRs giving every override;
# the finders' overrides come from their sweeps (:data:`FINDERS`, :meth:`Runner.lr_finder`).
VARIANTS = {"plain_rollback": (), "hdet_range_test": HDET_RANGE_TEST,
            "hdet_range_test_revised": HDET_RANGE_TEST_REVISED, "prodigy": prodigy, "schedulefree": schedulefree,
            "lr_finder": None, "hdet": HDET_ANNEAL_EFFECT, "hdet_explore": HDET_EXPLORE,
            "hdet_effect_fixed": HDET_EFFECT_FIXED, "hdet_aimd": HDET_AIMD, "hdet_rprop": HDET_RPROP,
            "lr_finder_narrow": None}
# finder contender -> (its runs' name under the start, its sweep (steps, low, high), the smoothing window its
# sweeps are read with (decades; None: fastai's per-step 0.98)); the wide finder's runs have names of their own,
# so that they never meet the narrow finder's recorded lines.
FINDERS = {"lr_finder": ("lr_finder_wide", SWEEP, FINDER_WINDOW_DECADES),
           "lr_finder_narrow": ("lr_finder", NARROW_SWEEP, None)}
# Read and reported where recorded, never trained again.
RETIRED_VARIANTS = ("lr_finder_narrow",)
HDET_VARIANTS = ("hdet", "hdet_explore", "hdet_effect_fixed", "hdet_aimd", "hdet_rprop")
# The HDET forms whose launch overrides the report prints (``forms``), read from a finished run.
# The range test's rules: as shipped, and revised (fitted on the benchmark and data_regime: range-rule-revised).
RANGE_TEST_VARIANTS = ("hdet_range_test", "hdet_range_test_revised")
FORM_VARIANTS = (*HDET_VARIANTS, *RANGE_TEST_VARIANTS)
CONTROLLER_VARIANTS = ("hdet_explore", "hdet_effect_fixed", "hdet_aimd", "hdet_rprop")
# Schedule-Free's dense LR is constant after its warm-up where the preset's schedule decays to ~0: its
# dense LR area against that schedule says nothing of the LR it settles on; not reported.
NO_LR_AREA = ("schedulefree",)
LABELS = {"plain_rollback": "plain + rollback", "hdet": "HDET default (anneal-then-probe, effect controller)",
          "prodigy": "Prodigy (dense, d0 1e-6)",
          "schedulefree": "Schedule-Free AdamW (dense)",
          "lr_finder": "LR finder (two 100-step sweeps, x0.001-x10000) + plain",
          "lr_finder_narrow": "LR finder, narrow (retired: x0.01-x100) + plain",
          "hdet_range_test": "HDET range test on the replicas (100-step sweep, x0.001-x10000)",
          "hdet_range_test_revised": "HDET range test, revised rule (bottom centre / 65, / 42)",
          "hdet_explore": "HDET explore-then-commit (2 rounds of 125 steps)",
          "hdet_effect_fixed": "HDET effect controller, per-sync fit reset at 30%",
          "hdet_aimd": "HDET AIMD (x1.1 up, x0.5 on harm), per-sync fit", "hdet_rprop": "HDET Rprop step, per-sync fit"}


def variant_overrides(variant: str, embedding: float, dense: float) -> List[str]:
    v = VARIANTS[variant]
    return v(embedding, dense) if callable(v) else [*lr_overrides(embedding, dense), *v]
