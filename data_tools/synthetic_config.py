"""The synthetic generator's config (:class:`GeneratorConfig`): the world's sizes and skews, the days
and impressions to simulate, the drift, the signal and the target positive rates, each field checked
(a bad one raises :class:`~data_tools.errors.DataError` naming it). :mod:`data_tools.synthetic`
generates from it; ``generator_config.json`` records it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from data_tools.errors import DataError
from data_tools.schema import START_DATE


@dataclass(frozen=True)
class GeneratorConfig:
    seed: int = 0  # seeds the world and every day's impressions
    n_users: int = 5000  # users in the world
    n_videos: int = 20000  # videos in the world
    n_authors: int = 3000  # video authors
    n_music: int = 2000  # music tracks
    n_tags: int = 500  # video tags
    days: int = 5  # days to simulate
    impressions_per_day: int = 60000  # log rows per day
    latent_dim: int = 8  # size of the true user and video factors
    start_date: int = START_DATE  # the first day, YYYYMMDD
    user_zipf: float = 1.0  # exponent of user activity skew
    item_zipf: float = 1.1  # exponent of item popularity skew
    tag_zipf: float = 1.0  # exponent of tag popularity skew
    drift: float = 0.05  # per-day drift scale of item factors and task biases
    signal_scale: float = 1.0  # multiplies every non-bias logit term
    rand_fraction: float = 0.05  # share of impressions with a uniformly random video (is_rand=1)
    target_contribution: float = 0.01  # positive rate of the contribution task (comment, forward, follow)
    target_like: float = 0.03  # positive rate of the like task
    target_long_dwell: float = 0.30  # positive rate of the long-dwell task

    def __post_init__(self):
        ints = ("seed", "n_users", "n_videos", "n_authors", "n_music", "n_tags", "days",
                "impressions_per_day", "latent_dim", "start_date")
        for name in ints:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise DataError(f"GeneratorConfig: field '{name}': must be an int, got {v!r}")
        for name in ints[1:-1]:
            if getattr(self, name) < 1:
                raise DataError(
                    f"GeneratorConfig: field '{name}': must be >= 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise DataError(f"GeneratorConfig: field 'seed': must be >= 0, got {self.seed}")
        try:
            self.first_date()
        except ValueError:
            raise DataError(f"GeneratorConfig: field 'start_date': not a YYYYMMDD date: "
                            f"{self.start_date!r}") from None
        for name in ("user_zipf", "item_zipf", "tag_zipf", "drift", "signal_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise DataError(f"GeneratorConfig: field '{name}': must be a finite number >= 0, "
                                f"got {v!r}")
        if self.impressions_per_day > 10_000_000:
            raise DataError(f"GeneratorConfig: field 'impressions_per_day': must be <= 10000000, "
                            f"got {self.impressions_per_day}")
        for name in ("rand_fraction",):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise DataError(f"GeneratorConfig: field '{name}': must be in [0, 1], got {v!r}")
        for name in ("target_contribution", "target_like", "target_long_dwell"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0.0 < v < 1.0:
                raise DataError(f"GeneratorConfig: field '{name}': must be in (0, 1), got {v!r}")

    def first_date(self) -> dt.date:
        """``start_date`` as a date: the first simulated day (ValueError if not YYYYMMDD)."""
        return dt.datetime.strptime(str(self.start_date), "%Y%m%d").date()

    @classmethod
    def from_dict(cls, d: dict | None) -> "GeneratorConfig":
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DataError(f"GeneratorConfig: field '{unknown[0]}': unknown field "
                            f"(known: {sorted(known)})")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
