"""Synthetic KuaiRand-schema generator with a known ground truth.

Writes into ``out_dir``:
- ``log_synthetic.csv``: every KuaiRand log column plus ``oracle_<task>`` (the true probabilities)
- ``user_features_synthetic.csv``, ``video_features_basic_synthetic.csv``
- ``oracle.json``: ``{"YYYYMMDD": {task: {"logloss", "ne", "positive_rate"}}}``, the log loss of
  the true probabilities on the realized labels (the Bayes floor) per day and task
- ``generator_config.json``: the config used

Ground truth (all numpy, one ``np.random.Generator`` seeded by ``config.seed``, consumed day by
day, so the first N days are the same whatever ``days`` is; the users' unused ``onehot_feat*``
columns come from a second stream seeded by ``(seed, 1)``):
Zipf user activity and item popularity; user / item / author / tag latent factors whose
task-weighted dot products drive the logits; categorical side effects (active degree, the
``*_range`` buckets, video type, upload type, tab, hour); dense effects (duration, video age,
aspect ratio, flags); per-day drift of item factors and task biases; contribution =
1 - prod(1 - p_k) over independent comment / forward / follow components. Task biases are
calibrated by bisection on day 0 to the target positive rates.

Its command is :mod:`data_tools.generate` (``python -m data_tools.generate``), a module of its own
because its ``--append-to`` goes through :mod:`data_tools.prepare`, which builds on this one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from data_tools.contract import RAND_COLUMN, oracle_column
from data_tools.errors import DataError
from data_tools.schema import LOG_COLUMNS, START_DATE, TASKS, USER_COLUMNS, VIDEO_COLUMNS

LOG_FILE = "log_synthetic.csv"
USER_FILE = "user_features_synthetic.csv"
VIDEO_FILE = "video_features_basic_synthetic.csv"
ORACLE_FILE = "oracle.json"
CONFIG_FILE = "generator_config.json"

P_CLIP = 1e-6  # true probabilities are clipped to [P_CLIP, 1 - P_CLIP]


@dataclass(frozen=True)
class GeneratorConfig:
    seed: int = 0
    n_users: int = 5000
    n_videos: int = 20000
    n_authors: int = 3000
    n_music: int = 2000
    n_tags: int = 500
    days: int = 5
    impressions_per_day: int = 60000
    latent_dim: int = 8
    start_date: int = START_DATE
    user_zipf: float = 1.0  # exponent of user activity skew
    item_zipf: float = 1.1  # exponent of item popularity skew
    tag_zipf: float = 1.0
    drift: float = 0.05  # per-day drift scale of item factors and task biases
    signal_scale: float = 1.0  # multiplies every non-bias logit term
    rand_fraction: float = 0.05  # share of impressions with a uniformly random video (is_rand=1)
    target_contribution: float = 0.01
    target_like: float = 0.03
    target_long_dwell: float = 0.30

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
            dt.datetime.strptime(str(self.start_date), "%Y%m%d")
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


# ---- helpers --------------------------------------------------------------------------------
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _zipf_probs(rng, n, a):
    w = (np.arange(1, n + 1, dtype=np.float64)) ** (-a)
    w = w[rng.permutation(n)]  # popularity independent of the id
    return w / w.sum()


def _bucket(values, edges, labels):
    idx = np.searchsorted(np.asarray(edges), values, side="left")
    return np.asarray(labels, dtype=object)[idx], idx


# KuaiRand-like bucket strings; value v falls in bucket i where edges[i-1] < v <= edges[i].
_RANGES = {
    "follow_user_num": ([0, 10, 50, 100, 150, 250, 500],
                        ["0", "(0,10]", "(10,50]", "(50,100]", "(100,150]", "(150,250]",
                         "(250,500]", "500+"]),
    "fans_user_num": ([0, 9, 99, 999, 4999, 9999],
                      ["0", "[1,10)", "[10,100)", "[100,1k)", "[1k,5k)", "[5k,1w)", "[1w,10w)"]),
    "friend_user_num": ([0, 4, 29, 59, 119, 249],
                        ["0", "[1,5)", "[5,30)", "[30,60)", "[60,120)", "[120,250)", "250+"]),
    "register_days": ([30, 60, 90, 180, 365, 730],
                      ["15-30", "31-60", "61-90", "91-180", "181-365", "366-730", "730+"]),
}
_ACTIVE = np.array(["full_active", "high_active", "middle_active", "UNKNOWN"], dtype=object)
_UPLOAD_TYPES = np.array(["ShortImport", "Web", "Kmovie", "FollowShoot", "ShortCamera",
                          "PhotoCopy"], dtype=object)
_MAX_TAGS = 4


def _bisect_bias(rest, target, combine=None, lo=-25.0, hi=15.0, iters=60):
    """Find b with mean(p(b)) == target; p is monotone increasing in b."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        p = combine(mid) if combine is not None else _sigmoid(mid + rest)
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


