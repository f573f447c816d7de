"""The synthetic generator streams (issue 48): days written one at a time equal the days simulated in
memory and written at once, skipped days (``from_day``) are not simulated yet leave the later days
bit for bit those of a full run, the catalog's pieces (CHUNK_ROWS) change no byte, and the files are
the ones the generator wrote before it streamed."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import polars as pl
import pytest

import data_tools.synthetic_day as synthetic_day
import data_tools.synthetic_files as synthetic_files
import data_tools.synthetic_world as synthetic_world
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_day import DaySimulation
from data_tools.synthetic_files import LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE
from data_tools.synthetic_world import build_world

# small, several days, strong drift and more random exposure than the default
GEN = dict(seed=3, n_users=300, n_videos=1200, n_authors=150, n_music=80, n_tags=40, days=4,
           impressions_per_day=3000, latent_dim=6, drift=0.2, rand_fraction=0.1)
FILES = (LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE)

# sha256 of GEN's files as written by the generator before it streamed (every day simulated and held,
# then one write_csv; from_day's days simulated in full): data_tools.synthetic at f5ce098 plus the
# uncommitted split into synthetic_{config,world,day,files}, numpy 2.4.6, polars 2.1.0, x86-64.
BEFORE_STREAMING = {
    0: {LOG_FILE: "1966437fce7298b3af5f0a6e3ef1ad5062f5ce90df05329901a2d0e0a24c8627",
        ORACLE_FILE: "142d942d72a8bf47a9ba18362479638bf4203938d28e261ba896fd2962246ba5",
        USER_FILE: "c7870d67ca54f9361bb942b3092c1ff5743794bba8a62daed5884b9fa6a31607",
        VIDEO_FILE: "a966bf47514f8fea26bc6c98fd41d1b5b9beeecdfde928a191949ebb7c4facbd"},
    2: {LOG_FILE: "1cf9274bcdae3cb4eaf1708faa93603beb431d6467d9065a328c7fbb8fc7d49e",
        ORACLE_FILE: "11556f038f20938e904a408b617bc60cae880e5fc38c8b329208de96cf1c0c7b",
        USER_FILE: "c7870d67ca54f9361bb942b3092c1ff5743794bba8a62daed5884b9fa6a31607",
        VIDEO_FILE: "a966bf47514f8fea26bc6c98fd41d1b5b9beeecdfde928a191949ebb7c4facbd"},
}


def _read(d: str, name: str) -> bytes:
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("full"))
    generate(GEN, d)
    return d


def test_streamed_days_equal_the_days_simulated_in_memory(full, tmp_path):
    cfg = GeneratorConfig(**GEN)
    rng = np.random.default_rng(cfg.seed)
    simulation = DaySimulation(cfg, build_world(cfg, rng), rng)
    days = [simulation.next_day() for _ in range(cfg.days)]
    ref = str(tmp_path / "in_memory.csv")
    pl.concat([log for _, log, _ in days]).write_csv(ref)
    with open(ref, "rb") as f:
        assert _read(full, LOG_FILE) == f.read()
    with open(os.path.join(full, ORACLE_FILE)) as f:
        assert json.load(f) == {date: oracle for date, _, oracle in days}


@pytest.mark.parametrize("from_day", [1, 2, 3])
def test_skipped_days_are_not_simulated_and_leave_the_later_days_of_a_full_run(full, tmp_path, monkeypatch,
                                                                               from_day):
    drawn = []
    impressions = DaySimulation._impressions
    monkeypatch.setattr(DaySimulation, "_impressions",
                        lambda self, day: drawn.append(day) or impressions(self, day))
    d = str(tmp_path / "late")
    oracle = generate(GEN, d, from_day=from_day)
    # day 0's impressions are drawn for the calibration; no other skipped day's
    assert drawn == [0] + list(range(from_day, GEN["days"]))
    full_log = _read(full, LOG_FILE)
    header, rows = full_log.split(b"\n", 1)[0] + b"\n", full_log.split(b"\n")[1:-1]
    first = from_day * GEN["impressions_per_day"]
    assert _read(d, LOG_FILE) == header + b"".join(r + b"\n" for r in rows[first:])
    with open(os.path.join(full, ORACLE_FILE)) as f:
        full_oracle = json.load(f)
    assert oracle == {k: full_oracle[k] for k in sorted(full_oracle)[from_day:]}
    for name in (USER_FILE, VIDEO_FILE):
        assert _read(d, name) == _read(full, name)


def test_pieces_of_rows_change_no_byte(full, tmp_path, monkeypatch):
    for module in (synthetic_world, synthetic_day, synthetic_files):
        monkeypatch.setattr(module, "CHUNK_ROWS", 97)  # tag means, drift and video rows in many pieces
    d = str(tmp_path / "pieces")
    generate(GEN, d)
    for name in FILES:
        assert _read(d, name) == _read(full, name), name


@pytest.mark.skipif((np.__version__, pl.__version__) != ("2.4.6", "2.1.0"),
                    reason="the recorded hashes are of numpy 2.4.6 and polars 2.1.0's output")
@pytest.mark.parametrize("from_day", sorted(BEFORE_STREAMING))
def test_files_are_those_written_before_streaming(full, tmp_path, from_day):
    d = full if from_day == 0 else str(tmp_path / "late")
    if from_day:
        generate(GEN, d, from_day=from_day)
    got = {name: hashlib.sha256(_read(d, name)).hexdigest() for name in FILES}
    assert got == BEFORE_STREAMING[from_day]
