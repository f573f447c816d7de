"""Tests for data_tools: generator, converter, validators, prepare."""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing as mp
import os
import shutil

import numpy as np
import polars as pl
import pytest

from data_tools import contract as C
from data_tools import schema as S
from data_tools.convert import convert
from data_tools.vocab import vocab_path
from data_tools.errors import DataError
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_files import LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE
from data_tools.prepare import ensure_dataset, load_oracle
from data_tools.validate import main as validate_main
from data_tools.validate import validate_processed
from data_tools.validate_raw import validate_raw

SMALL = dict(seed=1, n_users=300, n_videos=1000, n_authors=200, n_music=100, n_tags=50,
             days=3, impressions_per_day=4000, latent_dim=4)
MIN_COUNT = {"user_id": 1, "video_id": 2}  # video ids seen once share the out-of-vocabulary row


def _raw(d):
    return os.path.join(d, LOG_FILE), os.path.join(d, USER_FILE), os.path.join(d, VIDEO_FILE)


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("raw") / "raw")
    generate(GeneratorConfig(**SMALL), d)
    return d


@pytest.fixture(scope="session")
def processed(raw_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("proc") / "data")
    convert(*_raw(raw_dir), out, MIN_COUNT)
    return out


@pytest.fixture()
def raw_copy(raw_dir, tmp_path):
    d = str(tmp_path / "rawcopy")
    shutil.copytree(raw_dir, d)
    return d


def _rewrite(path, fn):
    df = pl.read_csv(path, infer_schema=False)
    fn(df).write_csv(path)


def _assert_names(err: DataError, path: str, column: str | None):
    msg = str(err.value if hasattr(err, "value") else err)
    assert path in msg, msg
    if column is not None:
        assert f"'{column}'" in msg, msg


# ---- schema ---------------------------------------------------------------------------------------
def test_no_outcome_column_is_a_feature():
    feats = set(S.SPARSE_FEATURES) | set(S.DENSE_FEATURES)
    assert not (feats & S.OUTCOME_COLUMNS)
    assert S.TASKS == ("contribution", "like", "long_dwell")
    assert set(S.OUTCOME_COLUMNS) <= set(S.LOG_COLUMNS)


# ---- generator --------------------------------------------------------------------------------------
def test_generator_deterministic_by_seed(tmp_path):
    cfg = dict(SMALL, days=2, impressions_per_day=1500)
    generate(cfg, str(tmp_path / "a"))
    generate(cfg, str(tmp_path / "b"))
    generate(dict(cfg, seed=2), str(tmp_path / "c"))
    for f in (LOG_FILE, USER_FILE, VIDEO_FILE, ORACLE_FILE):
        a = (tmp_path / "a" / f).read_bytes()
        assert a == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / LOG_FILE).read_bytes() != (tmp_path / "c" / LOG_FILE).read_bytes()


def test_generator_schema_and_time(raw_dir):
    log = pl.read_csv(_raw(raw_dir)[0])
    assert set(S.LOG_COLUMNS) <= set(log.columns)
    assert set(S.ORACLE_COLUMNS) <= set(log.columns)
    assert sorted(log["date"].unique().to_list()) == [20220408, 20220409, 20220410]
    per_day = log.group_by("date").agg((pl.col("time_ms").diff() > 0).all().alias("inc"),
                                       pl.col("hourmin").max().alias("hm"))
    assert per_day["inc"].all() and per_day["hm"].max() <= 2359
    assert ((log["hourmin"] % 100) < 60).all()
    users = pl.read_csv(_raw(raw_dir)[1])
    videos = pl.read_csv(_raw(raw_dir)[2], infer_schema=False)
    assert set(S.USER_COLUMNS) <= set(users.columns)
    assert set(S.VIDEO_COLUMNS) <= set(videos.columns)
    ntags = videos["tag"].str.split(",").list.len()
    assert ntags.min() >= 1 and ntags.max() <= 4


