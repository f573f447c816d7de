"""Synthetic KuaiRand-schema generator with a known ground truth (:func:`generate`).

Writes into ``out_dir`` (:mod:`data_tools.synthetic_files` names and writes them):
- ``log_synthetic.csv``: every KuaiRand log column plus ``oracle_<task>`` (the true probabilities)
- ``user_features_synthetic.csv``, ``video_features_basic_synthetic.csv``
- ``oracle.json``: ``{"YYYYMMDD": {task: {"logloss", "ne", "positive_rate"}}}``, the log loss of
  the true probabilities on the realized labels (the Bayes floor) per day and task
- ``generator_config.json``: the config used (:class:`~data_tools.synthetic_config.GeneratorConfig`)

Ground truth (all numpy, one ``np.random.Generator`` seeded by ``config.seed``, consumed by the world
first (:mod:`data_tools.synthetic_world`), then day by day (:mod:`data_tools.synthetic_day`), so the
first N days are the same whatever ``days`` is; the users' unused ``onehot_feat*`` columns come from a
second stream seeded by ``(seed, 1)``):
Zipf user activity and item popularity; user / item / author / tag latent factors whose
task-weighted dot products drive the logits; categorical side effects (active degree, the
``*_range`` buckets, video type, upload type, tab, hour); dense effects (duration, video age,
aspect ratio, flags); per-day drift of item factors and task biases; contribution =
1 - prod(1 - p_k) over independent comment / forward / follow components. Task biases are
calibrated by bisection on day 0 to the target positive rates.

Its command is :mod:`data_tools.generate` (``python -m data_tools.generate``), a module of its own
because its ``append=true`` goes through :mod:`data_tools.prepare`, which builds on this one.
"""

from __future__ import annotations

import os
import time

import numpy as np

from data_tools.errors import DataError
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_day import DaySimulation
from data_tools.synthetic_files import (CONFIG_FILE, ORACLE_FILE, LogWriter, write_json, write_users,
                                        write_videos)
from data_tools.synthetic_world import build_world


def generate(config: GeneratorConfig | dict | None = None, out_dir: str = ".", *,
             verbose: bool = False, from_day: int = 0) -> dict:
    """Write the synthetic raw data set into ``out_dir``; return the oracle dict.

    Prefix-stable in ``days``: the first N days (log rows and oracle) and the user and video files
    are the same whatever ``days`` is (only generator_config.json differs), so a data set can grow by
    generating with more days (``data_tools.prepare.append_synthetic_days``). ``from_day``: days
    before it are skipped (:meth:`~data_tools.synthetic_day.DaySimulation.skip_day`: their draws made
    and thrown away, not simulated) and left out of the log and the oracle; the user and video files
    are written in full.

    Streams: each day is appended to the log as it is simulated and then dropped, so memory is the
    world plus one day (the world's bytes per video: :func:`~data_tools.synthetic_world.build_world`);
    the files are byte for byte those of simulating every day first."""
    cfg = config if isinstance(config, GeneratorConfig) else GeneratorConfig.from_dict(config)
    if isinstance(from_day, bool) or not isinstance(from_day, int) or not 0 <= from_day < cfg.days:
        raise DataError(f"generate: from_day must be an int in [0, days={cfg.days}), got {from_day!r}")
    t0 = time.time()
    rng = np.random.default_rng(cfg.seed)
    world = build_world(cfg, rng)
    simulation = DaySimulation(cfg, world, rng)
    for _ in range(from_day):
        simulation.skip_day()
    os.makedirs(out_dir, exist_ok=True)
    oracle = {}
    with LogWriter(out_dir) as log:
        for _ in range(from_day, cfg.days):
            date, day_log, oracle[date] = simulation.next_day()
            log.write_day(day_log)
            del day_log
    del simulation  # its item factors
    write_users(cfg, world, out_dir)
    write_videos(cfg, world, out_dir)
    write_json(oracle, os.path.join(out_dir, ORACLE_FILE))
    write_json(cfg.to_dict(), os.path.join(out_dir, CONFIG_FILE))
    if verbose:
        n = cfg.impressions_per_day
        print(f"generated {(cfg.days - from_day) * n} impressions into {out_dir} in {time.time() - t0:.1f}s")
    return oracle
