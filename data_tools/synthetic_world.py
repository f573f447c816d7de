"""The synthetic generator's world, drawn once from the main random stream before the first day: the
users (Zipf activity, active degree, flags, follower / fan / friend counts and their KuaiRand
``*_range`` buckets, latent factors), the videos (Zipf popularity, author, music, tags, ad flag, upload
type and age, duration, shape, latent factors) and the true model over them: per-task biases of users,
items, authors and music, the task weights on the latent dimensions, and the categorical, context and
dense effects on each task's logit. :mod:`data_tools.synthetic_day` simulates the days in it;
:mod:`data_tools.synthetic_files` writes its users and videos."""

from __future__ import annotations

import math

import numpy as np

from data_tools.schema import TASKS
from data_tools.synthetic_config import GeneratorConfig

# KuaiRand-like bucket strings; value v falls in bucket i where edges[i-1] < v <= edges[i].
RANGES = {
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
ACTIVE = np.array(["full_active", "high_active", "middle_active", "UNKNOWN"], dtype=object)
UPLOAD_TYPES = np.array(["ShortImport", "Web", "Kmovie", "FollowShoot", "ShortCamera",
                         "PhotoCopy"], dtype=object)
MAX_TAGS = 4
CHUNK_ROWS = 1 << 18  # rows per piece where a per-row computation is done in pieces (same values)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _zipf_probs(rng, n, a):
    w = (np.arange(1, n + 1, dtype=np.float64)) ** (-a)
    w = w[rng.permutation(n)]  # popularity independent of the id
    return w / w.sum()


def _bucket(values, edges, labels):
    idx = np.searchsorted(np.asarray(edges), values, side="left")
    return np.asarray(labels, dtype=object)[idx], idx


def _tag_mean(table: np.ndarray, tags: np.ndarray, mask: np.ndarray, ntag: np.ndarray,
              out: np.ndarray) -> None:
    """``out += (table[tags] * mask[..., None]).sum(1) / ntag``, in pieces of rows: the same values
    without the (videos, tags, columns) temporaries of the whole catalog at once."""
    for i in range(0, len(tags), CHUNK_ROWS):
        s = slice(i, i + CHUNK_ROWS)
        out[s] += (table[tags[s]] * mask[s, :, None]).sum(1) / ntag[s]


def build_world(cfg: GeneratorConfig, rng: np.random.Generator) -> dict:
    """The world as a dict of arrays, indexed by user id, video id, author id and so on. Task columns
    (``K`` = 5 of them): like, long_dwell, comment, forward, follow (contribution combines the last
    three); ``V0`` is the items' own factors on the first day (they drift daily), ``V_static`` their
    author's and tags' share.

    Memory per video (the catalog dominates at KuaiRand-27K's 32M videos): the float64 factors and
    biases (V0, V_static 8 x latent_dim bytes each, item_bias 40, item_p 8) and the integer columns kept
    in the narrowest dtype that gives the same values in every use (ids int32, flags and small codes int8,
    shape int16; ``age0`` int32 since ``log1p`` of an int16 would be float32): 219 bytes at latent_dim
    8. The per-row tag means are computed in pieces (:func:`_tag_mean`)."""
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
    for k, (edges, labels) in RANGES.items():
        w["ranges"][k], w["range_idx"][k] = _bucket(w["counts"][k], edges, labels)
    w["U"] = rng.normal(0.0, 1.0, (nU, d))
    w["user_bias"] = rng.normal(0.0, 0.8, (nU, K))
    # videos
    w["item_p"] = _zipf_probs(rng, nV, cfg.item_zipf)
    w["author"] = rng.choice(nA, nV, p=_zipf_probs(rng, nA, 1.0)).astype(np.int32)
    w["music"] = rng.choice(cfg.n_music, nV, p=_zipf_probs(rng, cfg.n_music, 1.0)).astype(np.int32)
    w["music_type"] = rng.choice(np.array([4, 8, 9, 11]), nV, p=[0.1, 0.6, 0.2, 0.1]).astype(np.int8)
    w["is_ad"] = (rng.random(nV) < 0.1).astype(np.int8)
    w["upload_type"] = rng.choice(len(UPLOAD_TYPES), nV, p=[0.35, 0.1, 0.1, 0.1, 0.3, 0.05]).astype(np.int8)
    w["age0"] = np.minimum(rng.exponential(30.0, nV), 365).astype(np.int32)  # days before start
    dur = np.clip(rng.lognormal(math.log(15.0), 0.8, nV), 2.0, 600.0)
    w["duration_ms"] = np.round(dur * 1000.0).astype(np.int32)  # <= 600000
    del dur
    shape = rng.choice(4, nV, p=[0.7, 0.15, 0.1, 0.05])
    w["width"] = np.array([720, 1280, 1080, 0], dtype=np.int16)[shape]
    w["height"] = np.array([1280, 720, 1080, 0], dtype=np.int16)[shape]
    del shape
    # 1-4 tags per video, Zipf over tag ids, deduplicated
    n_tags = rng.choice(np.arange(1, MAX_TAGS + 1), nV, p=[0.4, 0.3, 0.2, 0.1])
    tags = rng.choice(nT, (nV, MAX_TAGS), p=_zipf_probs(rng, nT, cfg.tag_zipf)).astype(np.int32)
    tags = np.sort(tags, axis=1)
    mask = np.arange(MAX_TAGS)[None, :] < n_tags[:, None]
    del n_tags
    # keep the first n_tags of a random order, then dedupe
    perm = np.argsort(rng.random((nV, MAX_TAGS)), axis=1)
    tags = np.take_along_axis(tags, perm, axis=1)
    del perm
    tags = np.where(mask, tags, nT)  # nT = padding
    tags = np.sort(tags, axis=1)
    dup = np.zeros_like(mask)
    dup[:, 1:] = tags[:, 1:] == tags[:, :-1]
    mask = (tags < nT) & ~dup
    del dup
    w["tags"], w["tag_mask"] = tags, mask
    # item vector = small item-specific part (drifts daily) + author + mean of its tags, so most
    # of the interaction signal is shared across videos and learnable from few impressions
    V = rng.normal(0.0, 0.25, (nV, d))
    A = rng.normal(0.0, 0.55, (nA, d))
    T = np.vstack([rng.normal(0.0, 0.6, (nT, d)), np.zeros((1, d))])
    ntag = np.maximum(mask.sum(1), 1)[:, None]
    w["V_static"] = A[w["author"]]  # + the mean of its tags' vectors
    _tag_mean(T, tags, mask, ntag, w["V_static"])
    w["V0"] = V
    tag_bias = np.vstack([rng.normal(0.0, 0.4, (nT, K)), np.zeros((1, K))])
    logpop = np.log(w["item_p"])
    popz = (logpop - logpop.mean()) / (logpop.std() + 1e-9)
    del logpop
    w["item_bias"] = rng.normal(0.0, 0.3, (nV, K))
    w["item_bias"] += 0.25 * popz[:, None]
    _tag_mean(tag_bias, tags, mask, ntag, w["item_bias"])  # + the mean of its tags' biases
    del popz, ntag
    w["author_bias"] = rng.normal(0.0, 0.5, (nA, K))
    w["music_bias"] = rng.normal(0.0, 0.15, (cfg.n_music, K))
    # task weights on the latent dims (tasks differ but share structure)
    g = np.abs(rng.normal(1.0, 0.5, (K, d))) * np.where(rng.random((K, d)) < 0.2, -1.0, 1.0)
    w["g"] = g / math.sqrt(d)
    # categorical and context effects, per task column (order: like, long, comment, fwd, follow)
    w["eff_active"] = rng.normal(0.0, 0.3, (4, K)) + np.array([0.6, 0.25, -0.1, -0.7])[:, None]
    w["eff_range"] = {k: np.sort(rng.normal(0.0, 0.3, (len(v[1]), K)), axis=0) * rng.choice([-1, 1], K)
                      for k, v in RANGES.items()}
    w["eff_upload"] = rng.normal(0.0, 0.3, (len(UPLOAD_TYPES), K))
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