def test_generator_positive_rates_and_oracle(tmp_path):
    cfg = GeneratorConfig(seed=3, n_users=2000, n_videos=6000, n_authors=800, n_music=400,
                          n_tags=100, days=2, impressions_per_day=40000)
    oracle = generate(cfg, str(tmp_path))
    bands = {"contribution": (0.006, 0.016), "like": (0.02, 0.045), "long_dwell": (0.24, 0.36)}
    with open(tmp_path / ORACLE_FILE) as f:
        assert json.load(f) == oracle
    assert sorted(oracle) == ["20220408", "20220409"]
    log = pl.read_csv(tmp_path / LOG_FILE)
    for day, tasks in oracle.items():
        assert set(tasks) == set(S.TASKS)
        part = log.filter(pl.col("date") == int(day))
        for t, m in tasks.items():
            assert set(m) == {"logloss", "ne", "positive_rate"}
            lo, hi = bands[t]
            assert lo < m["positive_rate"] < hi, (day, t, m)
            assert 0.5 < m["ne"] < 0.97, (day, t, m)  # learnable, not trivial
            # recompute from the written CSV
            comps = S.TASK_COMPONENTS[t]
            y = (part.select(pl.max_horizontal(comps) > 0).to_series().to_numpy()).astype(float)
            p = part[f"oracle_{t}"].to_numpy().astype(np.float32).astype(float)
            ll = -np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))
            assert ll == pytest.approx(m["logloss"], rel=1e-4)
            r = y.mean()
            assert r == pytest.approx(m["positive_rate"])
            h = -(r * math.log(r) + (1 - r) * math.log(1 - r))
            assert m["ne"] == pytest.approx(ll / h, rel=1e-4)


@pytest.mark.parametrize("field,value", [("n_users", 0), ("impressions_per_day", -1),
                                         ("target_like", 1.5), ("start_date", 20221399),
                                         ("latent_dim", 2.5)])
def test_generator_config_validation(field, value):
    with pytest.raises(ValueError, match=field):
        GeneratorConfig(**{field: value})
    with pytest.raises(DataError, match="bogus"):
        GeneratorConfig.from_dict({"bogus": 1})


# ---- converter ----------------------------------------------------------------------------------------
def test_convert_matches_contract(processed, raw_dir):
    meta = validate_processed(processed)
    assert meta["format_version"] == C.FORMAT_VERSION
    assert meta["tasks"] == list(S.TASKS)
    assert meta["dense"] == list(S.DENSE_FEATURES)
    assert list(meta["sparse"]) == list(S.SPARSE_FEATURES)
    assert meta["has_oracle"] is True
    assert sorted(meta["days"]) == ["20220408", "20220409", "20220410"]
    raw = pl.read_csv(_raw(raw_dir)[0])
    # Exact vocabularies: every user of the log has a row of its own; videos seen once share row 1.
    users = raw["user_id"].n_unique()
    assert meta["sparse"]["user_id"]["vocab"] == users + 2
    assert meta["ids"]["user_id"] == {"distinct_raw_ids": users, "distinct_rows": users, "oov_ids": 0,
                                      "oov_impressions": 0, "collision_rate": 0.0, "table_rows": users + 2,
                                      "min_count": 1}
    seen = raw.group_by("video_id").len()
    rare = int((seen["len"] < 2).sum())
    assert meta["ids"]["video_id"]["oov_ids"] == rare > 0
    assert meta["sparse"]["video_id"]["vocab"] == seen.height - rare + 2
    assert meta["ids"]["tab"]["distinct_rows"] == raw["tab"].n_unique()  # no two tabs merged
    assert meta["sparse"]["hour"]["vocab"] == 25
    assert meta["sparse"]["video_type"]["vocab"] == 3  # AD, NORMAL + missing
    assert meta["sparse"]["tag"]["multi"] is True
    assert sorted(os.listdir(processed)) == sorted(["meta.json", "vocab"] + [d["file"] for d in meta["days"].values()])
    user_rows = dict(pl.read_parquet(vocab_path(processed, "user_id")).select("raw_id", "row").iter_rows())
    video_rows = dict(pl.read_parquet(vocab_path(processed, "video_id")).select("raw_id", "row").iter_rows())
    total = 0
    for day, spec in meta["days"].items():
        df = pl.read_parquet(os.path.join(processed, spec["file"]))
        total += df.height
        assert spec["file"] == f"day={day}.parquet" and df.height == spec["rows"]
        for name, sp in meta["sparse"].items():
            assert df.schema[name] == (pl.List(pl.Int64) if sp["multi"] else pl.Int64)
            vals = df[name].explode() if sp["multi"] else df[name]
            assert vals.min() >= 0 and vals.max() < sp["vocab"]
        for c in meta["dense"]:  # null = missing; never NaN or inf
            assert df.schema[c] == pl.Float32 and df[c].drop_nulls().is_finite().all()
        for c in S.DENSE_VALUES:
            assert (df[S.missing_indicator(c)] == df[c].is_null().cast(pl.Float32)).all()
        assert df["is_rand"].dtype == pl.Int8
        assert (df["is_rand"].cast(pl.Int64) == raw.filter(pl.col("date") == int(day)).sort("time_ms")["is_rand"]).all()
        assert spec["random_exposure_rows"] == int(df["is_rand"].cast(pl.Int64).sum())
        stats = spec["dense_stats"]["log_follow_user_num"]
        assert stats["count"] == df["log_follow_user_num"].count()
        assert stats["sum"] == pytest.approx(float(df["log_follow_user_num"].cast(pl.Float64).sum()), rel=1e-9)
        for c in S.LABEL_COLUMNS + S.ORACLE_COLUMNS:
            assert df.schema[c] == pl.Float32
        for c in ("user_id_raw", "video_id_raw", "date", "time_ms"):
            assert df.schema[c] == pl.Int64
        assert (df["date"] == int(day)).all()
        assert df["time_ms"].is_sorted()
        assert not (set(df.columns) & S.OUTCOME_COLUMNS)
        # labels / ids agree with the raw log row by row (time_ms is unique within a day)
        r = raw.filter(pl.col("date") == int(day)).sort("time_ms")
        assert (df["user_id_raw"] == r["user_id"]).all()
        assert (df["label_like"] == r["is_like"].cast(pl.Float32)).all()
        assert (df["label_long_dwell"] == r["long_view"].cast(pl.Float32)).all()
        contrib = ((r["is_comment"] + r["is_forward"] + r["is_follow"]) > 0).cast(pl.Float32)
        assert (df["label_contribution"] == contrib).all()
        assert df["user_id"].to_list() == [user_rows[u] for u in df["user_id_raw"]]
        assert df["video_id"].to_list() == [video_rows.get(v, 1) for v in df["video_id_raw"]]
        assert df["hour"][0] == int(r["hourmin"][0]) // 100 + 1
    assert total == raw.height


