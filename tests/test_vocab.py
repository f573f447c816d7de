"""Exact id vocabularies (data_tools.vocab): no collisions at KuaiRand's id ranges, extendable without remapping."""
import polars as pl
import pytest

from data_tools.vocab import FIRST_ROW, OOV_ROW, build_vocab, coverage, table_rows

# Published sizes: KuaiRand-Pure 27,285 users x 7,583 videos; -1K 1,000 users x 4,369,953 videos;
# -27K 27,285 users x 32,038,725 videos. Their ids are sequential from 0.
PURE_USERS, PURE_VIDEOS, K1_VIDEOS, K27_VIDEOS = 27_285, 7_583, 4_369_953, 32_038_725


def _sequential(n: int, days: int = 1) -> pl.LazyFrame:
    return pl.int_range(0, n, eager=True).alias("raw_id").to_frame().with_columns(
        date=(pl.col("raw_id") % days) + 20220408).lazy()


@pytest.mark.parametrize("n", [PURE_USERS, PURE_VIDEOS, K1_VIDEOS])
def test_sequential_ids_get_one_row_each(n):
    occ = _sequential(n, days=3)
    vocab = build_vocab(occ)
    c = coverage(vocab, occ)
    assert c["distinct_raw_ids"] == n and c["distinct_rows"] == n
    assert c["collision_rate"] == 0.0 and c["oov_ids"] == 0
    assert table_rows(vocab) == n + FIRST_ROW
    assert vocab["row"].to_list() == list(range(FIRST_ROW, n + FIRST_ROW))


@pytest.mark.slow  # 32M ids: about 30 s on 2 cores
def test_kuairand_27k_video_ids_get_one_row_each():
    occ = _sequential(K27_VIDEOS)
    c = coverage(build_vocab(occ), occ)
    assert c["distinct_rows"] == K27_VIDEOS and c["collision_rate"] == 0.0


def test_rows_follow_first_appearance_and_rare_ids_share_the_oov_row():
    occ = pl.DataFrame({"raw_id": [50, 7, 7, 9, 50, 3, 3, 3, None],
                        "date": [2, 1, 1, 1, 2, 3, 3, 3, 1]}).lazy()
    vocab = build_vocab(occ, min_count=2)
    # 7 (first seen day 1, twice), 50 (day 2, twice), 3 (day 3); 9 is seen once: out of vocabulary.
    assert dict(zip(vocab["raw_id"], vocab["row"])) == {7: 2, 50: 3, 3: 4}
    c = coverage(vocab, occ)
    assert (c["distinct_raw_ids"], c["oov_ids"], c["oov_impressions"]) == (4, 1, 1)
    assert c["collision_rate"] == 0.0  # one OOV id shares its row with nobody
    with pytest.raises(ValueError, match="min_count"):
        build_vocab(occ, min_count=0)


def test_extending_keeps_every_row_and_appends_new_ids():
    first = build_vocab(pl.DataFrame({"raw_id": [5, 1, 9], "date": [1, 1, 2]}).lazy())
    later = pl.DataFrame({"raw_id": [9, 2, 40, 40, 1], "date": [3, 3, 4, 4, 3]}).lazy()
    extended = build_vocab(later, base=first)
    old = dict(zip(first["raw_id"], first["row"]))
    new = dict(zip(extended["raw_id"], extended["row"]))
    assert all(new[k] == v for k, v in old.items())  # 5 is not in the later days: it keeps its row
    assert new[2] == max(old.values()) + 1 and new[40] == max(old.values()) + 2
    assert dict(zip(extended["raw_id"], extended["count"]))[5] == 0
    assert OOV_ROW not in new.values()
