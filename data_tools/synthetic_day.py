"""The synthetic log, one day at a time (:class:`DaySimulation`), from the main random stream after the
world (:mod:`data_tools.synthetic_world`): each day's drift of the item factors and task biases, its
impressions (user by activity, video by popularity or uniformly at random for ``is_rand``, tab, time of
day), their true probabilities and realized labels, the other post-impression outcomes, and the
oracle's entry for the day (the log loss of the true probabilities on the realized labels). The task
biases are calibrated by bisection on day 0 to the config's target positive rates. A day can be skipped
(:meth:`DaySimulation.skip_day`): its draws are made and thrown away, nothing else computed, so the days
after it are the ones a full run gives."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import polars as pl

from data_tools.contract import RAND_COLUMN, oracle_column
from data_tools.schema import TASKS
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_world import CHUNK_ROWS, RANGES, sigmoid

P_CLIP = 1e-6  # true probabilities are clipped to [P_CLIP, 1 - P_CLIP]
DAY_MS = 86_400_000


def _diurnal(rng, n):
    hours = np.arange(24)
    w = 0.3 + np.exp(-0.5 * ((hours - 21) / 3.0) ** 2) + 0.6 * np.exp(-0.5 * ((hours - 12.5) / 2.0) ** 2)
    w[1:7] *= 0.25
    return rng.choice(24, n, p=w / w.sum())


def _bisect_bias(rest, target, combine=None, lo=-25.0, hi=15.0, iters=60):
    """Find b with mean(p(b)) == target; p is monotone increasing in b."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        p = combine(mid) if combine is not None else sigmoid(mid + rest)
        if p.mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _logloss(y, p):
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def _entropy(r):
    if r <= 0.0 or r >= 1.0:
        return 0.0
    return float(-(r * math.log(r) + (1 - r) * math.log(1 - r)))


def _oracle(probs: dict, labels: dict) -> dict:
    """One day's oracle entry: per task the log loss of the true probabilities, its normalized entropy
    and the positive rate."""
    out = {}
    for t in TASKS:
        yt = labels[t].astype(np.float64)
        pt = probs[t].astype(np.float64)
        rate = float(yt.mean())
        ll = _logloss(yt, pt)
        h = _entropy(rate)
        out[t] = {"logloss": ll, "ne": (ll / h) if h > 0 else None, "positive_rate": rate}
    return out