def test_unmatched_joins_are_counted_and_refused_above_the_threshold(raw_copy, tmp_path):
    log, users, videos = _raw(raw_copy)
    # drop one user and one video from the feature tables
    _rewrite(users, lambda d: d.filter(pl.col("user_id") != "0"))
    _rewrite(videos, lambda d: d.filter(pl.col("video_id") != "1"))
    raw = pl.read_csv(log, infer_schema=False)
    n_user, n_video = (raw["user_id"] == "0").sum(), (raw["video_id"] == "1").sum()
    with pytest.raises(DataError) as e:
        convert(log, users, videos, str(tmp_path / "refused"), MIN_COUNT,
                max_unmatched_fraction=min(n_user, n_video) / raw.height / 2)
    assert "have a user_id with no row" in str(e.value) or "have a video_id with no row" in str(e.value)
    assert not os.path.exists(tmp_path / "refused")
    out = str(tmp_path / "o")
    meta = convert(log, users, videos, out, MIN_COUNT, max_unmatched_fraction=1.0)
    joins = meta["source"]["joins"]
    assert joins["unmatched_user_rows"] == n_user and joins["unmatched_video_rows"] == n_video
    assert joins["log_rows"] == raw.height
    df = pl.concat([pl.read_parquet(os.path.join(out, f)) for f in sorted(os.listdir(out))
                    if f.endswith(".parquet")])
    u = df.filter(pl.col("user_id_raw") == 0)
    v = df.filter(pl.col("video_id_raw") == 1)
    assert u.height > 0 and v.height > 0
    assert (u["user_active_degree"] == 0).all() and u["log_follow_user_num"].is_null().all()
    assert (u["log_follow_user_num_missing"] == 1).all()
    assert (v["author_id"] == 0).all() and (v["tag"].list.len() == 0).all()
    assert v["log_video_duration_s"].is_null().all() and v["aspect_ratio"].is_null().all()
    assert (v["log_video_duration_s_missing"] == 1).all()


def test_conflicting_duplicate_feature_rows_are_refused(raw_copy, tmp_path):
    log, users, videos = _raw(raw_copy)
    _rewrite(users, lambda d: pl.concat([d, d.head(1).with_columns(pl.lit("999").alias("follow_user_num"))]))
    with pytest.raises(DataError) as e:
        convert(log, users, videos, str(tmp_path / "o"), MIN_COUNT)
    _assert_names(e, users, "user_id")
    assert "1 ids repeated with conflicting feature values" in str(e.value)
    # The same row twice is no conflict: it is counted and dropped.
    _rewrite(users, lambda d: d.unique(subset=["user_id"], keep="first", maintain_order=True))
    _rewrite(users, lambda d: pl.concat([d, d.head(1)]))
    meta = convert(log, users, videos, str(tmp_path / "o2"), MIN_COUNT)
    assert meta["source"]["joins"]["duplicate_user_ids"] == 1 and meta["source"]["joins"]["conflicting_user_ids"] == 0


