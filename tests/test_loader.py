import os
import shutil

import numpy as np
import polars as pl
import pytest
import torch

from data_tools.schema import OUTCOME_COLUMNS
from recsys_hdet.components.dataset import DatasetMeta, split_days
from recsys_hdet.components.dataloader import ParquetBatchStream

KEYS = ["time_ms", "user_id_raw", "video_id_raw"]


def _stream(meta, rank=0, world=1, seed=0, days=None, **kw):
    days = days if days is not None else list(meta.days)
    return ParquetBatchStream(meta, days, batch_size=64, rank=rank, world_size=world, seed=seed, **kw)


def _row_keys(batches):
    return {tuple(int(b.extras[k][i]) for k in KEYS) for b in batches for i in range(len(b.labels))}


def test_ranks_read_disjoint_slices_of_one_pass(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    world = 3
    streams = [_stream(meta, rank=r, world=world, extras=KEYS) for r in range(world)]
    per_rank = [list(s) for s in streams]
    assert len({len(b) for b in per_rank}) == 1, "every rank must run the same number of steps"
    keys = [_row_keys(b) for b in per_rank]
    for a in range(world):
        for b in range(a + 1, world):
            assert not keys[a] & keys[b]
    total_rows = sum(d["rows"] for d in meta.days.values())
    seen = sum(len(k) for k in keys)
    # Only the remainder of each day that cannot fill a global batch is dropped.
    assert total_rows - len(meta.days) * 64 * world < seen <= total_rows


def test_a_rank_that_reads_only_its_rows_gets_the_rows_one_rank_reads_at_their_positions(tiny_dataset):
    """Rank r of W keeps only its own rows of a day; its batch i must be, bit for bit, the one-rank
    stream's batch i * W + r (the same stream order), and its reserved rows the one-rank stream's."""
    meta = DatasetMeta.load(tiny_dataset)
    days, _ = split_days(meta, eval_days=1)
    reserve = 100

    def fields(b):
        return [b.dense, b.labels, b.sparse.values(), b.sparse.lengths(), *(b.extras[k] for k in KEYS)]

    one = _stream(meta, days=days, extras=KEYS, reserve_rows=reserve)
    one_batches, one_reserved, step = {}, {}, 0
    for day_index, day in enumerate(days):
        for i, b in enumerate(one._make_batch(one._read_day(day_index), j) for j in range(one.batches_in_day(day))):
            one_batches[(day, i)] = b
        step += one.batches_in_day(day)
        one_reserved[day] = one.reserved_batches(64, trained_steps=step)
    world = 3
    for r in range(world):
        s = _stream(meta, rank=r, world=world, days=days, extras=KEYS, reserve_rows=reserve)
        step, it = 0, iter(s)
        for day in days:
            n = s.batches_in_day(day)
            assert n > 0
            for i in range(n):
                b, ref = next(it), one_batches[(day, i * world + r)]
                assert all(torch.equal(x, y) for x, y in zip(fields(b), fields(ref))), (r, day, i)
            step += n
            got = s.reserved_batches(64, trained_steps=step)
            assert len(got) == len(one_reserved[day])
            assert all(torch.equal(x, y) for g, o in zip(got, one_reserved[day]) for x, y in zip(fields(g), fields(o)))


def test_eval_padding_scores_every_row_once(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    day = list(meta.days)[-1]
    world = 2
    seen = []
    for r in range(world):
        for b in _stream(meta, rank=r, world=world, days=[day], pad_last=True, shuffle_within_day=False, extras=KEYS):
            seen += [tuple(int(b.extras[k][i]) for k in KEYS) for i in torch.nonzero(b.mask).flatten().tolist()]
    assert len(seen) == meta.days[day]["rows"]
    assert len(set(seen)) == len(seen)


def test_deterministic_for_a_seed_and_shuffled_by_it(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    a = next(iter(_stream(meta, seed=1)))
    b = next(iter(_stream(meta, seed=1)))
    c = next(iter(_stream(meta, seed=2)))
    assert torch.equal(a.dense, b.dense) and torch.equal(a.sparse.values(), b.sparse.values())
    assert torch.equal(a.labels, b.labels)
    assert not torch.equal(a.dense, c.dense)


def test_position_saves_and_restores(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    s = _stream(meta, world=2, rank=1)
    it = iter(s)
    first_day_batches = s.batches_in_day(list(meta.days)[0])
    for _ in range(first_day_batches + 3):  # cross a day boundary
        next(it)
    state = s.state_dict()
    expected = next(it)
    resumed = _stream(meta, world=2, rank=1)
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    assert state["day_index"] == 1
    assert torch.equal(expected.dense, got.dense)
    assert torch.equal(expected.sparse.values(), got.sparse.values())
    assert torch.equal(expected.sparse.lengths(), got.sparse.lengths())
    remaining = sum(1 for _ in it)
    assert remaining == sum(1 for _ in resumed)


def test_batch_layout_matches_meta(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    b = next(iter(_stream(meta)))
    assert b.sparse.keys() == meta.single_features + meta.multi_features
    assert b.dense.shape == (64, len(meta.dense)) and b.dense.dtype == torch.float32
    assert b.labels.shape == (64, 3)
    jt = b.sparse.to_dict()
    for name in meta.single_features:
        assert torch.all(jt[name].lengths() == 1)
        assert int(jt[name].values().max()) < meta.sparse[name]["vocab"]
    tag = jt["tag"]
    assert int(tag.lengths().sum()) == tag.values().numel()


def test_loader_never_feeds_labels_oracle_or_outcomes_as_features(tiny_dataset, tmp_path):
    meta = DatasetMeta.load(tiny_dataset)
    features = set(meta.sparse) | set(meta.dense)
    forbidden = {c for c in pl.read_parquet_schema(meta.day_path(list(meta.days)[0]))
                 if c.startswith(("label_", "oracle_")) or c.endswith("_raw")} | set(OUTCOME_COLUMNS)
    assert forbidden and not features & forbidden

    # Rewrite the labels and oracle columns: the features the model sees must not change.
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dataset, copy)
    rng = np.random.default_rng(0)
    for day, info in meta.days.items():
        path = copy / info["file"]
        df = pl.read_parquet(path)
        df = df.with_columns(
            [pl.Series(c, rng.integers(0, 2, df.height).astype(np.float32)) for c in df.columns if c.startswith("label_")]
            + [pl.Series(c, rng.random(df.height).astype(np.float32)) for c in df.columns if c.startswith("oracle_")]
        )
        df.write_parquet(path)
    original = next(iter(_stream(meta, seed=3)))
    changed = next(iter(_stream(DatasetMeta.load(str(copy)), seed=3)))
    assert torch.equal(original.dense, changed.dense)
    assert torch.equal(original.sparse.values(), changed.sparse.values())
    assert not torch.equal(original.labels, changed.labels)


def test_split_days_needs_a_training_and_a_held_out_day(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    train, held = split_days(meta, 1)
    assert train == list(meta.days)[:-1] and held == list(meta.days)[-1:]
    with pytest.raises(ValueError, match="data.eval_days=3"):
        split_days(meta, 3)


def test_probe_rows_are_the_same_on_every_rank_never_trained_on_and_never_held_out(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    train_days, eval_days = split_days(meta, eval_days=1)
    world, reserve = 2, 500
    streams = [_stream(meta, rank=r, world=world, days=train_days, extras=KEYS, reserve_rows=reserve)
               for r in range(world)]
    trained = [set() for _ in range(world)]
    probes = {}  # day -> per-rank probe row keys
    iterators = [iter(s) for s in streams]
    for step, batches in enumerate(zip(*iterators), start=1):
        for r, (s, b) in enumerate(zip(streams, batches)):
            trained[r] |= _row_keys([b])
            day = s.days[s._day_index]
            probes.setdefault(day, [None] * world)[r] = _row_keys(s.reserved_batches(128, trained_steps=step))
    assert set(probes) == set(train_days)
    # Read ahead (as a train pipeline does), the rows are still those of the day of the step trained on.
    ahead = _stream(meta, rank=0, world=world, days=train_days, extras=KEYS, reserve_rows=reserve)
    first_day_batches = ahead.batches_in_day(train_days[0])
    it = iter(ahead)
    for _ in range(first_day_batches + 2):
        next(it)
    assert ahead.position_after(first_day_batches) == {"day_index": 0, "batch_index": first_day_batches}
    assert ahead.position_after(first_day_batches + 2) == ahead.state_dict() == {"day_index": 1, "batch_index": 2}
    assert _row_keys(ahead.reserved_batches(128, trained_steps=first_day_batches)) == probes[train_days[0]][0]
    assert _row_keys(ahead.reserved_batches(128, trained_steps=first_day_batches + 1)) == probes[train_days[1]][0]
    held_out = _row_keys(_stream(meta, days=eval_days, extras=KEYS, shuffle_within_day=False, pad_last=True))
    for day, per_rank in probes.items():
        assert len(per_rank[0]) == reserve and all(p == per_rank[0] for p in per_rank), "identical on every rank"
        assert not per_rank[0] & (trained[0] | trained[1]), "probe rows are never trained on"
        assert not per_rank[0] & held_out, "probe rows never come from a held-out day"


def test_dense_inputs_are_standardized_with_the_training_days_only(tiny_dataset):
    from recsys_hdet.components.dataset import DenseNormalization

    meta = DatasetMeta.load(tiny_dataset)
    train, held_out = split_days(meta, 1)
    norm = DenseNormalization.from_days(meta, train)
    # The training rows come out centred and scaled (missing values count as the mean, 0).
    raw = pl.concat([pl.read_parquet(meta.day_path(d), columns=meta.dense) for d in train])
    batches = list(_stream(meta, days=train, normalization=norm, pad_last=True, shuffle_within_day=False))
    x = torch.cat([b.dense[b.mask] for b in batches]).double()
    assert x.shape[0] == raw.height and torch.isfinite(x).all()
    for i, name in enumerate(meta.dense):
        col = raw[name].cast(pl.Float64)
        if col.drop_nulls().std() and col.drop_nulls().std() > 1e-6:
            # mean over the present values is 0; the std over them is 1
            present = x[:, i][torch.from_numpy(col.is_not_null().to_numpy())]
            assert abs(float(present.mean())) < 1e-4 and abs(float(present.std(unbiased=False)) - 1) < 1e-4, name
        assert norm.mean[i] == pytest.approx(float(col.drop_nulls().mean() or 0.0), rel=1e-9, abs=1e-12), name
    # A held-out day's values change nothing: the statistics are the training days'.
    changed = {**meta.days, held_out[0]: {**meta.days[held_out[0]], "dense_stats": {
        c: {"count": 1, "sum": 1e9, "sumsq": 1e18} for c in meta.dense}}}
    meta2 = DatasetMeta(meta.root, meta.sparse, meta.dense, meta.tasks, changed, meta.has_oracle, meta.source)
    assert DenseNormalization.from_days(meta2, train) == norm
    assert DenseNormalization.from_days(meta2, list(meta.days)) != norm
    # Missing values (null in the file) become exactly 0 and their indicator is 1 before scaling.
    name = "aspect_ratio"  # the generator's zero-height videos have none
    assert raw[name].null_count() > 0
    i = meta.dense.index(name)
    assert (x[:, i][torch.from_numpy(raw[name].is_null().to_numpy())] == 0).all()


def test_row_holdout_is_never_trained_on_and_is_what_evaluation_scores(tiny_dataset):
    """data.holdout: a fixed slice of every day, chosen by file position, never in a training
    stream (any layout), and exactly the rows a part="holdout" stream reads."""
    from recsys_hdet.components.dataset import RowHoldout

    meta = DatasetMeta.load(tiny_dataset)
    holdout = RowHoldout(0.1, seed=3)
    day = list(meta.days)[-1]
    rows = int(meta.days[day]["rows"])
    mask = holdout.mask(day, rows)
    assert 0.07 < mask.mean() < 0.13
    assert np.array_equal(mask, RowHoldout(0.1, seed=3).mask(day, rows))  # fixed
    assert not np.array_equal(mask, RowHoldout(0.1, seed=4).mask(day, rows))
    # Rows are identified by (time, user, video): unique in the tiny data set (checked).
    ids = ["time_ms", "user_id_raw", "video_id_raw"]
    keys = lambda b: list(zip(*(b.extras[c][b.mask].tolist() for c in ids)))
    file_keys = list(pl.read_parquet(meta.day_path(day), columns=ids).iter_rows())
    assert len(set(file_keys)) == rows
    held_keys = {k for k, h in zip(file_keys, mask) if h}
    seen = []
    for rank in range(2):
        train = ParquetBatchStream(meta, [day], 32, rank, 2, seed=5, shuffle_within_day=True, holdout=holdout,
                                   extras=ids)
        for b in train:
            seen += keys(b)
    assert len(seen) > 0.8 * rows and not (set(seen) & held_keys)
    assert train.rows_in_day(day) == rows - int(mask.sum())
    evaluated = ParquetBatchStream(meta, [day], 50, 0, 1, seed=0, shuffle_within_day=False, pad_last=True,
                                   holdout=holdout, part="holdout", extras=ids)
    assert [k for b in evaluated for k in keys(b)] == [k for k, h in zip(file_keys, mask) if h]


def test_split_days_until_and_holdout(tiny_dataset):
    meta = DatasetMeta.load(tiny_dataset)
    days = list(meta.days)
    assert split_days(meta, 1, until=days[1]) == (days[:1], [days[1]])
    # With a row holdout the evaluated day is a training day too (its other rows).
    assert split_days(meta, 1, until=days[1], holdout=True) == (days[:2], [days[1]])
    assert split_days(meta, 1, skip_days=1, train_days=1, until=days[1], holdout=True) == ([days[1]], [days[1]])
    with pytest.raises(ValueError, match="data.until=20990101"):
        split_days(meta, 1, until="20990101")


def test_the_next_day_is_read_in_the_background_and_the_batches_are_those_read_in_line(tiny_dataset, monkeypatch):
    import threading

    meta = DatasetMeta.load(tiny_dataset)
    stream = _stream(meta, days=sorted(meta.days)[:3], reserve_rows=128)
    readers = []
    original = ParquetBatchStream._read_day

    def recording(self, day_index):
        readers.append((day_index, threading.current_thread().name))
        return original(self, day_index)

    monkeypatch.setattr(ParquetBatchStream, "_read_day", recording)
    it = iter(stream)
    next(it)
    # While the first day's first batch is produced, the second day is already being read, off this thread.
    assert [d for d, _ in readers] == [0, 1] and all(name.startswith("day-reader") for _, name in readers)
    pipelined = [next(it) for _ in range(len(stream) - 1)]
    assert [d for d, _ in readers] == [0, 1, 2]
    in_line = [stream._make_batch(stream._read_day(i), b) for i, day in enumerate(stream.days)
               for b in range(stream.batches_in_day(day))][1:]
    assert len(pipelined) == len(in_line)
    for a, b in zip(pipelined, in_line):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse.values(), b.sparse.values()) and torch.equal(a.sparse.lengths(), b.sparse.lengths())


# -- every batch against a reference built row by row (issue 48, item 3) ----------------------------------
GROUP_ROWS = 500  # the tiny days' 12,000 rows in 24 row groups


@pytest.fixture(scope="module")
def planted(tiny_dataset, tmp_path_factory):
    """The tiny data set in row groups of GROUP_ROWS rows, with null and empty tag lists planted in every day."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_tools.relayout import relayout

    root = str(tmp_path_factory.mktemp("planted") / "tiny")
    shutil.copytree(tiny_dataset, root)
    relayout(root, GROUP_ROWS)
    for info in DatasetMeta.load(root).days.values():
        path = os.path.join(root, info["file"])
        table = pq.read_table(path)
        tags = table.column("tag").to_pylist()
        tags = [None if i % 97 == 5 else [] if i % 89 == 7 else t for i, t in enumerate(tags)]
        i = table.schema.get_field_index("tag")
        table = table.set_column(i, table.schema.field(i), pa.array(tags, type=table.schema.field(i).type))
        pq.write_table(table, path, row_group_size=GROUP_ROWS)
    return root


def _batch_digest(dense, values, lengths, labels, mask, keys, extras):
    import hashlib

    h = hashlib.sha256(repr(list(keys)).encode())
    for t in (dense, values, lengths, labels, mask, *extras):
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


class _ReferenceDay:
    """A day's batches the plain way: the whole file decoded in file order, every value taken row by row
    (Python lists for the tags), the dense inputs standardized as ``DenseNormalization.apply`` does (the
    whole [rows, D] array in float64); the stream order from the data set's rules (kept rows, the
    ``(seed, day)`` permutation, the rank's slice of each global batch; under own_row_groups the deal's rows)."""

    def __init__(self, meta, day, normalization):
        from data_tools.contract import label_column

        f = pl.read_parquet(meta.day_path(day))
        self.meta = meta
        self.ids = {n: f[n].to_list() for n in meta.single_features}
        self.lists = {n: [v or [] for v in f[n].to_list()] for n in meta.multi_features}
        dense = f.select(meta.dense).to_numpy().astype(np.float64)
        self.dense = normalization.apply(dense) if normalization is not None else \
            np.nan_to_num(dense, nan=0.0).astype(np.float32)
        self.labels = f.select([label_column(t) for t in meta.tasks]).to_numpy().astype(np.float32)
        self.extras = {k: f[k].to_numpy() for k in KEYS}

    def digest(self, rows, pad_row=None, size=None):
        """The batch of these file rows, padded to ``size`` with ``pad_row`` (masked out)."""
        rows = list(rows)
        mask = [True] * len(rows) + [False] * ((size or len(rows)) - len(rows))
        rows += [pad_row] * (len(mask) - len(rows))
        values = [self.ids[n][r] for n in self.meta.single_features for r in rows]
        values += [v for n in self.meta.multi_features for r in rows for v in self.lists[n][r]]
        lengths = [1] * (len(rows) * len(self.meta.single_features))
        lengths += [len(self.lists[n][r]) for n in self.meta.multi_features for r in rows]
        return _batch_digest(torch.from_numpy(self.dense[rows]), torch.tensor(values, dtype=torch.int64),
                             torch.tensor(lengths, dtype=torch.int32), torch.from_numpy(self.labels[rows]),
                             torch.tensor(mask), self.meta.single_features + self.meta.multi_features,
                             [torch.from_numpy(self.extras[k][rows]) for k in KEYS])


def _reference_digests(meta, stream, normalization):
    """Every batch's digest of the reference, the pass's batches then each day's reserved ones (in
    batches of 50 from the 3rd on)."""
    from recsys_hdet.components.dataset import deal_row_groups, kept_mask

    s, B, W, out = stream, stream.batch_size, stream.world_size, []
    for day in s.days:
        kept = kept_mask(meta, day, s.exposure, s.holdout, s.part)
        ref = _ReferenceDay(meta, day, normalization)
        if s.deals_row_groups:
            share = deal_row_groups(kept, meta.row_groups(day), s.rank, W, B, s.reserve_rows, s.seed, day, s.shuffle)
            own, order = share.rows[: share.batches * B], share.rows
            firsts = [i * B for i in range(share.batches)]
        else:
            order = np.flatnonzero(kept)
            if s.shuffle:
                order = order[np.random.default_rng([s.seed, int(day)]).permutation(len(order))]
            own = order[: len(order) - s.reserve_rows]
            n = -(-len(own) // (B * W)) if s.pad_last else len(own) // (B * W)
            firsts = [i * B * W + s.rank * B for i in range(n)]
        out += [ref.digest(own[f: f + B], pad_row=order[0], size=B) for f in firsts]
        if s.reserve_rows and firsts:
            reserved = order[len(order) - s.reserve_rows + 3:]
            out += [ref.digest(reserved[i: i + 50]) for i in range(0, len(reserved), 50)]
    return out


def _stream_digests(stream):
    out, step = [], 0
    it = iter(stream)
    for day in stream.days:
        n = stream.batches_in_day(day)
        out += [_batch_digest(b.dense, b.sparse.values(), b.sparse.lengths(), b.labels, b.mask, b.sparse.keys(),
                              [b.extras[k] for k in KEYS]) for b in (next(it) for _ in range(n))]
        step += n
        if stream.reserve_rows and n:
            out += [_batch_digest(b.dense, b.sparse.values(), b.sparse.lengths(), b.labels, b.mask, b.sparse.keys(),
                                  [b.extras[k] for k in KEYS])
                    for b in stream.reserved_batches(50, trained_steps=step, skip_rows=3)]
    assert next(it, None) is None
    return out


@pytest.mark.parametrize("read, rank, world, kw", [
    ("whole_day", 0, 1, {"raw": True}),
    ("whole_day", 1, 3, {"reserve_rows": 100}),
    ("whole_day", 1, 2, {"pad_last": True, "shuffle_within_day": False, "eval_days": True}),
    ("whole_day", 0, 2, {"holdout": 0.1, "exposure": "standard", "reserve_rows": 70}),
    ("whole_day", 0, 1, {"holdout": 0.1, "part": "holdout", "pad_last": True, "shuffle_within_day": False}),
    ("own_row_groups", 0, 4, {"reserve_rows": 100}),
    ("own_row_groups", 3, 4, {"raw": True}),
    ("own_row_groups", 1, 2, {"holdout": 0.1, "exposure": "standard", "reserve_rows": 30}),
    ("own_row_groups", 0, 1, {"shuffle_within_day": False}),
])
def test_every_batch_is_the_reference_batch_bit_for_bit(planted, read, rank, world, kw):
    """The loader's batches (dense inputs, KJT keys, values and lengths with their dtypes, labels, mask,
    extras), each hashed, equal the ones a plain row-by-row reading of the day file gives, in both read
    modes, with padding, reserved rows, a holdout and the standard exposure, null and empty tag lists,
    standardized dense inputs (raw: missing -> 0 only). The loader before issue 48's rewrite passed it too."""
    from recsys_hdet.components.dataset import DenseNormalization, RowHoldout

    meta = DatasetMeta.load(planted)
    kw = dict(kw)
    train, held = split_days(meta, 1)
    days = held if kw.pop("eval_days", False) else train
    if "holdout" in kw:
        kw["holdout"], days = RowHoldout(kw["holdout"], seed=3), list(meta.days)
    normalization = None if kw.pop("raw", False) else DenseNormalization.from_days(meta, train)
    stream = ParquetBatchStream(meta, days, 50 if world == 3 else 64, rank, world, seed=7, extras=KEYS,
                                normalization=normalization, read=read, **kw)
    got = _stream_digests(stream)
    expected = _reference_digests(meta, stream, normalization)
    assert len(got) == len(expected) > 0
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"batch {i} of {len(got)} differs from the reference"
