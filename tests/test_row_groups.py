"""Layout 2 and data.read=own_row_groups: day files cut into row groups of a fixed size, each training
rank reading only the groups dealt to it (issue 38, item 2)."""

import json
import os
import shutil

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from data_tools.relayout import main as relayout_main
from data_tools.relayout import relayout
from recsys_hdet.components import day_arrays
from recsys_hdet.components.dataloader import ParquetBatchStream
from recsys_hdet.components.dataset import DatasetMeta, RowHoldout, deal_row_groups, split_days

KEYS = ["time_ms", "user_id_raw", "video_id_raw"]
GROUP = 500  # the tiny data set's 12,000-row days in 24 row groups


@pytest.fixture(scope="module")
def grouped(tiny_dataset, tmp_path_factory):
    """A copy of the tiny data set rewritten in layout 2 with row groups of GROUP rows."""
    root = str(tmp_path_factory.mktemp("grouped") / "tiny")
    shutil.copytree(tiny_dataset, root)
    relayout(root, GROUP)
    return root


def _keys(batches):
    return [tuple(int(b.extras[k][i]) for k in KEYS) for b in batches for i in range(len(b.labels))]


def _stream(meta, rank, world, days, **kw):
    return ParquetBatchStream(meta, days, 64, rank, world, seed=3, extras=KEYS, **kw)


def test_relayout_keeps_every_row_in_order_and_whole_day_reads_are_unchanged(tiny_dataset, grouped):
    old, new = DatasetMeta.load(tiny_dataset), DatasetMeta.load(grouped)
    assert new.layout == {"version": 2, "row_group_rows": GROUP}
    for day in old.days:
        assert pl.read_parquet(old.day_path(day)).equals(pl.read_parquet(new.day_path(day)))
        sizes = new.row_groups(day)
        assert sizes[:-1] == [GROUP] * (len(sizes) - 1) and 0 < sizes[-1] <= GROUP and len(sizes) == 24
    days, _ = split_days(old, eval_days=1)
    for rank in range(2):  # the bench studies' streams do not depend on the layout
        a = list(_stream(old, rank, 2, days, reserve_rows=100))
        b = list(_stream(new, rank, 2, days, reserve_rows=100))
        assert len(a) == len(b) and all(torch.equal(x.dense, y.dense) and torch.equal(x.sparse.values(), y.sparse.values())
                                        for x, y in zip(a, b))
    assert relayout(grouped, GROUP)["layout"] == new.layout  # a second run changes nothing


@pytest.mark.parametrize("holdout", [None, RowHoldout(0.2, seed=1)])
def test_ranks_read_only_their_row_groups_disjoint_rows_and_identical_reserved_rows(grouped, monkeypatch, holdout):
    meta = DatasetMeta.load(grouped)
    days, _ = split_days(meta, eval_days=1, holdout=holdout is not None)
    world, reserve = 3, 300
    read_groups = []
    original = day_arrays.read_share

    def recording(meta_, day, columns, share):
        read_groups.append((day, list(share.groups)))
        return original(meta_, day, columns, share)

    monkeypatch.setattr(day_arrays, "read_share", recording)
    streams = [_stream(meta, r, world, days, reserve_rows=reserve, holdout=holdout, read="own_row_groups")
               for r in range(world)]
    assert len({len(s) for s in streams}) == 1 and len(streams[0]) > 0, "every rank runs the same steps"
    trained, reserved = [], {}
    for s in streams:
        assert all(s.batches_in_day(d) == streams[0].batches_in_day(d) for d in days)
        batches = list(s)
        rows = _keys(batches)
        assert len(rows) == len(set(rows)) == len(batches) * 64
        trained.append(set(rows))
        # the reserved rows of each day: after the day's last step
        step = 0
        for day in days:
            step += s.batches_in_day(day)
            reserved.setdefault(day, []).append(_keys(s.reserved_batches(128, trained_steps=step)))
    for a in range(world):
        for b in range(a + 1, world):
            assert not trained[a] & trained[b], "ranks train on disjoint rows"
    everything = set().union(*trained)
    kept_total = sum(streams[0].rows_in_day(d) for d in days)
    for day in days:
        assert all(r == reserved[day][0] for r in reserved[day]) and len(reserved[day][0]) == reserve
        assert not set(reserved[day][0]) & everything, "reserved rows are never trained on"
    # dropped: what the smallest rank cannot fill, a batch at most per rank plus the ranks' spread
    dropped = kept_total - len(everything) - reserve * len(days)
    assert 0 <= dropped < len(days) * world * (64 + 2 * GROUP)
    if holdout is not None:
        held = set()
        for day in days:
            held |= set(_keys(ParquetBatchStream(meta, [day], 64, 0, 1, 0, shuffle_within_day=False, pad_last=True,
                                                 extras=KEYS, holdout=holdout, part="holdout")))
        assert not held & everything
    # each rank read about a third of each day's 24 groups: 7 dealt + the 3 shared
    per_rank_day = {}
    for day, groups in read_groups:
        per_rank_day.setdefault(day, []).append(len(groups))
    assert max(max(v) for v in per_rank_day.values()) <= 24 // world + world + 1