def test_convert_ignores_extra_columns(raw_copy, processed, tmp_path):
    log, users, videos = _raw(raw_copy)
    for p in (log, users, videos):
        _rewrite(p, lambda d: d.with_columns(pl.lit("zzz").alias("extra_col"),
                                             pl.lit("1").alias("oracle_other")))
    out = str(tmp_path / "o")
    meta = convert(log, users, videos, out, MIN_COUNT)
    ref = validate_processed(processed)
    assert meta["sparse"] == ref["sparse"] and meta["days"] == ref["days"]
    for spec in meta["days"].values():
        a = pl.read_parquet(os.path.join(out, spec["file"]))
        b = pl.read_parquet(os.path.join(processed, spec["file"]))
        assert "extra_col" not in a.columns and "oracle_other" not in a.columns
        assert a.equals(b)


def test_convert_without_oracle_and_cli(raw_copy, tmp_path):
    from data_tools.convert import main as convert_main
    log, users, videos = _raw(raw_copy)
    _rewrite(log, lambda d: d.drop(list(S.ORACLE_COLUMNS)))
    out = str(tmp_path / "o")
    assert convert_main([f"log={log}", f"users={users}", f"videos={videos}", f"data.root={out}",
                         "min_count.user_id=1000000"]) == 0
    meta = validate_processed(out)
    # Every user below the threshold: they all share the out-of-vocabulary row.
    assert meta["has_oracle"] is False and meta["sparse"]["user_id"]["vocab"] == 2
    assert meta["ids"]["user_id"]["oov_ids"] == meta["ids"]["user_id"]["distinct_raw_ids"]
    df = pl.read_parquet(os.path.join(out, "day=20220408.parquet"))
    assert not any(c.startswith("oracle_") for c in df.columns)
    assert validate_main([f"data.root={out}"]) == 0
    # existing output is not overwritten without overwrite=true
    assert convert_main([f"log={log}", f"users={users}", f"videos={videos}", f"data.root={out}"]) == 2


# ---- bad raw inputs -------------------------------------------------------------------------------
def _convert_err(raw_copy, tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(DataError) as e:
        convert(*_raw(raw_copy), out, MIN_COUNT)
    assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out")]
    return e


def test_bad_missing_column(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    _rewrite(log, lambda d: d.drop("tab"))
    _assert_names(_convert_err(raw_copy, tmp_path), log, "tab")


def test_bad_missing_feature_column(raw_copy, tmp_path):
    videos = _raw(raw_copy)[2]
    _rewrite(videos, lambda d: d.drop("music_id"))
    _assert_names(_convert_err(raw_copy, tmp_path), videos, "music_id")


def test_bad_dtype_string_in_user_id(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    _rewrite(log, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()) == 7).then(pl.lit("abc")).otherwise(pl.col("user_id")).alias("user_id")))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, log, "user_id")
    assert "abc" in str(e.value)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_bad_nonfinite_dense_source(raw_copy, tmp_path, bad):
    videos = _raw(raw_copy)[2]
    _rewrite(videos, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit(bad)).otherwise(pl.col("video_duration"))
        .alias("video_duration")))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, videos, "video_duration")
    assert "NaN" in str(e.value)


def test_bad_negative_id(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    _rewrite(log, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()).is_in([11, 12, 20])).then(pl.lit("-5")).otherwise(pl.col("video_id"))
        .alias("video_id")))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, log, "video_id")
    # row 11 (0-based) under the header is line 13: the value error names its first line
    assert "3 negative ids (min -5), first at line 13" in str(e.value)


def test_bad_null_label(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    _rewrite(log, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("is_like")).alias("is_like")))
    _assert_names(_convert_err(raw_copy, tmp_path), log, "is_like")


@pytest.mark.parametrize("kind", ["zero_bytes", "header_only"])
def test_bad_empty_log(raw_copy, tmp_path, kind):
    log = _raw(raw_copy)[0]
    if kind == "zero_bytes":
        open(log, "w").close()
    else:
        _rewrite(log, lambda d: d.head(0))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, log, None)
    assert "empty" in str(e.value)


def test_calendar_invalid_date_is_named(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    _rewrite(log, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()) == 4).then(pl.lit("20220431")).otherwise(pl.col("date")).alias("date")))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, log, "date")
    assert "20220431" in str(e.value) and "calendar" in str(e.value)