class DaySimulation:
    """The days of one world in order (:meth:`next_day`, :meth:`skip_day`), consuming ``rng`` exactly
    as the days come: the state carried from day to day is the items' drifting factors, the drifting
    task biases and the biases calibrated on day 0. It takes the world's ``V0`` out of ``world`` (the
    factors drift in place, so that the catalog's factors are held once)."""

    def __init__(self, cfg: GeneratorConfig, world: dict, rng: np.random.Generator):
        self.cfg, self.w, self.rng = cfg, world, rng
        self.start = cfg.first_date()
        epoch0 = dt.datetime(self.start.year, self.start.month, self.start.day, tzinfo=dt.timezone.utc)
        self.epoch0_ms = int(epoch0.timestamp() * 1000)
        self.day = 0  # the next day to simulate
        self.V = world.pop("V0")
        self.bias_drift = np.zeros(5)
        self.biases = None

    def next_day(self) -> tuple[str, pl.DataFrame, dict]:
        """The next day: its date (``YYYYMMDD``), its log rows (every KuaiRand log column plus the true
        probabilities) and its oracle entry."""
        rng, day = self.rng, self.day
        date = self._start_day()
        imp = self._impressions(day)
        rest = self._logit_rest(imp, day)
        if self.biases is None:  # calibrate on day 0
            self.biases = self._calibrate(rest)
        logit = rest + self.biases + self.bias_drift
        p = np.clip(sigmoid(logit), P_CLIP, 1 - P_CLIP)
        y = (rng.random(p.shape) < p).astype(np.int64)
        p_con = np.clip(1.0 - np.prod(1.0 - p[:, 2:5], axis=1), P_CLIP, 1 - P_CLIP)
        probs = {
            "contribution": p_con.astype(np.float32),
            "like": p[:, 0].astype(np.float32),
            "long_dwell": p[:, 1].astype(np.float32),
        }
        is_like, long_view, is_comment, is_forward, is_follow = y.T
        labels = {
            "contribution": (is_comment | is_forward | is_follow),
            "like": is_like,
            "long_dwell": long_view,
        }
        oracle = _oracle(probs, labels)
        return date, self._log(imp, int(date), p, y, probs), oracle

    def skip_day(self) -> str:
        """Pass the next day without simulating it; return its date. The state it carries on (the drift,
        and on day 0 the calibration, for which day 0's impressions are drawn and scored) is what
        :meth:`next_day` leaves; every other draw of the day is made, with the same sizes and bounds in
        the same order, and thrown away (a ``choice`` with probabilities draws ``random(size)``; the
        bounded ``integers`` must be redrawn, as their rejection sampling takes a varying count), so the
        days after it are bit for bit those of a full run. ``test_synthetic_stream`` holds this to
        :meth:`next_day`."""
        cfg, rng, n, day = self.cfg, self.rng, self.cfg.impressions_per_day, self.day
        date = self._start_day()
        if self.biases is None:  # day 0
            self.biases = self._calibrate(self._logit_rest(self._impressions(day), day))
        else:  # _impressions' draws
            rng.random(n)  # u
            rng.random(n)  # is_rand
            rng.integers(0, cfg.n_videos, n)  # v where is_rand
            rng.random(n)  # v by popularity
            rng.random(n)  # tab
            rng.random(n)  # hour (_diurnal)
            rng.integers(0, 3600, n)
            rng.integers(0, 1000, n)
        rng.random((n, 5))  # the labels
        # _log's draws
        rng.random(n)  # is_click
        rng.uniform(0.9, 2.5, n)
        rng.uniform(0.0, 0.9, n)  # frac
        rng.random(n)  # is_profile_enter
        rng.random(n)  # is_hate
        rng.integers(1000, 60000, n)  # profile_stay_time
        rng.random(n)
        rng.integers(1000, 90000, n)  # comment_stay_time
        return date

    def _start_day(self) -> str:
        """Begin the next day: count it and, after day 0, drift the item factors (in place, in pieces of
        rows: the same values as one draw of the whole array) and the task biases; return its date."""
        cfg, rng, day = self.cfg, self.rng, self.day
        self.day += 1
        if day > 0:
            V, scale = self.V, cfg.drift * 0.6
            for i in range(0, len(V), CHUNK_ROWS):
                V[i:i + CHUNK_ROWS] += rng.normal(0.0, scale, V[i:i + CHUNK_ROWS].shape)
            self.bias_drift = self.bias_drift + rng.normal(0.0, cfg.drift, 5)
        return str(int((self.start + dt.timedelta(days=day)).strftime("%Y%m%d")))

    def _impressions(self, day: int) -> dict:
        """The day's impressions in time order: user, video, is_rand, tab, hour, hourmin, time_ms
        (strictly increasing within the day, still inside the day)."""
        cfg, w, rng, n = self.cfg, self.w, self.rng, self.cfg.impressions_per_day
        u = rng.choice(cfg.n_users, n, p=w["user_p"])
        is_rand = rng.random(n) < cfg.rand_fraction
        v = np.where(is_rand, rng.integers(0, cfg.n_videos, n),
                     rng.choice(cfg.n_videos, n, p=w["item_p"]))
        tab = rng.choice(15, n, p=w["tab_p"])
        hour = _diurnal(rng, n)
        ms_of_day = (hour * 3600 + rng.integers(0, 3600, n)) * 1000 + rng.integers(0, 1000, n)
        order = np.argsort(ms_of_day, kind="stable")
        u, v, is_rand, tab, ms_of_day = (x[order] for x in (u, v, is_rand, tab, ms_of_day))
        ms_of_day = np.minimum(ms_of_day, DAY_MS - n - 1)
        ms_of_day = np.maximum.accumulate(ms_of_day - np.arange(n)) + np.arange(n)
        return {"u": u, "v": v, "is_rand": is_rand, "tab": tab, "hour": ms_of_day // 3_600_000,
                "hourmin": (ms_of_day // 3_600_000) * 100 + (ms_of_day // 60_000) % 60,
                "time_ms": self.epoch0_ms + day * DAY_MS + ms_of_day}

    def _logit_rest(self, imp: dict, day: int) -> np.ndarray:
        """Every logit term but the task biases, (n, 5): columns like, long_dwell, comment, forward, follow."""
        w, u, v = self.w, imp["u"], imp["v"]
        item_vec = self.V[v] + w["V_static"][v]
        uv = w["U"][u] * item_vec  # (n, d)
        rest = uv @ w["g"].T  # (n, 5)
        a = w["author"][v]
        rest += w["user_bias"][u] + w["item_bias"][v] + w["author_bias"][a] + w["music_bias"][w["music"][v]]
        rest += w["eff_active"][w["active"][u]]
        for k in RANGES:
            rest += w["eff_range"][k][w["range_idx"][k][u]]
        rest += w["eff_upload"][w["upload_type"][v]]
        rest += w["is_ad"][v][:, None] * w["eff_ad"]
        rest += w["eff_tab"][imp["tab"]]
        rest += 0.3 * np.sin(2 * math.pi * imp["hour"][:, None] / 24.0 + w["hour_phase"])
        rest += w["lowactive"][u][:, None] * w["eff_lowactive"]
        rest += w["live"][u][:, None] * w["eff_live"]
        rest += w["author_flag"][u][:, None] * w["eff_authorflag"]
        rest += (np.log(w["duration_ms"][v] / 15000.0))[:, None] * w["eff_logdur"]
        rest += np.log1p(w["age0"][v] + day)[:, None] * w["eff_logage"]
        rest += (w["width"][v] > w["height"][v])[:, None] * w["eff_landscape"]
        rest *= self.cfg.signal_scale
        return rest

    def _calibrate(self, rest: np.ndarray) -> np.ndarray:
        """The task biases that give day 0 the target positive rates; contribution's three components
        share one bias (plus their fixed offsets)."""
        cfg, off = self.cfg, self.w["comp_offset"]
        b_like = _bisect_bias(rest[:, 0], cfg.target_like)
        b_long = _bisect_bias(rest[:, 1], cfg.target_long_dwell)

        def contrib_p(b):
            pk = sigmoid(b + off + rest[:, 2:5])
            return 1.0 - np.prod(1.0 - pk, axis=1)

        b_con = _bisect_bias(None, cfg.target_contribution, combine=contrib_p)
        return np.array([b_like, b_long, b_con, b_con, b_con]) + np.r_[0, 0, off]

    def _log(self, imp: dict, date_int: int, p: np.ndarray, y: np.ndarray, probs: dict) -> pl.DataFrame:
        """The day's log rows, with the other post-impression outcomes (consistent with the labels,
        never features)."""
        rng, n = self.rng, self.cfg.impressions_per_day
        is_like, long_view, is_comment, is_forward, is_follow = y.T
        dur = self.w["duration_ms"][imp["v"]]
        is_click = ((rng.random(n) < 0.25 + 0.6 * p[:, 1]) | (y.sum(1) > 0)).astype(np.int64)
        frac = np.where(long_view == 1, rng.uniform(0.9, 2.5, n), rng.uniform(0.0, 0.9, n))
        play = np.round(dur * frac).astype(np.int64)
        is_profile_enter = ((rng.random(n) < 0.02) | (is_follow == 1)).astype(np.int64)
        return pl.DataFrame({
            "user_id": imp["u"].astype(np.int64),
            "video_id": imp["v"].astype(np.int64),
            "date": np.full(n, date_int, dtype=np.int64),
            "hourmin": imp["hourmin"].astype(np.int64),
            "time_ms": imp["time_ms"].astype(np.int64),
            "is_click": is_click,
            "is_like": is_like,
            "is_follow": is_follow,
            "is_comment": is_comment,
            "is_forward": is_forward,
            "is_hate": (rng.random(n) < 0.002).astype(np.int64),
            "long_view": long_view,
            "play_time_ms": play,
            "duration_ms": dur.astype(np.int64),
            "profile_stay_time": is_profile_enter * rng.integers(1000, 60000, n),
            "comment_stay_time": ((is_comment == 1) | (rng.random(n) < 0.03)) * rng.integers(1000, 90000, n),
            "is_profile_enter": is_profile_enter,
            RAND_COLUMN: imp["is_rand"].astype(np.int64),
            "tab": imp["tab"].astype(np.int64),
            **{oracle_column(t): probs[t] for t in TASKS},
        })
