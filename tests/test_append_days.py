"""Data sets that grow by whole days: the generator's prefix stability, append_synthetic_days,
append.append_days (in place, ids keep their rows, old files untouched, crash-safe) and the rule
by which ensure_dataset keeps an appended data set."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading

import polars as pl
import pytest

import data_tools.append as C
from data_tools.append import append_days
from data_tools.convert import main as convert_main
from data_tools.errors import DataError
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_files import LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE
from data_tools.generate import main as generate_main
from data_tools.id_vocabs import resolve_min_count
from data_tools.prepare import _existing, append_synthetic_days, ensure_dataset, load_oracle
from data_tools.validate import validate_processed
from data_tools.vocab import ID_FEATURES, vocab_path

GEN = dict(seed=5, n_users=200, n_videos=600, n_authors=100, n_music=60, n_tags=30, days=2,
           impressions_per_day=1500, latent_dim=4)
DAY3, DAY4 = "20220410", "20220411"


def _build(tmp_path, name="ds", **over):
    root = str(tmp_path / name)
    ensure_dataset(root, dict(GEN, **over), {})
    return root


def _snapshot(*dirs) -> dict:
    """Every file under the directories (lock files aside): path -> bytes."""
    out = {}
    for d in dirs:
        for base, _, files in os.walk(d):
            for f in files:
                p = os.path.join(base, f)
                with open(p, "rb") as fh:
                    out[p] = fh.read()
    return out


def _meta(root):
    with open(os.path.join(root, "meta.json")) as f:
        return json.load(f)


def _day(root, day):
    return pl.read_parquet(os.path.join(root, f"day={day}.parquet"))


def _day_log(tmp_path, day, days=3) -> str:
    """The raw log of one day of the longer generation, as a converter input file."""
    full = str(tmp_path / f"gen{days}")
    if not os.path.isdir(full):
        generate(dict(GEN, days=days), full)
    out = str(tmp_path / f"log_{day}.csv")
    pl.read_csv(os.path.join(full, LOG_FILE), infer_schema=False).filter(pl.col("date") == str(day)).write_csv(out)
    return out


def _raw_inputs(root):
    raw = _meta(root)["source"]["raw_dir"]
    return os.path.join(raw, USER_FILE), os.path.join(raw, VIDEO_FILE)


# ---- generator -------------------------------------------------------------------------------------
def test_generator_first_days_do_not_depend_on_days(tmp_path):
    a, b, c = (str(tmp_path / x) for x in "abc")
    oa, ob = generate(dict(GEN, days=2), a), generate(dict(GEN, days=3), b)
    oc = generate(dict(GEN, days=3), c, from_day=2)
    read = lambda d, f: open(os.path.join(d, f), "rb").read()  # noqa: E731
    la, lb, lc = read(a, LOG_FILE), read(b, LOG_FILE), read(c, LOG_FILE)
    assert lb.startswith(la) and len(lb) > len(la)  # the first two days, row for row
    header = la.split(b"\n", 1)[0] + b"\n"
    assert lc == header + lb[len(la):]  # from_day writes only the later days
    for f in (USER_FILE, VIDEO_FILE):
        assert read(a, f) == read(b, f) == read(c, f), f
    assert oa == {k: v for k, v in ob.items() if k != DAY3} and oc == {DAY3: ob[DAY3]}
    with pytest.raises(DataError, match="from_day"):
        generate(dict(GEN, days=2), str(tmp_path / "d"), from_day=2)


# ---- append_synthetic_days ----------------------------------------------------------------------------
def test_appended_day_equals_a_longer_generation(tmp_path):
    root = _build(tmp_path)
    old_meta = _meta(root)
    old_days = {d: open(os.path.join(root, s["file"]), "rb").read() for d, s in old_meta["days"].items()}
    old_vocab = {f: pl.read_parquet(vocab_path(root, f)) for f in ID_FEATURES}

    assert append_synthetic_days(root, 1) == [DAY3]
    meta = validate_processed(root)
    ref = _build(tmp_path, "ref", days=3)  # the same config generated with 3 days from the start
    ref_meta = _meta(ref)

    # the new day, the vocabularies and every derived meta field are what a full conversion gives
    assert _day(root, DAY3).equals(_day(ref, DAY3))
    for f in ID_FEATURES:
        assert pl.read_parquet(vocab_path(root, f)).equals(pl.read_parquet(vocab_path(ref, f))), f
    for k in ("sparse", "days", "ids", "has_oracle", "has_is_rand"):
        assert meta[k] == ref_meta[k], k
    for k in ("string_vocabs", "missing_values", "min_count"):
        assert meta["source"][k] == ref_meta["source"][k], k
    assert load_oracle(root) == load_oracle(ref)

    # old day files byte-identical; existing ids keep their rows; tables grow
    for d, data in old_days.items():
        assert open(os.path.join(root, old_meta["days"][d]["file"]), "rb").read() == data, d
    for f in ID_FEATURES:
        new = pl.read_parquet(vocab_path(root, f))
        assert new.select("raw_id", "row").head(old_vocab[f].height).equals(old_vocab[f].select("raw_id", "row"))
        assert meta["sparse"][f]["vocab"] >= old_meta["sparse"][f]["vocab"]
    assert meta["sparse"]["video_id"]["vocab"] > old_meta["sparse"]["video_id"]["vocab"]

    # provenance: the generated config is kept, the appended days are listed
    src = meta["source"]
    assert src["generator"] == old_meta["source"]["generator"] and src["appended_days"] == [DAY3]
    raw = src["raw_dir"]
    assert src["appended"][-1]["log"] == [os.path.join(raw, f"log_synthetic_{DAY3}.csv")]
    assert sorted(os.listdir(raw)) == sorted([LOG_FILE, USER_FILE, VIDEO_FILE, ORACLE_FILE,
                                              "generator_config.json", f"log_synthetic_{DAY3}.csv"])
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # no stage left behind


def test_appending_two_days_twice_and_concurrently(tmp_path):
    root = _build(tmp_path)
    out = []
    threads = [threading.Thread(target=lambda: out.append(append_synthetic_days(root, 1))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == [[DAY3], [DAY4]]  # the lock serialized them: each got the next day
    meta = validate_processed(root)
    assert sorted(meta["days"]) == ["20220408", "20220409", DAY3, DAY4]
    assert meta["source"]["appended_days"] == [DAY3, DAY4] and len(meta["source"]["appended"]) == 2
    ref = _build(tmp_path, "ref", days=4)
    assert _day(root, DAY4).equals(_day(ref, DAY4))
    assert meta["ids"] == _meta(ref)["ids"] and load_oracle(root) == load_oracle(ref)


def test_ensure_dataset_keeps_an_appended_data_set(tmp_path, capsys):
    root = _build(tmp_path)
    assert generate_main([f"data.root={root}", "append=true", "days=2"]) == 0
    assert f"{DAY3}, {DAY4}" in capsys.readouterr().out
    mtime = os.path.getmtime(os.path.join(root, "meta.json"))
    for days in (2, 3, 4):  # generated 2 <= requested <= 2 + 2 appended: usable as it is
        assert ensure_dataset(root, dict(GEN, days=days), {}) == root
    assert capsys.readouterr().out == ""
    assert os.path.getmtime(os.path.join(root, "meta.json")) == mtime
    assert len(validate_processed(root)["days"]) == 4
    # fewer days than generated, more than it holds, another field: not usable (regenerated)
    for over in (dict(days=1), dict(days=5), dict(seed=6)):
        assert _existing(root, GeneratorConfig(**dict(GEN, **over)), resolve_min_count({}))[0] is False, over
    with pytest.raises(SystemExit):
        generate_main([f"data.root={root}", "append=true", "seed=3"])  # the data set's own config is used


# ---- convert.append_days ----------------------------------------------------------------------------
def test_convert_append_refuses_a_day_it_has_and_an_earlier_one(tmp_path, capsys):
    root = _build(tmp_path)
    users, videos = _raw_inputs(root)
    day3, day4 = _day_log(tmp_path, 20220410, days=4), _day_log(tmp_path, 20220411, days=4)
    append = [f"data.root={root}", "append=true", f"users={users}", f"videos={videos}"]
    assert convert_main([*append, f"log={day4}"]) == 0
    assert "appended" in capsys.readouterr().out
    before = _snapshot(root)
    assert convert_main([*append, f"log={day4}"]) == 2
    err = capsys.readouterr().err
    assert DAY4 in err and "already in this data set" in err
    with pytest.raises(DataError, match=f"day {DAY3} .* before the data set's last day {DAY4}"):
        append_days(day3, users, videos, root)
    assert _snapshot(root) == before
    with pytest.raises(SystemExit):  # the data set's vocabularies and min_count are kept
        convert_main([*append, f"log={day3}", "min_count.user_id=2"])


def test_convert_append_keeps_string_codes_and_requires_oracle(tmp_path):
    root = _build(tmp_path)
    users, videos = _raw_inputs(root)
    log = _day_log(tmp_path, 20220410)
    no_oracle = str(tmp_path / "no_oracle.csv")
    pl.read_csv(log, infer_schema=False).drop("oracle_like").write_csv(no_oracle)
    with pytest.raises(DataError, match="oracle"):
        append_days(no_oracle, users, videos, root)
    # a new user snapshot with a value never seen (sorting first): existing values keep their codes
    new_users = str(tmp_path / "users_new.csv")
    u = pl.read_csv(users, infer_schema=False)
    u.with_columns(pl.when(pl.col("user_id").cast(pl.Int64) % 2 == 0).then(pl.lit("aaa_new"))
                   .otherwise(pl.col("user_active_degree")).alias("user_active_degree")).write_csv(new_users)
    old = _meta(root)
    meta = append_days(log, new_users, videos, root)
    values = old["source"]["string_vocabs"]["user_active_degree"]
    assert meta["source"]["string_vocabs"]["user_active_degree"] == values + ["aaa_new"]
    assert meta["sparse"]["user_active_degree"]["vocab"] == old["sparse"]["user_active_degree"]["vocab"] + 1
    d = _day(root, DAY3)
    even = d.filter(pl.col("user_id_raw") % 2 == 0)["user_active_degree"].unique().to_list()
    assert even == [len(values) + 1]
    odd = d.filter(pl.col("user_id_raw") % 2 == 1)["user_active_degree"].unique().to_list()
    assert set(odd) <= set(range(1, len(values) + 1))
    validate_processed(root)


def test_failed_append_leaves_the_data_set_unchanged(tmp_path, monkeypatch):
    root = _build(tmp_path)
    raw = _meta(root)["source"]["raw_dir"]
    users, videos = _raw_inputs(root)
    before = _snapshot(root, raw)
    # a corrupt log: cut off mid-line
    cut = str(tmp_path / "cut.csv")
    text = open(_day_log(tmp_path, 20220410)).read()
    with open(cut, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(DataError, match="cut off"):
        append_days(cut, users, videos, root)
    assert _snapshot(root, raw) == before

    # a failure after staging (validation of the new files) and one at the commit point, after the
    # day, vocabulary, oracle and raw log files were moved into place: both rolled back
    def boom(*a, **k):
        raise OSError("injected failure")

    for target in ("validate_day_file", "_commit_meta"):
        with monkeypatch.context() as m:
            m.setattr(C, target, boom)
            with pytest.raises(OSError, match="injected"):
                append_synthetic_days(root, 1)
        assert _snapshot(root, raw) == before, target
    assert append_synthetic_days(root, 1) == [DAY3]  # and it still appends


def _append_killed_at_commit(root):
    import data_tools.append as conv
    from data_tools.prepare import append_synthetic_days as append

    conv._commit_meta = lambda *a: os._exit(3)  # killed after every file but meta.json was moved
    append(root, 1)


def test_killed_append_is_rolled_back_by_the_next(tmp_path):
    root = _build(tmp_path)
    before_meta = open(os.path.join(root, "meta.json"), "rb").read()
    before_vocab = open(vocab_path(root, "video_id"), "rb").read()
    p = mp.get_context("spawn").Process(target=_append_killed_at_commit, args=(root,))
    p.start()
    p.join(120)
    assert p.exitcode == 3
    # the kill left the stage and the moved files; meta.json (what readers go by) is the old one
    assert [n for n in os.listdir(root) if n.startswith(C.APPEND_STAGE_PREFIX)]
    assert open(vocab_path(root, "video_id"), "rb").read() != before_vocab
    assert open(os.path.join(root, "meta.json"), "rb").read() == before_meta
    assert sorted(validate_processed(root)["days"]) == ["20220408", "20220409"]
    # the next append rolls the half-published one back first, then appends cleanly
    assert append_synthetic_days(root, 1) == [DAY3]
    assert not [n for n in os.listdir(root) if n.startswith(".")]
    ref = _build(tmp_path, "ref", days=3)
    for f in ID_FEATURES:
        assert pl.read_parquet(vocab_path(root, f)).equals(pl.read_parquet(vocab_path(ref, f))), f
    assert validate_processed(root)["ids"] == _meta(ref)["ids"]


def test_an_appended_day_is_cut_into_the_data_sets_row_groups(tmp_path):
    # A data set in row groups shorter than its days (relaid out to 400 rows): the appended day is
    # written in the groups meta.json's layout records, not the converter's default.
    import pyarrow.parquet as pq

    from data_tools.relayout import relayout

    root = _build(tmp_path)
    relayout(root, 400)
    assert append_synthetic_days(root, 1) == [DAY3]
    meta = validate_processed(root)
    assert meta["layout"] == {"version": 2, "row_group_rows": 400}
    rows = meta["days"][DAY3]["rows"]
    footer = pq.ParquetFile(os.path.join(root, meta["days"][DAY3]["file"])).metadata
    sizes = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
    assert rows > 2 * 400 and sizes == [400] * (rows // 400) + ([rows % 400] if rows % 400 else []), sizes