# ---- generator --------------------------------------------------------------------------------
def _build_world(cfg: GeneratorConfig, rng: np.random.Generator) -> dict:
    d = cfg.latent_dim
    nU, nV, nA, nT = cfg.n_users, cfg.n_videos, cfg.n_authors, cfg.n_tags
    K = len(TASKS) + 2  # like, long_dwell, comment, forward, follow get own effect draws
    w = {}
    # users
    w["user_p"] = _zipf_probs(rng, nU, cfg.user_zipf)
    rank = np.empty(nU, dtype=np.int64)
    rank[np.argsort(-w["user_p"])] = np.arange(nU)
    q = rank / max(nU - 1, 1)
    active = np.where(q < 0.2, 0, np.where(q < 0.5, 1, np.where(q < 0.9, 2, 3)))
    unknown = rng.random(nU) < 0.05
    active[unknown] = 3
    w["active"] = active
    w["lowactive"] = (rng.random(nU) < 0.06).astype(np.int64)
    w["live"] = (rng.random(nU) < 0.04).astype(np.int64)
    w["author_flag"] = (rng.random(nU) < 0.3).astype(np.int64)
    counts = {
        "follow_user_num": np.floor(rng.lognormal(3.3, 1.3, nU)) * (rng.random(nU) > 0.05),
        "fans_user_num": np.floor(rng.lognormal(1.5, 2.0, nU)) * (rng.random(nU) > 0.2),
        "friend_user_num": np.floor(rng.lognormal(1.2, 1.3, nU)) * (rng.random(nU) > 0.3),
        "register_days": rng.integers(15, 2500, nU).astype(np.float64),
    }
    w["counts"] = {k: v.astype(np.int64) for k, v in counts.items()}
    w["ranges"], w["range_idx"] = {}, {}
    for k, (edges, labels) in _RANGES.items():
        w["ranges"][k], w["range_idx"][k] = _bucket(w["counts"][k], edges, labels)
    w["U"] = rng.normal(0.0, 1.0, (nU, d))
    w["user_bias"] = rng.normal(0.0, 0.8, (nU, K))
    # videos
    w["item_p"] = _zipf_probs(rng, nV, cfg.item_zipf)
    w["author"] = rng.choice(nA, nV, p=_zipf_probs(rng, nA, 1.0))
    w["music"] = rng.choice(cfg.n_music, nV, p=_zipf_probs(rng, cfg.n_music, 1.0))
    w["music_type"] = rng.choice(np.array([4, 8, 9, 11]), nV, p=[0.1, 0.6, 0.2, 0.1])
    w["is_ad"] = (rng.random(nV) < 0.1).astype(np.int64)
    w["upload_type"] = rng.choice(len(_UPLOAD_TYPES), nV, p=[0.35, 0.1, 0.1, 0.1, 0.3, 0.05])
    w["age0"] = np.minimum(rng.exponential(30.0, nV), 365).astype(np.int64)  # days before start
    dur = np.clip(rng.lognormal(math.log(15.0), 0.8, nV), 2.0, 600.0)
    w["duration_ms"] = np.round(dur * 1000.0).astype(np.int64)
    shape = rng.choice(4, nV, p=[0.7, 0.15, 0.1, 0.05])
    w["width"] = np.array([720, 1280, 1080, 0])[shape]
    w["height"] = np.array([1280, 720, 1080, 0])[shape]
    # 1-4 tags per video, Zipf over tag ids, deduplicated
    n_tags = rng.choice(np.arange(1, _MAX_TAGS + 1), nV, p=[0.4, 0.3, 0.2, 0.1])
    tags = rng.choice(nT, (nV, _MAX_TAGS), p=_zipf_probs(rng, nT, cfg.tag_zipf))
    tags = np.sort(tags, axis=1)
    mask = np.arange(_MAX_TAGS)[None, :] < n_tags[:, None]
    # keep the first n_tags of a random order, then dedupe
    perm = np.argsort(rng.random((nV, _MAX_TAGS)), axis=1)
    tags = np.take_along_axis(tags, perm, axis=1)
    tags = np.where(mask, tags, nT)  # nT = padding
    tags = np.sort(tags, axis=1)
    dup = np.zeros_like(mask)
    dup[:, 1:] = tags[:, 1:] == tags[:, :-1]
    mask = (tags < nT) & ~dup
    w["tags"], w["tag_mask"] = tags, mask
    # item vector = small item-specific part (drifts daily) + author + mean of its tags, so most
    # of the interaction signal is shared across videos and learnable from few impressions
    V = rng.normal(0.0, 0.25, (nV, d))
    A = rng.normal(0.0, 0.55, (nA, d))
    T = np.vstack([rng.normal(0.0, 0.6, (nT, d)), np.zeros((1, d))])
    ntag = np.maximum(mask.sum(1), 1)[:, None]
    tag_vec = (T[tags] * mask[..., None]).sum(1) / ntag
    w["V_static"] = A[w["author"]] + tag_vec
    w["V0"] = V
    tag_bias = np.vstack([rng.normal(0.0, 0.4, (nT, K)), np.zeros((1, K))])
    logpop = np.log(w["item_p"])
    popz = (logpop - logpop.mean()) / (logpop.std() + 1e-9)
    w["item_bias"] = (rng.normal(0.0, 0.3, (nV, K)) + 0.25 * popz[:, None]
                      + (tag_bias[tags] * mask[..., None]).sum(1) / ntag)
    w["author_bias"] = rng.normal(0.0, 0.5, (nA, K))
    w["music_bias"] = rng.normal(0.0, 0.15, (cfg.n_music, K))
    # task weights on the latent dims (tasks differ but share structure)
    g = np.abs(rng.normal(1.0, 0.5, (K, d))) * np.where(rng.random((K, d)) < 0.2, -1.0, 1.0)
    w["g"] = g / math.sqrt(d)
    # categorical and context effects, per task column (order: like, long, comment, fwd, follow)
    w["eff_active"] = rng.normal(0.0, 0.3, (4, K)) + np.array([0.6, 0.25, -0.1, -0.7])[:, None]
    w["eff_range"] = {k: np.sort(rng.normal(0.0, 0.3, (len(v[1]), K)), axis=0) * rng.choice([-1, 1], K)
                      for k, v in _RANGES.items()}
    w["eff_upload"] = rng.normal(0.0, 0.3, (len(_UPLOAD_TYPES), K))
    w["eff_ad"] = np.array([-1.2, -0.5, -1.0, -0.8, -1.2])
    w["eff_tab"] = rng.normal(0.0, 0.55, (15, K))
    w["tab_p"] = _zipf_probs(rng, 15, 1.2)
    w["hour_phase"] = rng.uniform(0, 2 * math.pi, K)
    w["eff_lowactive"] = np.array([-0.3, -0.2, -0.3, -0.2, -0.2])
    w["eff_live"] = np.array([0.2, -0.1, 0.6, 0.4, 0.4])
    w["eff_authorflag"] = np.array([0.2, 0.0, 0.5, 0.3, 0.7])
    w["eff_logdur"] = np.array([0.1, -0.8, 0.05, 0.0, 0.0])  # long_dwell falls with duration
    w["eff_logage"] = np.array([-0.15, -0.05, -0.1, -0.1, -0.05])
    w["eff_landscape"] = np.array([-0.1, -0.3, 0.0, 0.0, 0.0])
    w["comp_offset"] = np.array([0.0, -0.6, -1.0])  # comment, forward, follow
    return w