@pytest.mark.parametrize("which", [0, 1, 2])  # the log, the user features, the video features
def test_a_file_cut_off_mid_line_is_refused(raw_copy, tmp_path, which):
    path = _raw(raw_copy)[which]
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) - 3)  # inside the last line's last field
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, path, None)
    assert "does not end with a newline" in str(e.value)


@pytest.mark.parametrize("which", [0, 2])  # the log, the video features (quoted tag lists)
def test_a_ragged_row_is_refused_with_its_line(raw_copy, tmp_path, which):
    path = _raw(raw_copy)[which]
    lines = open(path).read().splitlines(keepends=True)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(next(csv.reader([lines[5]]))[:-2])
    lines[5] = out.getvalue()  # line 6 loses its last two fields
    open(path, "w").write("".join(lines))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, path, None)
    assert "1 lines do not have the header's" in str(e.value) and "first at line 6" in str(e.value)


@pytest.mark.parametrize("which", [0, 1, 2])  # the log, the user features, the video features
def test_a_byte_that_is_not_utf8_is_refused_with_its_file_and_line(raw_copy, tmp_path, which):
    path = _raw(raw_copy)[which]
    lines = open(path, "rb").read().split(b"\n")
    lines[6] = lines[6][:3] + b"\xff" + lines[6][3:]  # line 7 (a Latin-1 byte, say)
    open(path, "wb").write(b"\n".join(lines))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, path, None)
    assert "line 7" in str(e.value) and "not UTF-8" in str(e.value)


def test_a_log_file_named_twice_is_refused_not_read_twice(raw_copy, tmp_path):
    log, users, videos = _raw(raw_copy)
    out = str(tmp_path / "out")
    for twice in ([os.path.join(raw_copy, "*.csv"), log], [log, os.path.join(raw_copy, ".", os.path.basename(log))]):
        with pytest.raises(DataError) as e:
            convert(twice, users, videos, out, MIN_COUNT)
        assert "given twice" in str(e.value) and os.path.basename(log) in str(e.value)
        assert not os.path.exists(out)


def test_a_blank_line_inside_a_file_is_named(raw_copy, tmp_path):
    log = _raw(raw_copy)[0]
    lines = open(log).read().split("\n")
    lines.insert(9, "")  # line 10 is blank
    open(log, "w").write("\n".join(lines))
    e = _convert_err(raw_copy, tmp_path)
    _assert_names(e, log, None)
    assert "1 blank lines (first at line 10)" in str(e.value)


def test_validate_raw_ok(raw_dir):
    info = validate_raw(_raw(raw_dir)[0], *_raw(raw_dir)[1:])
    assert info["dates"] == [20220408, 20220409, 20220410] and info["has_oracle"]
    with pytest.raises(DataError, match="no file matches"):
        validate_raw(os.path.join(raw_dir, "nope_*.csv"), *_raw(raw_dir)[1:])


# ---- bad processed data ----------------------------------------------------------------------------
@pytest.fixture()
def proc_copy(processed, tmp_path):
    d = str(tmp_path / "proc")
    shutil.copytree(processed, d)
    return d


def test_processed_corrupt_parquet(proc_copy):
    path = os.path.join(proc_copy, "day=20220409.parquet")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 3])
    with pytest.raises(DataError) as e:
        validate_processed(proc_copy)
    _assert_names(e, path, None)
    assert validate_main([f"data.root={proc_copy}"]) == 2


def test_processed_empty_day_partition(proc_copy):
    path = os.path.join(proc_copy, "day=20220408.parquet")
    pl.read_parquet(path).head(0).write_parquet(path)
    with pytest.raises(DataError, match="empty day partition") as e:
        validate_processed(proc_copy)
    _assert_names(e, path, None)