def test_own_row_groups_resumes_exactly_and_is_deterministic(grouped):
    meta = DatasetMeta.load(grouped)
    days, _ = split_days(meta, eval_days=1)
    s = _stream(meta, 1, 2, days, reserve_rows=100, read="own_row_groups")
    it = iter(s)
    for _ in range(s.batches_in_day(days[0]) + 3):  # across a day boundary
        next(it)
    state = s.state_dict()
    rest = list(it)
    resumed = _stream(meta, 1, 2, days, reserve_rows=100, read="own_row_groups")
    resumed.load_state_dict(state)
    again = list(resumed)
    assert state["day_index"] == 1 and len(rest) == len(again) > 0
    for a, b in zip(rest, again):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse.values(), b.sparse.values()) and torch.equal(a.sparse.lengths(), b.sparse.lengths())
    other_seed = ParquetBatchStream(meta, days, 64, 1, 2, seed=4, extras=KEYS, reserve_rows=100, read="own_row_groups")
    assert _keys(list(other_seed)[:1]) != _keys(list(_stream(meta, 1, 2, days, reserve_rows=100,
                                                              read="own_row_groups"))[:1])


def test_deal_partitions_the_kept_rows_and_reserves_the_tail():
    rng = np.random.default_rng(0)
    sizes = [100] * 9 + [37]
    kept = rng.random(sum(sizes)) < 0.9
    world, batch, reserve = 4, 16, 50
    shares = [deal_row_groups(kept, sizes, r, world, batch, reserve, seed=7, day="20220101") for r in range(world)]
    assert len({s.batches for s in shares}) == 1 and shares[0].batches == min(shares[0].rows_per_rank) // batch
    trained = [s.rows[: s.batches * batch] for s in shares]
    reserved = [s.rows[s.batches * batch:] for s in shares]
    assert all(np.array_equal(r, reserved[0]) for r in reserved) and len(reserved[0]) == reserve
    allrows = np.concatenate(trained + [reserved[0]])
    assert len(np.unique(allrows)) == len(allrows) and kept[allrows].all(), "disjoint, kept rows only"
    assert kept.sum() - len(allrows) == sum(n - shares[0].batches * batch for n in shares[0].rows_per_rank)
    starts = np.cumsum([0] + sizes)
    for s in shares:  # a rank reads the groups its rows are in: its dealt ones and the shared ones
        assert set(np.searchsorted(starts, s.rows, side="right") - 1) <= set(s.groups)
        assert len(s.groups) <= 10 // world + world
        counted = deal_row_groups(kept, sizes, 0, world, batch, reserve, seed=7, day="20220101", rows=False)
        assert counted.batches == s.batches and counted.rows is None
    unshuffled = deal_row_groups(np.ones(200, dtype=bool), [50] * 4, 0, 1, 10, 0, 0, "20220101", shuffle=False)
    assert np.array_equal(unshuffled.rows, np.arange(200))


def test_own_row_groups_on_a_layout_1_data_set_is_refused_with_the_command(tiny_dataset, tmp_path, capsys):
    root = str(tmp_path / "tiny")
    shutil.copytree(tiny_dataset, root)
    meta_path = os.path.join(root, "meta.json")
    with open(meta_path) as f:
        m = json.load(f)
    m.pop("layout", None)  # as written before layout 2
    with open(meta_path, "w") as f:
        json.dump(m, f)
    meta = DatasetMeta.load(root)
    with pytest.raises(ValueError, match=r"layout version 1.*python -m data_tools\.relayout data\.root=" + root):
        _stream(meta, 0, 2, list(meta.days)[:1], read="own_row_groups")
    _stream(meta, 0, 1, list(meta.days)[:1], read="own_row_groups", pad_last=True)  # evaluation reads whole days
    assert relayout_main([f"data.root={root}", "row_group_rows=0"]) == 2 and "row_group_rows" in capsys.readouterr().err
    assert relayout_main([f"data.root={root}", "row_group_rows=4000"]) == 0
    meta = DatasetMeta.load(root)
    assert meta.layout == {"version": 2, "row_group_rows": 4000}
    assert pq.read_metadata(meta.day_path(list(meta.days)[0])).num_row_groups == 3
    _stream(meta, 0, 2, list(meta.days)[:1], read="own_row_groups")


