"""The LR range test's schedule: the learning-rate multiplier at each step of a sweep (geometric from ``low`` to
``high``), and the check of a sweep's length and range. Used by the plain run's range-test schedule
(:mod:`recsys_hdet.components.lr_scheduler`, what ``python -m recsys_hdet.lr_find`` trains) and by the range test
on HDET's replicas; how a sweep's curve is read is :mod:`recsys_hdet.hdet.range_test.rule`'s.
"""

from __future__ import annotations


def check_sweep(key: str, steps: int, low: float, high: float) -> None:
    """A sweep's length and range as a range test needs them (ValueError naming ``key``, the config's group)."""
    if steps < 2:
        raise ValueError(f"{key}.steps={steps}: must be >= 2")
    if not 0 < low < high:
        raise ValueError(f"{key}: low={low}, high={high}: need 0 < low < high")


def sweep_multiplier(step: int, low: float, high: float, sweep_steps: int) -> float:
    """The LR multiplier a sweep trains step ``step`` (0-based) at: ``low`` to ``high`` geometrically over
    ``sweep_steps`` steps, held at ``high`` after."""
    pct = min(max(step, 0), sweep_steps - 1) / (sweep_steps - 1)
    return low * (high / low) ** pct