def test_processed_missing_file_and_meta(proc_copy):
    path = os.path.join(proc_copy, "day=20220410.parquet")
    os.remove(path)
    with pytest.raises(DataError, match="does not exist") as e:
        validate_processed(proc_copy)
    _assert_names(e, path, None)
    with open(os.path.join(proc_copy, "meta.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(DataError, match="meta.json"):
        validate_processed(proc_copy)


@pytest.mark.parametrize("column,expr,problem", [
    ("video_id", pl.lit(3000, pl.Int64), "outside"),
    ("user_id", pl.lit(-1, pl.Int64), "outside"),
    ("aspect_ratio", pl.lit(float("inf"), pl.Float32), "non-finite"),
    ("label_like", pl.lit(2.0, pl.Float32), "not in"),
    ("user_id", pl.lit(1.0, pl.Float64), "dtype"),
    ("time_ms", -pl.col("time_ms"), "sorted"),
])
def test_processed_bad_values(proc_copy, column, expr, problem):
    path = os.path.join(proc_copy, "day=20220409.parquet")
    pl.read_parquet(path).with_columns(expr.alias(column)).write_parquet(path)
    with pytest.raises(DataError, match=problem) as e:
        validate_processed(proc_copy)
    _assert_names(e, path, column)


def test_failed_convert_leaves_nothing(raw_dir, processed, tmp_path, monkeypatch):
    import data_tools.convert as C

    def boom(path):
        raise DataError(f"{path}: column 'x': injected failure")

    monkeypatch.setattr(C, "validate_processed", boom)
    out = str(tmp_path / "out")
    with pytest.raises(DataError, match="injected"):
        convert(*_raw(raw_dir), out, MIN_COUNT)
    assert os.listdir(tmp_path) == []
    # an existing output is left intact by a failed overwrite
    shutil.copytree(processed, out)
    before = sorted(os.listdir(out))
    with pytest.raises(DataError, match="injected"):
        convert(*_raw(raw_dir), out, MIN_COUNT, overwrite=True)
    assert sorted(os.listdir(out)) == before and os.listdir(tmp_path) == ["out"]


# ---- prepare ---------------------------------------------------------------------------------------
def _ensure(args):
    return ensure_dataset(*args)


def test_ensure_dataset(tmp_path, capsys):
    root = str(tmp_path / "ds" / "demo")
    gen = dict(SMALL, days=2, impressions_per_day=1500)
    assert ensure_dataset(root, gen, MIN_COUNT) == root
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and "generating" in out and "took" in out
    meta = validate_processed(root)
    assert meta["source"]["generator"]["impressions_per_day"] == 1500
    assert set(load_oracle(root)) == set(meta["days"])
    mtime = os.path.getmtime(os.path.join(root, "meta.json"))
    assert ensure_dataset(root, gen, MIN_COUNT) == root  # reuse, no regeneration
    assert capsys.readouterr().out == ""
    assert os.path.getmtime(os.path.join(root, "meta.json")) == mtime
    # a corrupt data set is rebuilt
    os.remove(os.path.join(root, "day=20220409.parquet"))
    ensure_dataset(root, gen, MIN_COUNT)
    assert "generating" in capsys.readouterr().out
    validate_processed(root)
    # a different config regenerates
    ensure_dataset(root, dict(gen, seed=9), MIN_COUNT)
    assert validate_processed(root)["source"]["generator"]["seed"] == 9


def test_ensure_dataset_concurrent(tmp_path):
    root = str(tmp_path / "demo")
    gen = dict(SMALL, days=2, impressions_per_day=1000)
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        res = pool.map(_ensure, [(root, gen, MIN_COUNT)] * 3)
    assert res == [root] * 3
    validate_processed(root)
    assert sorted(os.listdir(tmp_path)) == ["demo", "demo.lock", "demo.raw"]


def _same_data_set(a, b):
    """Two processed data sets hold the same rows in the same order, the same vocabularies and meta."""
    ma, mb = (json.load(open(os.path.join(d, "meta.json"))) for d in (a, b))
    assert {k: v for k, v in ma.items() if k != "source"} == {k: v for k, v in mb.items() if k != "source"}
    assert ma["source"]["string_vocabs"] == mb["source"]["string_vocabs"]
    for name in [d["file"] for d in ma["days"].values()] + [os.path.join("vocab", f) for f in os.listdir(
            os.path.join(a, "vocab"))]:
        assert pl.read_parquet(os.path.join(a, name)).equals(pl.read_parquet(os.path.join(b, name))), name
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))


