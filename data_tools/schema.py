"""KuaiRand raw schema, the three tasks and the processed feature lists.

Raw dtypes are what the converter parses each column as; see DATA_CONTRACT.md for the
processed format, whose files, versions and non-feature columns :mod:`data_tools.contract` owns.
"""

from __future__ import annotations

import polars as pl

from data_tools.contract import RAND_COLUMN, label_column, oracle_column

START_DATE = 20220408

TASKS = ("contribution", "like", "long_dwell")

# Components of each task's label (a task is positive when any component is > 0).
TASK_COMPONENTS = {
    "contribution": ("is_comment", "is_forward", "is_follow"),
    "like": ("is_like",),
    "long_dwell": ("long_view",),
}

# Post-impression outcomes: never model inputs.
OUTCOME_COLUMNS = frozenset(
    {
        "is_click",
        "is_like",
        "is_follow",
        "is_comment",
        "is_forward",
        "is_hate",
        "long_view",
        "play_time_ms",
        "profile_stay_time",
        "comment_stay_time",
        "is_profile_enter",
    }
)

# ---- raw KuaiRand schema ---------------------------------------------------------------
LOG_COLUMNS: dict[str, pl.DataType] = {
    "user_id": pl.Int64,
    "video_id": pl.Int64,
    "date": pl.Int64,
    "hourmin": pl.Int64,
    "time_ms": pl.Int64,
    "is_click": pl.Int64,
    "is_like": pl.Int64,
    "is_follow": pl.Int64,
    "is_comment": pl.Int64,
    "is_forward": pl.Int64,
    "is_hate": pl.Int64,
    "long_view": pl.Int64,
    "play_time_ms": pl.Int64,
    "duration_ms": pl.Int64,
    "profile_stay_time": pl.Int64,
    "comment_stay_time": pl.Int64,
    "is_profile_enter": pl.Int64,
    RAND_COLUMN: pl.Int64,
    "tab": pl.Int64,
}

RANGE_SOURCES = ("follow_user_num", "fans_user_num", "friend_user_num", "register_days")

USER_COLUMNS: dict[str, pl.DataType] = {
    "user_id": pl.Int64,
    "user_active_degree": pl.String,
    "is_lowactive_period": pl.Int64,
    "is_live_streamer": pl.Int64,
    "is_video_author": pl.Int64,
}
for _c in RANGE_SOURCES:
    USER_COLUMNS[_c] = pl.Int64
    USER_COLUMNS[f"{_c}_range"] = pl.String
for _i in range(18):
    USER_COLUMNS[f"onehot_feat{_i}"] = pl.Int64

VIDEO_COLUMNS: dict[str, pl.DataType] = {
    "video_id": pl.Int64,
    "author_id": pl.Int64,
    "video_type": pl.String,
    "upload_dt": pl.String,  # "YYYY-MM-DD" (YYYYMMDD also accepted)
    "upload_type": pl.String,
    "visible_status": pl.String,
    "video_duration": pl.Float64,  # milliseconds
    "server_width": pl.Float64,
    "server_height": pl.Float64,
    "music_id": pl.Int64,
    "music_type": pl.Float64,
    "tag": pl.String,  # comma-separated integer tag ids
}

# The subset of raw columns the converter reads (and therefore requires).
LOG_REQUIRED = (
    "user_id",
    "video_id",
    "date",
    "hourmin",
    "time_ms",
    "is_like",
    "is_follow",
    "is_comment",
    "is_forward",
    "long_view",
    "tab",
)
USER_REQUIRED = (
    "user_id",
    "user_active_degree",
    "is_lowactive_period",
    "is_live_streamer",
    "is_video_author",
    *RANGE_SOURCES,
    *(f"{c}_range" for c in RANGE_SOURCES),
)
VIDEO_REQUIRED = (
    "video_id",
    "author_id",
    "video_type",
    "upload_dt",
    "upload_type",
    "video_duration",
    "server_width",
    "server_height",
    "music_id",
    "tag",
)

# Columns that must be present and non-null in every row.
LOG_NOT_NULL = LOG_REQUIRED
USER_NOT_NULL = ("user_id",)
VIDEO_NOT_NULL = ("video_id",)

# Integer id columns (must be >= 0).
LOG_ID_COLUMNS = ("user_id", "video_id", "tab")
USER_ID_COLUMNS = ("user_id",)
VIDEO_ID_COLUMNS = ("video_id", "author_id", "music_id")

# Columns feeding dense features (NaN / inf rejected; null = missing -> 0.0).
USER_DENSE_SOURCES = (
    *RANGE_SOURCES,
    "is_lowactive_period",
    "is_live_streamer",
    "is_video_author",
)
VIDEO_DENSE_SOURCES = ("video_duration", "server_width", "server_height")

# ---- processed features ----------------------------------------------------------------
# Integer ids encoded through an exact vocabulary (data_tools.vocab: 0 missing, 1 out of vocabulary).
ID_SPARSE = ("user_id", "video_id", "author_id", "music_id", "tab")
# String categoricals: sorted vocabulary from the feature files, 1-based (0 = missing).
STRING_SPARSE = (
    "user_active_degree",
    "follow_user_num_range",
    "fans_user_num_range",
    "friend_user_num_range",
    "register_days_range",
    "video_type",
    "upload_type",
)
# Column order of the processed files (and of the model's features): ids, hour, categoricals.
SPARSE_SINGLE = ID_SPARSE + ("hour",) + STRING_SPARSE
SPARSE_MULTI = ("tag",)
SPARSE_FEATURES = SPARSE_SINGLE + SPARSE_MULTI

# hour = hourmin // 100 stored as hour + 1 (0 = missing), so its vocab is 25.
HOUR_VOCAB = 25

# KuaiRand's missing-value sentinels in numeric feature columns: -124 (e.g. is_live_streamer for
# most users in KuaiRand-Pure's user_features). Read as missing (null + indicator), never as a value.
SENTINELS = (-124,)

DENSE_VALUES = (
    "log_follow_user_num",
    "log_fans_user_num",
    "log_friend_user_num",
    "log_register_days",
    "log_video_duration_s",
    "log_video_age_days",
    "is_lowactive_period",
    "is_live_streamer",
    "is_video_author",
    "aspect_ratio",
)


def missing_indicator(feature: str) -> str:
    return f"{feature}_missing"


# The model's dense inputs: each value (null where missing; the loader normalizes it with its
# training days' statistics and fills a missing one with the mean) and its missing indicator.
DENSE_FEATURES = DENSE_VALUES + tuple(missing_indicator(c) for c in DENSE_VALUES)

LABEL_COLUMNS = tuple(label_column(t) for t in TASKS)
ORACLE_COLUMNS = tuple(oracle_column(t) for t in TASKS)
