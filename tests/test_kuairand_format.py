"""The converter on rows in KuaiRand's real format (tests/fixtures/kuairand): sentinels, empty fields,
float-formatted ids, quoted ranges, random exposure kept apart, exact vocabularies."""
import json
import os
import shutil

import polars as pl
import pytest

from data_tools import schema as S
from data_tools.convert import convert
from data_tools.errors import DataError
from data_tools.validate import validate_processed
from data_tools.vocab import OOV_ROW, vocab_path

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "kuairand")
STANDARD = os.path.join(FIXTURES, "log_standard_*_pure.csv")
RANDOM = os.path.join(FIXTURES, "log_random_4_22_to_5_08_pure.csv")
USERS = os.path.join(FIXTURES, "user_features_pure.csv")
VIDEOS = os.path.join(FIXTURES, "video_features_basic_pure.csv")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("kr") / "pure")
    convert([STANDARD, RANDOM], USERS, VIDEOS, out)
    return out


def _rows(out):
    meta = validate_processed(out)
    return meta, pl.concat([pl.read_parquet(os.path.join(out, d["file"])) for d in meta["days"].values()])


def test_random_exposure_rows_are_tagged_and_separable(both, tmp_path):
    meta, df = _rows(both)
    raw_random = pl.read_csv(RANDOM)
    assert int(df["is_rand"].cast(pl.Int64).sum()) == raw_random.height == 8
    assert meta["days"]["20220422"]["random_exposure_rows"] == 8 and meta["days"]["20220421"]["random_exposure_rows"] == 0
    rand = df.filter(pl.col("is_rand") == 1).sort("time_ms")
    assert rand["time_ms"].to_list() == raw_random.sort("time_ms")["time_ms"].to_list()
    assert "is_rand" not in meta["dense"] and "is_rand" not in meta["sparse"]  # never a model input
    # The README's way: standard logs only.
    standard = str(tmp_path / "standard")
    meta_std = convert(STANDARD, USERS, VIDEOS, standard)
    assert sum(d["random_exposure_rows"] for d in meta_std["days"].values()) == 0
    assert sum(d["rows"] for d in meta_std["days"].values()) == 48


def test_sentinels_and_empty_fields_become_null_with_an_indicator(both):
    _, df = _rows(both)
    by_user = {u: g for (u,), g in df.group_by("user_id_raw")}
    assert set(by_user) == {0, 1, 2, 3, 4, 5}
    for u in (0, 1, 3, 5):  # is_live_streamer = -124
        g = by_user[u]
        assert g["is_live_streamer"].is_null().all() and (g["is_live_streamer_missing"] == 1).all()
    assert (by_user[2]["is_live_streamer"] == 1.0).all() and (by_user[2]["is_live_streamer_missing"] == 0).all()
    g4 = by_user[4]  # follow_user_num = -124 (a sentinel in a count column), is_live_streamer = 0
    assert g4["log_follow_user_num"].is_null().all() and (g4["log_follow_user_num_missing"] == 1).all()
    assert (g4["is_live_streamer"] == 0.0).all()
    assert df["log_follow_user_num"].drop_nulls().min() >= 0  # -124 never reaches a value
    by_video = {v: g for (v,), g in df.group_by("video_id_raw")}
    v1 = by_video[1]  # empty video_duration and music_id
    assert v1["log_video_duration_s"].is_null().all() and (v1["log_video_duration_s_missing"] == 1).all()
    assert (v1["music_id"] == 0).all()
    v3 = by_video[3]  # server_width = server_height = 0: no aspect ratio
    assert v3["aspect_ratio"].is_null().all() and (v3["aspect_ratio_missing"] == 1).all()
    v5 = by_video[5]  # empty upload_dt: no video age
    assert v5["log_video_age_days"].is_null().all() and (v5["log_video_age_days_missing"] == 1).all()
    v0 = by_video[0]
    assert v0["log_video_duration_s"].to_list()[0] == pytest.approx(float(pl.Series([12.3]).log1p()[0]), rel=1e-6)


def test_float_formatted_ids_quoted_ranges_and_tags(both):
    meta, df = _rows(both)
    authors = pl.read_parquet(vocab_path(both, "author_id"))
    assert set(authors["raw_id"]) <= {10, 11, 12, 13, 14, 15}  # "10.0" -> 10
    videos0 = df.filter(pl.col("video_id_raw").is_in([0, 2, 6]))
    assert videos0["video_id_raw"].n_unique() == 3  # videos 0, 2 and 6 share author 10: one row
    assert videos0["author_id"].n_unique() == 1 and videos0["author_id"][0] >= 2
    ranges = meta["source"]["string_vocabs"]["follow_user_num_range"]
    assert "(0,10]" in ranges and "(100,150]" in ranges  # the quoted value, comma included
    tags = dict(pl.read_parquet(vocab_path(both, "tag")).select("raw_id", "row").iter_rows())
    v1 = df.filter(pl.col("video_id_raw") == 1)
    assert v1.height and v1["tag"][0].to_list() == [tags[8], tags[29]]
    assert OOV_ROW not in tags.values()


def test_extending_the_vocabulary_with_a_later_day_keeps_every_row(both, tmp_path):
    first = str(tmp_path / "first")
    convert(os.path.join(FIXTURES, "log_standard_4_08_to_4_21_pure.csv"), USERS, VIDEOS, first)
    later = str(tmp_path / "later")
    meta = convert([os.path.join(FIXTURES, "log_standard_4_22_to_5_08_pure.csv"), RANDOM], USERS, VIDEOS, later,
                   extend_vocab=first)
    assert meta["source"]["extended_vocab_of"] == os.path.abspath(first)
    for f in ("user_id", "video_id", "author_id", "tag"):
        a = dict(pl.read_parquet(vocab_path(first, f)).select("raw_id", "row").iter_rows())
        b = dict(pl.read_parquet(vocab_path(later, f)).select("raw_id", "row").iter_rows())
        assert all(b[k] == v for k, v in a.items()), f
        assert sorted(b.values()) == list(range(2, 2 + len(b)))  # rows dense, none reused
    shutil.rmtree(os.path.join(first, "vocab"))
    with pytest.raises(DataError) as e:
        convert(RANDOM, USERS, VIDEOS, str(tmp_path / "bad"), extend_vocab=first)
    assert "user_id.parquet" in str(e.value) and "vocabulary to extend" in str(e.value)
    assert not os.path.exists(tmp_path / "bad")


def test_is_rand_outside_0_1_is_refused(tmp_path):
    bad = str(tmp_path / "log_random.csv")
    pl.read_csv(RANDOM).with_columns(pl.lit(2).alias("is_rand")).write_csv(bad)
    with pytest.raises(DataError) as e:
        convert(bad, USERS, VIDEOS, str(tmp_path / "o"))
    assert bad in str(e.value) and "is_rand" in str(e.value) and "not 0 or 1" in str(e.value)
    assert not os.path.exists(tmp_path / "o")


def test_a_log_without_is_rand_is_recorded_as_carrying_no_exposure_information(tmp_path):
    log = str(tmp_path / "log_old_export.csv")
    pl.read_csv(RANDOM).drop("is_rand").write_csv(log)
    meta = convert(log, USERS, VIDEOS, str(tmp_path / "o"))
    assert meta["has_is_rand"] is False and meta["source"]["is_rand_absent_in"] == [log]
    assert sum(d["random_exposure_rows"] for d in meta["days"].values()) == 0