def test_convert_sorts_a_long_day_in_time_ranges_with_the_same_result(raw_dir, processed, tmp_path):
    # 4,000 rows a day in pieces of about 300 (a piece per time range, then concatenated): the same
    # rows in the same order (ties in time_ms in log order), the same statistics, as sorted whole
    from data_tools.day_files import _time_ranges

    out = str(tmp_path / "chunked")
    convert(*_raw(raw_dir), out, MIN_COUNT, chunk_rows=300)
    _same_data_set(processed, out)
    assert not [p for p in os.listdir(tmp_path) if p != "chunked"]
    # the ranges the day was cut into: consecutive, covering the day, each near the chunk size
    log = str(tmp_path / "_log.parquet")
    pl.concat([pl.read_parquet(os.path.join(out, d["file"]), columns=["date", "time_ms"])
               for d in json.load(open(os.path.join(out, "meta.json")))["days"].values()]).write_parquet(log)
    day = pl.read_parquet(log).filter(pl.col("date") == 20220408)["time_ms"]
    ranges = _time_ranges(log, 20220408, 300)
    assert ranges[0][0] == day.min() and ranges[-1][1] == day.max() + 1
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [int(((day >= lo) & (day < hi)).sum()) for lo, hi in ranges]
    assert sum(sizes) == len(day) and len(ranges) >= len(day) // 300 and max(sizes) <= 300 + 50
    with pytest.raises(DataError, match="chunk_rows"):
        convert(*_raw(raw_dir), str(tmp_path / "x"), MIN_COUNT, chunk_rows=0)


def test_an_interrupted_convert_resumes_after_its_last_finished_day(raw_copy, processed, tmp_path, monkeypatch,
                                                                    capsys):
    import data_tools.resume as C

    out = str(tmp_path / "out")
    stage = str(tmp_path / ".out.partial")
    day_done = C._Progress.day_done

    def killed_after_the_first_day(self, day, entry):
        day_done(self, day, entry)
        raise KeyboardInterrupt  # as a kill would: the stage stays, with one day recorded

    monkeypatch.setattr(C._Progress, "day_done", killed_after_the_first_day)
    with pytest.raises(KeyboardInterrupt):
        convert(*_raw(raw_copy), out, MIN_COUNT, chunk_rows=1000)
    assert not os.path.exists(out) and os.path.isdir(stage)
    assert list(json.load(open(os.path.join(stage, "_progress.json")))["days"]) == ["20220408"]
    monkeypatch.setattr(C._Progress, "day_done", day_done)
    first_day = os.path.join(stage, "day=20220408.parquet")
    written = os.stat(first_day).st_mtime_ns
    convert(*_raw(raw_copy), out, MIN_COUNT, verbose=True)
    assert "resuming the conversion staged in" in capsys.readouterr().out
    _same_data_set(processed, out)
    assert sorted(os.listdir(tmp_path)) == ["out", "rawcopy"]
    # inputs changed since: the stage is not resumed (its day would be stale)
    monkeypatch.setattr(C._Progress, "day_done", killed_after_the_first_day)
    with pytest.raises(KeyboardInterrupt):
        convert(*_raw(raw_copy), str(tmp_path / "again"), MIN_COUNT)
    monkeypatch.setattr(C._Progress, "day_done", day_done)
    log = _raw(raw_copy)[0]
    os.utime(log, ns=(written, written + 1))
    convert(*_raw(raw_copy), str(tmp_path / "again"), MIN_COUNT, verbose=True)
    assert "resuming" not in capsys.readouterr().out
    _same_data_set(processed, str(tmp_path / "again"))


def test_convert_multiple_log_files_glob(raw_copy, processed, tmp_path):
    log, users, videos = _raw(raw_copy)
    df = pl.read_csv(log, infer_schema=False)
    os.remove(log)
    for i, (date,) in enumerate(sorted(df.select("date").unique().rows())):
        part = df.filter(pl.col("date") == date)
        if i == 1:  # files may differ in extra columns, e.g. one without oracle
            part = part.drop(list(S.ORACLE_COLUMNS))
        part.write_csv(os.path.join(raw_copy, f"log_part{i}.csv"))
    out = str(tmp_path / "o")
    meta = convert(os.path.join(raw_copy, "log_part*.csv"), users, videos, out, MIN_COUNT)
    assert meta["has_oracle"] is False
    assert meta["days"] == validate_processed(processed)["days"]
    assert len(meta["source"]["log"]) == 3


def test_generate_cli(tmp_path, capsys):
    from data_tools.generate import main as generate_main
    generate_main([f"out={tmp_path / 'g'}", "n_users=50", "n_videos=100", "n_authors=20", "n_music=10", "n_tags=10",
                   "days=1", "impressions_per_day=500", "seed=4"])
    assert "20220408" in capsys.readouterr().out
    with open(tmp_path / "g" / "generator_config.json") as f:
        assert json.load(f)["seed"] == 4


