"""Conversion whatever the catalog's shape: the video feature file's unlogged videos, its order and the
chunking change nothing in the processed data set; a repeated video keeps its first row; the phase log."""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pytest

from data_tools.convert import convert, main as convert_main
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_files import LOG_FILE, USER_FILE, VIDEO_FILE

SMALL = dict(seed=3, n_users=200, n_videos=800, n_authors=100, n_music=50, n_tags=40,
             days=2, impressions_per_day=3000, latent_dim=4)
MIN_COUNT = {"video_id": 2}


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("catalog") / "raw")
    generate(GeneratorConfig(**SMALL), d)
    return d


def _files(d, videos=None):
    return os.path.join(d, LOG_FILE), os.path.join(d, USER_FILE), videos or os.path.join(d, VIDEO_FILE)


def _data_set(root):
    """Every frame (day files and vocabularies) and the meta file less its input paths."""
    meta = json.load(open(os.path.join(root, "meta.json")))
    for k in ("log", "users", "videos"):
        meta["source"].pop(k)
    frames = {os.path.relpath(os.path.join(d, n), root): pl.read_parquet(os.path.join(d, n))
              for d, _, names in os.walk(root) for n in names if n.endswith(".parquet")}
    return meta, frames


def _assert_same(a, b):
    (ma, fa), (mb, fb) = _data_set(a), _data_set(b)
    assert ma == mb
    assert sorted(fa) == sorted(fb) and len(fa) >= 8  # 2 days + 6 vocabularies
    for name in fa:
        assert fa[name].equals(fb[name]), name


def _catalog(raw, path, planted: int, order: str):
    """The video file with ``planted`` videos no log row mentions (ids after the largest, values copied
    from logged ones), its rows in ``order``: 'file', 'reversed' or 'shuffled'."""
    videos = pl.read_csv(os.path.join(raw, VIDEO_FILE), infer_schema=False)
    top = int(videos["video_id"].cast(pl.Int64).max())
    extra = videos.sample(planted, with_replacement=True, seed=0).with_columns(
        pl.Series("video_id", [str(top + 1 + i) for i in range(planted)]))
    out = pl.concat([videos, extra])
    if order == "reversed":
        out = out.reverse()
    elif order == "shuffled":
        out = out.sample(fraction=1.0, shuffle=True, seed=1)
    out.write_csv(path)
    return path


def test_a_catalog_of_unlogged_videos_in_any_order_and_any_chunking_converts_to_the_same_data_set(raw, tmp_path):
    ref = str(tmp_path / "ref")
    convert(*_files(raw), ref, MIN_COUNT)
    for planted, order, chunk_rows in ((20_000, "file", 1_000_000), (5_000, "reversed", 700), (0, "shuffled", 400)):
        videos = _catalog(raw, str(tmp_path / f"videos_{planted}_{order}.csv"), planted, order)
        out = str(tmp_path / f"out_{planted}_{order}")
        convert(*_files(raw, videos), out, MIN_COUNT, chunk_rows=chunk_rows)
        _assert_same(ref, out)


def test_a_repeated_video_keeps_its_first_row_wherever_it_is_in_the_file(raw, tmp_path):
    # the first row of a logged video repeated at the file's end with other values: allowed once, the first
    # row's values are the ones the day files carry
    videos = pl.read_csv(os.path.join(raw, VIDEO_FILE), infer_schema=False)
    logged = pl.read_csv(os.path.join(raw, LOG_FILE), infer_schema=False)["video_id"][0]
    first = videos.filter(pl.col("video_id") == logged)
    assert first.height == 1
    other = first.with_columns(pl.lit("999999").alias("author_id"))
    path = str(tmp_path / "videos.csv")
    pl.concat([videos.reverse(), other]).write_csv(path)  # the original row now comes late, the copy last
    out = str(tmp_path / "out")
    meta = convert(*_files(raw, path), out, MIN_COUNT, max_conflicting_duplicates=1)
    joins = meta["source"]["joins"]
    assert joins["duplicate_video_ids"] == 1 and joins["conflicting_video_ids"] == 1
    ref = str(tmp_path / "ref")
    convert(*_files(raw), ref, MIN_COUNT)
    (_, fa), (_, fb) = _data_set(ref), _data_set(out)  # the meta's joins differ; the frames must not
    assert all(fa[n].equals(fb[n]) for n in fa)
    vocab = pl.read_parquet(os.path.join(out, "vocab", "author_id.parquet"))
    assert 999999 not in vocab["raw_id"].to_list()


def test_unmatched_log_videos_are_counted_and_one_is_named(raw, tmp_path):
    videos = pl.read_csv(os.path.join(raw, VIDEO_FILE), infer_schema=False)
    log = pl.read_csv(os.path.join(raw, LOG_FILE), infer_schema=False)
    dropped = log["video_id"][5]
    path = str(tmp_path / "videos.csv")
    videos.filter(pl.col("video_id") != dropped).write_csv(path)
    rows = int((log["video_id"] == dropped).sum())
    meta = convert(*_files(raw, path), str(tmp_path / "ok"), MIN_COUNT, max_unmatched_fraction=0.5)
    assert meta["source"]["joins"]["unmatched_video_rows"] == rows
    first_unmatched = log.filter(pl.col("video_id") == dropped)["video_id"][0]
    assert convert_main([f"log={_files(raw)[0]}", f"users={_files(raw)[1]}", f"videos={path}",
                         f"data.root={tmp_path / 'refused'}", "max_unmatched=0"]) == 2
    with pytest.raises(Exception, match=f"e.g. {first_unmatched}\\).*max_unmatched=FRACTION"):
        convert(*_files(raw, path), str(tmp_path / "refused2"), MIN_COUNT, max_unmatched_fraction=0.0)


def test_the_command_prints_each_phase_and_the_whole_peak(raw, tmp_path, capfd):
    out = str(tmp_path / "out")
    assert convert_main([f"log={_files(raw)[0]}", f"users={_files(raw)[1]}", f"videos={_files(raw)[2]}",
                         f"data.root={out}"]) == 0
    text = capfd.readouterr().out
    phases = [line for line in text.splitlines() if line.startswith("phase ")]
    names = [line.split(":")[0][len("phase "):] for line in phases]
    assert names == ["validate raw", "check joins", "typed log", "user table", "video table", "id vocabularies",
                     "day files", "validate processed"]
    peaks = [float(line.split("peak RSS ")[1].split()[0]) for line in phases]
    last = [line for line in text.splitlines() if line.startswith("peak RSS ")]
    assert len(last) == 1 and float(last[0].split()[2]) >= max(peaks) > 50
    assert np.all(np.array(peaks) > 0)
