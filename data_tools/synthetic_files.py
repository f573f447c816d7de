"""The synthetic raw data set's files, their names and their writing: the log
(:data:`LOG_FILE`, KuaiRand's log columns plus ``oracle_<task>``), the users (:data:`USER_FILE`) and the
videos (:data:`VIDEO_FILE`) of the world (:mod:`data_tools.synthetic_world`), the oracle
(:data:`ORACLE_FILE`) and the config used (:data:`CONFIG_FILE`). The log is written a day at a time
(:class:`LogWriter`) and the videos in pieces of rows, so that neither the days nor the catalog's text are
held whole; the bytes are those of one ``write_csv`` of everything."""

from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import polars as pl

from data_tools.schema import LOG_COLUMNS, USER_COLUMNS, VIDEO_COLUMNS
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_world import ACTIVE, CHUNK_ROWS, MAX_TAGS, RANGES, UPLOAD_TYPES

LOG_FILE = "log_synthetic.csv"
USER_FILE = "user_features_synthetic.csv"
VIDEO_FILE = "video_features_basic_synthetic.csv"
ORACLE_FILE = "oracle.json"
CONFIG_FILE = "generator_config.json"


class LogWriter:
    """The log CSV (:data:`LOG_FILE` in ``out_dir``) written a day at a time (:meth:`write_day`), the
    header with the first: the same bytes as the days concatenated and written at once."""

    def __init__(self, out_dir: str):
        self._f = open(os.path.join(out_dir, LOG_FILE), "wb")
        self._header = True

    def write_day(self, day: pl.DataFrame) -> None:
        assert set(LOG_COLUMNS) <= set(day.columns)
        day.write_csv(self._f, include_header=self._header)
        self._header = False

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_users(cfg: GeneratorConfig, w: dict, out_dir: str) -> None:
    """Every user of the world with KuaiRand's user columns (the ``onehot_feat*`` ones random)."""
    users = {"user_id": np.arange(cfg.n_users, dtype=np.int64),
             "user_active_degree": ACTIVE[w["active"]],
             "is_lowactive_period": w["lowactive"],
             "is_live_streamer": w["live"],
             "is_video_author": w["author_flag"]}
    for k in RANGES:
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


def write_videos(cfg: GeneratorConfig, w: dict, out_dir: str) -> None:
    """Every video of the world with KuaiRand's basic video columns (``tag``: its tag ids,
    comma-separated), ``4 * CHUNK_ROWS`` videos at a time."""
    start, rows = cfg.first_date(), 4 * CHUNK_ROWS
    upload = np.array([start - dt.timedelta(days=int(x)) for x in range(0, 366)], dtype="datetime64[D]")
    with open(os.path.join(out_dir, VIDEO_FILE), "wb") as f:
        for lo in range(0, cfg.n_videos, rows):
            s = slice(lo, min(lo + rows, cfg.n_videos))
            n = s.stop - s.start
            vdf = pl.DataFrame({
                "video_id": np.arange(s.start, s.stop, dtype=np.int64),
                "author_id": w["author"][s].astype(np.int64),
                "video_type": np.where(w["is_ad"][s] == 1, "AD", "NORMAL"),
                "upload_dt": upload[w["age0"][s]],
                "upload_type": UPLOAD_TYPES[w["upload_type"][s]],
                "visible_status": np.full(n, "public"),
                "video_duration": w["duration_ms"][s].astype(np.float64),
                "server_width": w["width"][s].astype(np.float64),
                "server_height": w["height"][s].astype(np.float64),
                "music_id": w["music"][s].astype(np.int64),
                "music_type": w["music_type"][s].astype(np.float64),
            }).with_columns(pl.col("upload_dt").dt.strftime("%Y-%m-%d"))
            tags, mask = w["tags"][s], w["tag_mask"][s]
            tdf = pl.DataFrame({"row": np.repeat(np.arange(n), MAX_TAGS),
                                "t": tags.reshape(-1), "m": mask.reshape(-1)}).filter(pl.col("m"))
            tag_lists = (tdf.group_by("row", maintain_order=True)
                         .agg(pl.col("t").cast(pl.String).str.join(",").alias("tag")))
            vdf = (vdf.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
                   .join(tag_lists.with_columns(pl.col("row").cast(pl.Int64)), on="row", how="left")
                   .drop("row"))
            vdf.select(list(VIDEO_COLUMNS)).write_csv(f, include_header=lo == 0)


def write_json(obj: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