def test_feature_ints_written_as_floats_are_accepted(raw_copy, processed, tmp_path):
    # pandas writes an int column that has missing values as floats ("12.0", "")
    log, users, videos = _raw(raw_copy)
    _rewrite(users, lambda d: d.with_columns(
        (pl.col("follow_user_num") + ".0").alias("follow_user_num")))
    _rewrite(videos, lambda d: d.with_columns((pl.col("music_id") + ".0").alias("music_id")))
    out = str(tmp_path / "o")
    meta = convert(log, users, videos, out, MIN_COUNT)
    f = meta["days"]["20220408"]["file"]
    assert pl.read_parquet(os.path.join(out, f)).equals(pl.read_parquet(os.path.join(processed, f)))
    _rewrite(videos, lambda d: d.with_columns(
        pl.when(pl.int_range(pl.len()) == 2).then(pl.lit("7.5")).otherwise(pl.col("music_id"))
        .alias("music_id")))
    with pytest.raises(DataError) as e:
        convert(log, users, videos, str(tmp_path / "o2"), MIN_COUNT)
    _assert_names(e, videos, "music_id")


@pytest.mark.parametrize("arg, field", [("days=-1", "days"), ("rand_fraction=2", "rand_fraction")])
def test_generate_cli_refuses_bad_values_with_exit_2(tmp_path, capsys, arg, field):
    from data_tools.generate import main as generate_main

    assert generate_main([f"out={tmp_path / 'g'}", arg]) == 2
    assert f"field '{field}'" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_convert_writes_layout_2_row_groups_and_validation_refuses_a_file_cut_otherwise(raw_dir, processed, tmp_path):
    import pyarrow.parquet as pq

    out = str(tmp_path / "grouped")
    convert(*_raw(raw_dir), out, MIN_COUNT, chunk_rows=300, row_group_rows=700)  # the chunked path too
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["layout"] == {"version": 2, "row_group_rows": 700}
    for spec in meta["days"].values():
        footer = pq.read_metadata(os.path.join(out, spec["file"]))
        sizes = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
        assert sizes[:-1] == [700] * (len(sizes) - 1) and 0 < sizes[-1] <= 700 and sum(sizes) == spec["rows"]
        # the same rows in the same order as the default conversion
        assert pl.read_parquet(os.path.join(out, spec["file"])).equals(
            pl.read_parquet(os.path.join(processed, spec["file"])))
    meta["layout"]["row_group_rows"] = 500  # the files say otherwise
    json.dump(meta, open(os.path.join(out, "meta.json"), "w"))
    with pytest.raises(DataError, match=r"day=\d+\.parquet.*row group 0 holds 700 rows.*500 per group.*relayout"):
        validate_processed(out)
    meta["layout"] = {"version": 3}
    json.dump(meta, open(os.path.join(out, "meta.json"), "w"))
    with pytest.raises(DataError, match=r"meta\.json.*layout.*version"):
        validate_processed(out)
    with pytest.raises(DataError, match="row_group_rows: must be an int >= 1"):
        convert(*_raw(raw_dir), str(tmp_path / "bad"), MIN_COUNT, row_group_rows=0)


@pytest.mark.parametrize("path", ["whole_day", "chunked"])
def test_both_ways_of_writing_a_day_cut_it_into_the_configured_row_groups(raw_dir, tmp_path, monkeypatch, path):
    # Days of 4,000 rows, longer than the 700-row groups: written whole (chunk_rows above the day's rows)
    # or sorted in time ranges and concatenated (chunk_rows=300), each day file's footer holds groups of
    # exactly 700 rows (the last one shorter), the layout meta.json records.
    import pyarrow.parquet as pq

    import data_tools.day_files as C

    ranges = []
    real = C._time_ranges
    monkeypatch.setattr(C, "_time_ranges", lambda *a, **kw: ranges.append(real(*a, **kw)) or ranges[-1])
    out = str(tmp_path / path)
    convert(*_raw(raw_dir), out, MIN_COUNT, chunk_rows=300 if path == "chunked" else 10_000, row_group_rows=700)
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["layout"] == {"version": 2, "row_group_rows": 700}
    assert len(meta["days"]) == SMALL["days"]
    if path == "chunked":  # every day went through the time ranges, several of them
        assert len(ranges) == SMALL["days"] and all(len(r) > 1 for r in ranges)
    else:
        assert ranges == []
    for spec in meta["days"].values():
        assert spec["rows"] > 2 * 700
        footer = pq.ParquetFile(os.path.join(out, spec["file"])).metadata
        sizes = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
        assert sizes == [700] * (spec["rows"] // 700) + ([spec["rows"] % 700] if spec["rows"] % 700 else []), sizes
    validate_processed(out)  # the files agree with the layout meta.json records