def _diurnal(rng, n):
    hours = np.arange(24)
    w = 0.3 + np.exp(-0.5 * ((hours - 21) / 3.0) ** 2) + 0.6 * np.exp(-0.5 * ((hours - 12.5) / 2.0) ** 2)
    w[1:7] *= 0.25
    return rng.choice(24, n, p=w / w.sum())


def generate(config: GeneratorConfig | dict | None = None, out_dir: str = ".", *,
             verbose: bool = False, from_day: int = 0) -> dict:
    """Write the synthetic raw data set into ``out_dir``; return the oracle dict.

    Prefix-stable in ``days``: the first N days (log rows and oracle) and the user and video files
    are the same whatever ``days`` is (only generator_config.json differs), so a data set can grow by
    generating with more days (``data_tools.prepare.append_synthetic_days``). ``from_day``: days
    before it are simulated (the random stream is consumed exactly as in a full run) but left out
    of the log and the oracle; the user and video files are written in full."""
    cfg = config if isinstance(config, GeneratorConfig) else GeneratorConfig.from_dict(config)
    if isinstance(from_day, bool) or not isinstance(from_day, int) or not 0 <= from_day < cfg.days:
        raise DataError(f"generate: from_day must be an int in [0, days={cfg.days}), got {from_day!r}")
    t0 = time.time()
    rng = np.random.default_rng(cfg.seed)
    w = _build_world(cfg, rng)
    s = cfg.signal_scale
    n = cfg.impressions_per_day
    start = dt.datetime.strptime(str(cfg.start_date), "%Y%m%d").date()
    epoch0 = dt.datetime(start.year, start.month, start.day, tzinfo=dt.timezone.utc)

    V = w["V0"].copy()
    bias_drift = np.zeros(5)
    biases = None
    logs, oracle = [], {}
    for day in range(cfg.days):
        date = start + dt.timedelta(days=day)
        date_int = int(date.strftime("%Y%m%d"))
        if day > 0:
            V = V + rng.normal(0.0, cfg.drift * 0.6, V.shape)
            bias_drift = bias_drift + rng.normal(0.0, cfg.drift, 5)
        # impressions
        u = rng.choice(cfg.n_users, n, p=w["user_p"])
        is_rand = rng.random(n) < cfg.rand_fraction
        v = np.where(is_rand, rng.integers(0, cfg.n_videos, n),
                     rng.choice(cfg.n_videos, n, p=w["item_p"]))
        tab = rng.choice(15, n, p=w["tab_p"])
        hour = _diurnal(rng, n)
        ms_of_day = (hour * 3600 + rng.integers(0, 3600, n)) * 1000 + rng.integers(0, 1000, n)
        order = np.argsort(ms_of_day, kind="stable")
        u, v, is_rand, tab, ms_of_day = (x[order] for x in (u, v, is_rand, tab, ms_of_day))
        # strictly increasing time_ms within the day, still inside the day
        ms_of_day = np.minimum(ms_of_day, 86_400_000 - n - 1)
        ms_of_day = np.maximum.accumulate(ms_of_day - np.arange(n)) + np.arange(n)
        hour = ms_of_day // 3_600_000
        hourmin = (ms_of_day // 3_600_000) * 100 + (ms_of_day // 60_000) % 60
        time_ms = int(epoch0.timestamp() * 1000) + day * 86_400_000 + ms_of_day

        # logits (columns: like, long_dwell, comment, forward, follow)
        item_vec = V[v] + w["V_static"][v]
        uv = w["U"][u] * item_vec  # (n, d)
        rest = uv @ w["g"].T  # (n, 5)
        a = w["author"][v]
        rest += w["user_bias"][u] + w["item_bias"][v] + w["author_bias"][a] + w["music_bias"][w["music"][v]]
        rest += w["eff_active"][w["active"][u]]
        for k in _RANGES:
            rest += w["eff_range"][k][w["range_idx"][k][u]]
        rest += w["eff_upload"][w["upload_type"][v]]
        rest += w["is_ad"][v][:, None] * w["eff_ad"]
        rest += w["eff_tab"][tab]
        rest += 0.3 * np.sin(2 * math.pi * hour[:, None] / 24.0 + w["hour_phase"])
        rest += w["lowactive"][u][:, None] * w["eff_lowactive"]
        rest += w["live"][u][:, None] * w["eff_live"]
        rest += w["author_flag"][u][:, None] * w["eff_authorflag"]
        rest += (np.log(w["duration_ms"][v] / 15000.0))[:, None] * w["eff_logdur"]
        rest += np.log1p(w["age0"][v] + day)[:, None] * w["eff_logage"]
        rest += (w["width"][v] > w["height"][v])[:, None] * w["eff_landscape"]
        rest *= s

        if biases is None:  # calibrate on day 0
            b_like = _bisect_bias(rest[:, 0], cfg.target_like)
            b_long = _bisect_bias(rest[:, 1], cfg.target_long_dwell)
            off = w["comp_offset"]

            def contrib_p(b, rest=rest):
                pk = _sigmoid(b + off + rest[:, 2:5])
                return 1.0 - np.prod(1.0 - pk, axis=1)

            b_con = _bisect_bias(None, cfg.target_contribution, combine=contrib_p)
            biases = np.array([b_like, b_long, b_con, b_con, b_con]) + np.r_[0, 0, off]
        logit = rest + biases + bias_drift
        p = np.clip(_sigmoid(logit), P_CLIP, 1 - P_CLIP)
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
        oracle[str(date_int)] = {}
        for t in TASKS:
            yt = labels[t].astype(np.float64)
            pt = probs[t].astype(np.float64)
            rate = float(yt.mean())
            ll = _logloss(yt, pt)
            h = _entropy(rate)
            oracle[str(date_int)][t] = {"logloss": ll, "ne": (ll / h) if h > 0 else None,
                                        "positive_rate": rate}

        # other post-impression outcomes (consistent with the labels, never features)
        dur = w["duration_ms"][v]
        is_click = ((rng.random(n) < 0.25 + 0.6 * p[:, 1]) | (y.sum(1) > 0)).astype(np.int64)
        frac = np.where(long_view == 1, rng.uniform(0.9, 2.5, n), rng.uniform(0.0, 0.9, n))
        play = np.round(dur * frac).astype(np.int64)
        is_profile_enter = ((rng.random(n) < 0.02) | (is_follow == 1)).astype(np.int64)
        day_log = pl.DataFrame({
            "user_id": u.astype(np.int64),
            "video_id": v.astype(np.int64),
            "date": np.full(n, date_int, dtype=np.int64),
            "hourmin": hourmin.astype(np.int64),
            "time_ms": time_ms.astype(np.int64),
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
            RAND_COLUMN: is_rand.astype(np.int64),
            "tab": tab.astype(np.int64),
            **{oracle_column(t): probs[t] for t in TASKS},
        })
        if day < from_day:
            del oracle[str(date_int)]
        else:
            logs.append(day_log)

    os.makedirs(out_dir, exist_ok=True)
    log = pl.concat(logs)
    assert set(LOG_COLUMNS) <= set(log.columns)
    log.write_csv(os.path.join(out_dir, LOG_FILE))

    users = {"user_id": np.arange(cfg.n_users, dtype=np.int64),
             "user_active_degree": _ACTIVE[w["active"]],
             "is_lowactive_period": w["lowactive"],
             "is_live_streamer": w["live"],
             "is_video_author": w["author_flag"]}
    for k in _RANGES:
        users[k] = w["counts"][k]
        users[f"{k}_range"] = w["ranges"][k]
    # A stream of their own (not the main one after the day loop), so that the user file does not
    # depend on the number of days.
    onehot_rng = np.random.default_rng([cfg.seed, 1])
    for i in range(18):
        users[f"onehot_feat{i}"] = onehot_rng.integers(0, 2 if i == 0 else 8 + 4 * i, cfg.n_users)
    udf = pl.DataFrame({c: users[c] for c in USER_COLUMNS},
                       schema_overrides={c: USER_COLUMNS[c] for c in USER_COLUMNS})
    udf.write_csv(os.path.join(out_dir, USER_FILE))

    upload = np.array([start - dt.timedelta(days=int(x)) for x in range(0, 366)], dtype="datetime64[D]")
    vdf = pl.DataFrame({
        "video_id": np.arange(cfg.n_videos, dtype=np.int64),
        "author_id": w["author"].astype(np.int64),
        "video_type": np.where(w["is_ad"] == 1, "AD", "NORMAL"),
        "upload_dt": upload[w["age0"]],
        "upload_type": _UPLOAD_TYPES[w["upload_type"]],
        "visible_status": np.full(cfg.n_videos, "public"),
        "video_duration": w["duration_ms"].astype(np.float64),
        "server_width": w["width"].astype(np.float64),
        "server_height": w["height"].astype(np.float64),
        "music_id": w["music"].astype(np.int64),
        "music_type": w["music_type"].astype(np.float64),
    }).with_columns(pl.col("upload_dt").dt.strftime("%Y-%m-%d"))
    tags, mask = w["tags"], w["tag_mask"]
    tdf = pl.DataFrame({"row": np.repeat(np.arange(cfg.n_videos), _MAX_TAGS),
                        "t": tags.reshape(-1), "m": mask.reshape(-1)}).filter(pl.col("m"))
    tag_lists = (tdf.group_by("row", maintain_order=True)
                 .agg(pl.col("t").cast(pl.String).str.join(",").alias("tag")))
    vdf = (vdf.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
           .join(tag_lists.with_columns(pl.col("row").cast(pl.Int64)), on="row", how="left")
           .drop("row"))
    vdf = vdf.select(list(VIDEO_COLUMNS))
    vdf.write_csv(os.path.join(out_dir, VIDEO_FILE))

    with open(os.path.join(out_dir, ORACLE_FILE), "w") as f:
        json.dump(oracle, f, indent=1)
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(cfg.to_dict(), f, indent=1)
    if verbose:
        print(f"generated {(cfg.days - from_day) * n} impressions into {out_dir} in {time.time() - t0:.1f}s")
    return oracle
