"""The learning-rate recovery pipeline end to end on tiny data: its artifacts and its resumability."""
import os
import subprocess
import sys

import pytest

from conftest import REPO, read_json


def _study(out, data_cache):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "pipelines.lr_recovery", "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1",
           "--out", str(out), "--docs", str(out), "--grid-points", "2", "--max-extensions", "0", "--starts", "tuned", "all_low", "--seeds", "0"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow  # ten training runs; `make test-all` runs it
def test_recovery_study_writes_its_table_and_resumes(tmp_path, tiny_dataset, data_cache):
    out = tmp_path / "study"
    proc = _study(out, data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = read_json(out / "lr_recovery.json")
    assert len(r["grid"]) == 4 and all(g["ne"] is not None for g in r["grid"])
    best = min(r["grid"], key=lambda g: g["ne"])
    assert r["grid_optimum"] == {"embedding": best["embedding"], "dense": best["dense"], "ne": best["ne"],
                                 "interior": False}  # a 2 x 2 grid is all edge
    assert set(r["starts"]) == {"tuned", "all_low"}
    for start in r["starts"].values():
        assert {"plain_ne", "hdet_ne", "gap_closed", "final_base_over_optimum", "diverged", "seeds"} <= set(start)
        assert start["seeds"] == 1 and start["diverged"] == 0
        assert set(start["final_base_over_optimum"]) == {"embedding", "dense"}
        assert all(v > 0 for v in start["final_base_over_optimum"].values())
    # The tuned plain run trains at the grid optimum's point with the same seed.
    assert r["starts"]["tuned"]["plain_ne"] == pytest.approx(best["ne"], abs=2e-3)
    assert os.path.getsize(out / "lr_recovery.png") > 10_000
    assert "| all_low |" in (out / "lr_recovery.md").read_text()
    again = _study(out, data_cache)
    assert again.returncode == 0 and "CRASHED" not in again.stdout
    assert again.stdout.count("skipped (finished earlier)") == 10
    assert read_json(out / "lr_recovery.json")["starts"] == r["starts"]
    # --report-only trains nothing and, with every run finished, reports the same.
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    report = subprocess.run([sys.executable, "-m", "pipelines.lr_recovery", "--out", str(out), "--docs", str(tmp_path),
                             "--grid-points", "2", "--max-extensions", "0", "--starts", "tuned", "all_low", "--seeds", "0",
                             "--report-only"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "partial" not in report.stdout
    assert read_json(tmp_path / "lr_recovery.json")["starts"] == r["starts"]


def _grid(nes):
    """A grid dict as the study keeps it, from {(i, j): NE or None (diverged)}."""
    return {k: {"ne": v, "finished": True} for k, v in nes.items()}


def test_the_grid_grows_beyond_the_edge_that_holds_its_optimum():
    from pipelines.lr_recovery import edge_extensions

    base = {(i, j): 1.0 + abs(i - 1) + abs(j - 1) for i in range(3) for j in range(3)}
    assert edge_extensions(_grid(base)) == []  # optimum (1, 1) is interior
    low_emb = {**base, (0, 1): 0.5}
    assert edge_extensions(_grid(low_emb)) == [(-1, 0), (-1, 1), (-1, 2)]
    corner = {**base, (2, 2): 0.5}  # the optimum's neighbours beyond both edges, and the diagonal
    assert sorted(edge_extensions(_grid(corner))) == [(1, 3), (2, 3), (3, 1), (3, 2), (3, 3)]
    # The added line diverged everywhere: the optimum is interior to the explored grid again.
    grown = {**low_emb, (-1, 0): None, (-1, 1): None, (-1, 2): None}
    assert edge_extensions(_grid(grown)) == []


def _runs(*nes):
    """A variant's runs as the study keeps them: an NE, or None for a diverged seed."""
    return [{"seed": k, "status": "diverged" if ne is None else "completed", "ne": ne, "wall_seconds": 1.0,
             "bases": None, "dir": f"s{k}"} for k, ne in enumerate(nes)]


def test_a_diverged_run_counts_as_the_base_rate_predictor_in_the_gap_closed():
    from pipelines.lr_recovery import summarize_start

    optimum = {"embedding": 1.0, "dense": 0.01, "ne": 0.78}
    # Every plain seed diverged, HDET completed two of three: the gap is 1.0 - 0.78 = 0.22 and HDET's
    # mean over its three seeds is (0.79 + 0.80 + 1.0) / 3, so it closed (1 - 0.8633) / 0.22.
    s = summarize_start({"plain": _runs(None, None, None), "hdet": _runs(0.79, 0.80, None),
                         "hdet_paper": _runs(None, None, None)}, optimum)
    assert s["plain_ne"] is None and s["plain_diverged"] == 3 and s["plain_ne_for_gap"] == 1.0 and not s["no_gap"]
    assert s["hdet_ne"] == pytest.approx(0.795) and s["diverged"] == 1
    assert s["hdet_ne_over_optimum"] == pytest.approx(0.015)
    assert s["gap_closed"] == pytest.approx((1.0 - (0.79 + 0.80 + 1.0) / 3) / 0.22)
    assert s["paper_gap_closed"] == pytest.approx(0.0) and s["paper_ne"] is None
    # With nothing diverged the gap is the plain means' as before.
    s = summarize_start({"plain": _runs(0.80, 0.82), "hdet": _runs(0.79, 0.79), "hdet_paper": _runs(0.81, 0.81)},
                        optimum)
    assert s["gap_closed"] == pytest.approx((0.81 - 0.79) / (0.81 - 0.78))
    assert s["paper_gap_closed"] == pytest.approx(0.0, abs=1e-12)
    # Plain runs no worse than the grid optimum: no gap, so no share of it closed.
    s = summarize_start({"plain": _runs(0.77, 0.78), "hdet": _runs(0.79, 0.79), "hdet_paper": _runs(0.81, 0.81)},
                        optimum)
    assert s["no_gap"] and s["gap_closed"] is None and s["paper_gap_closed"] is None