def test_own_row_groups_with_standard_exposure_never_reads_a_random_exposure_row(grouped):
    meta = DatasetMeta.load(grouped)
    days, _ = split_days(meta, eval_days=1)
    world = 2
    streams = [ParquetBatchStream(meta, days, 64, r, world, seed=3, extras=["is_rand"], exposure="standard",
                                  read="own_row_groups") for r in range(world)]
    flags = torch.cat([b.extras["is_rand"] for s in streams for b in s])
    standard = sum(streams[0].rows_in_day(d) for d in days)
    assert len(flags) > 0 and int(flags.abs().sum()) == 0
    assert standard - len(flags) < len(days) * world * (64 + 2 * GROUP)  # only what the ranks cannot fill


DAYS = ["20220408", "20220409", "20220410", "20220411", "20220412"]


def _deal(day, world, reserve, sizes=(100,) * 24, seed=7):
    kept = np.ones(sum(sizes), dtype=bool)
    return [deal_row_groups(kept, list(sizes), r, world, 16, reserve, seed=seed, day=day) for r in range(world)]


def test_each_day_deals_its_row_groups_in_its_own_order_each_to_one_rank():
    m, world = 24, 3
    starts = np.arange(m + 1) * 100
    firsts = {}
    for day in DAYS:
        shares = _deal(day, world, reserve=0)
        # deterministic: the same arguments deal the same groups and the same rows (a resumed job)
        for s, again in zip(shares, _deal(day, world, reserve=0)):
            assert np.array_equal(s.groups, again.groups) and np.array_equal(s.rows, again.rows)
        # 24 groups, 3 ranks, nothing reserved: every group read by exactly one rank, 8 each
        read = np.concatenate([s.groups for s in shares])
        assert sorted(read) == list(range(m)) and all(len(s.groups) == m // world for s in shares), day
        for s in shares:  # a rank's rows come from its own groups only
            assert set(np.searchsorted(starts, s.rows, side="right") - 1) <= set(s.groups)
        firsts[day] = tuple(shares[0].groups)
        # with reserved rows: the tail's groups are shared (read by every rank), every other group by one
        shares = _deal(day, world, reserve=250)
        counts = np.bincount(np.concatenate([s.groups for s in shares]), minlength=m)
        shared = np.flatnonzero(counts == world)
        assert set(counts) <= {1, world} and 3 <= len(shared) < 3 + world, (day, counts)
        assert all(set(shared) <= set(s.groups) for s in shares)
    # for one seed, each day its own deal (a fixed order would give a rank the same part of every day)
    assert len(set(firsts.values())) == len(DAYS), firsts
    assert tuple(_deal(DAYS[0], world, 0, seed=8)[0].groups) != firsts[DAYS[0]]


def test_the_stream_deals_each_day_by_its_own_date(grouped):
    # What ParquetBatchStream reads under own_row_groups: each day's groups dealt by that day's date,
    # to exactly one rank (24 groups, 2 ranks, nothing reserved), the same for a rebuilt stream.
    meta = DatasetMeta.load(grouped)
    days = sorted(meta.days)  # all 3 of the tiny data set's days
    assert len(days) == 3
    streams = [_stream(meta, r, 2, days, read="own_row_groups") for r in range(2)]
    dealt = {}
    for day in days:
        shares = [s._share(day, rows=False) for s in streams]
        assert sorted(np.concatenate([s.groups for s in shares])) == list(range(24)), day
        assert [list(s.groups) for s in shares] == [list(_stream(meta, r, 2, days, read="own_row_groups")
                                                         ._share(day, rows=False).groups) for r in range(2)]
        expected = deal_row_groups(np.ones(sum(meta.row_groups(day)), dtype=bool), meta.row_groups(day), 0, 2, 64, 0,
                                   seed=3, day=day, rows=False)
        assert list(shares[0].groups) == list(expected.groups), day
        dealt[day] = tuple(shares[0].groups)
    assert len(set(dealt.values())) == len(days), dealt
