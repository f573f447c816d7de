"""The learning-rate recovery pipeline end to end on tiny data: its artifacts and its resumability."""
import json
import os
import sys

import pytest

from conftest import REPO, read_json, run_command
from studies.lr_recovery import VARIANTS


def _study(out, data_cache):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "studies.lr_recovery", "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1",
           "--out", str(out), "--docs", str(out), "--grid-points", "2", "--max-extensions", "0", "--starts", "tuned", "all_low", "--seeds", "0"]
    return run_command(cmd, env=env, timeout=1200)


@pytest.mark.slow  # 4 grid runs and every contender from 2 starts; `make test-all` runs it
def test_recovery_study_writes_its_table_and_resumes(tmp_path, tiny_dataset, data_cache):
    out = tmp_path / "study"
    proc = _study(out, data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = read_json(out / "lr_recovery.json")
    assert len(r["grid"]) == 4 and all(g["ne"] is not None for g in r["grid"])
    best = min(r["grid"], key=lambda g: g["ne"])
    assert (r["best_cell"]["embedding"], r["best_cell"]["dense"], r["best_cell"]["ne"]) == \
        (best["embedding"], best["dense"], best["ne"])
    assert r["optimum_interior"] is False  # a 2 x 2 grid is all edge
    assert set(r["starts"]) == {"tuned", "all_low"}
    for start in r["starts"].values():
        assert set(start["variants"]) == set(VARIANTS) and isinstance(start["misset"], bool)
        hdet = start["variants"]["hdet"]
        assert hdet["seeds"] == 1 and hdet["diverged"] == 0 and hdet["paired_diff"]["ci95"] is None
        assert hdet["lr_area"][0]["embedding"] > 0 and hdet["lr_area"][0]["dense"] > 0
    # The tuned plain run trains at the best cell's point with the same seed: the same run.
    assert r["starts"]["tuned"]["variants"]["plain"]["ne"] == pytest.approx(best["ne"], abs=2e-3)
    assert os.path.getsize(out / "lr_recovery.png") > 10_000
    assert "| all_low |" in (out / "lr_recovery.md").read_text()
    again = _study(out, data_cache)
    assert again.returncode == 0 and "CRASHED" not in again.stdout
    assert again.stdout.count("skipped (finished earlier)") == 4 + 2 * len(VARIANTS)
    assert read_json(out / "lr_recovery.json")["starts"] == r["starts"]
    # --report-only trains nothing and, with every run finished, reports the same.
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    report = run_command([sys.executable, "-m", "studies.lr_recovery", "--out", str(out), "--docs", str(tmp_path),
                             "--grid-points", "2", "--max-extensions", "0", "--starts", "tuned", "all_low", "--seeds", "0",
                             "--report-only"],
                            env=env, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "partial" not in report.stdout
    assert read_json(tmp_path / "lr_recovery.json")["starts"] == r["starts"]


# ----------------------------------------------------------------------------------------------
# The plateau, the misset rule, the paired intervals and the growth rule, on synthetic results lines.


def _line(i, j, seed, ne, points=5):
    """A plain grid run's results line at grid cell (i, j); ``ne`` None: diverged."""
    from studies.lr_recovery import DENSE, GRID_CENTRE, grid_lr

    e, d = grid_lr(GRID_CENTRE["embedding"], points, i), grid_lr(GRID_CENTRE["dense"], points, j)
    return {"name": f"grid/e{i}_d{j}/seed{seed}", "seed": seed, "status": "diverged" if ne is None else "completed",
            "mean_ne": ne, "max_lr": {"embedding": e, **{g: d for g in DENSE}}}


def _records(cells):
    """{(i, j): [NE per seed 0, 1, ...]} -> results lines."""
    lines = [_line(i, j, seed, ne) for (i, j), nes in cells.items() for seed, ne in enumerate(nes)]
    return {r["name"]: r for r in lines}


BEST = [0.780, 0.782, 0.778]
# Around the best cell (2, 2), 3 seeds: (1, 2) is 0.002 worse with a paired std of 0.001 (out), (2, 1)
# 0.001 worse with 0.002 (in); their pooled paired std is sqrt((2 x 0.001^2 + 2 x 0.002^2) / 4).
# One seed: (3, 2) +0.0015 (in), (1, 1) +0.0017 (out), (2, 3) +0.0010 (within, but a diagonal
# neighbour of the diverged (3, 4)).
SYNTHETIC = {(2, 2): BEST, (1, 2): [b + d for b, d in zip(BEST, (0.001, 0.003, 0.002))],
             (2, 1): [b + d for b, d in zip(BEST, (0.001, 0.003, -0.001))],
             (3, 2): [0.7815], (1, 1): [0.7817], (2, 3): [0.7810], (3, 4): [None]}
POOLED = ((2 * 0.001 ** 2 + 2 * 0.002 ** 2) / 4) ** 0.5


def test_the_plateau_is_within_one_paired_std_of_the_best_cell_and_away_from_divergence():
    from studies.lr_recovery import plain_cells, plateau_analysis

    cells = plain_cells(_records(SYNTHETIC))
    assert cells[(3, 4)].diverged and cells[(2, 2)].mean == pytest.approx(0.78)
    an = plateau_analysis(cells)
    assert an["best"] == (2, 2)
    assert an["pooled_std"] == pytest.approx(POOLED, rel=1e-9) and sorted(an["pool"]) == [(1, 2), (2, 1)]
    assert an["stats"][(1, 2)]["diff"] == pytest.approx(0.002) and an["stats"][(1, 2)]["std"] == pytest.approx(0.001)
    assert an["stats"][(3, 2)]["std"] == pytest.approx(POOLED)  # one seed: the pooled std
    assert sorted(an["plateau"]) == [(2, 1), (2, 2), (3, 2)]
    assert an["near_diverged"] == [(2, 3)]
    assert an["interior"] is True and an["missing_neighbours"] == []
    # Without (3, 2) the best cell has no neighbour above it on the embedding axis: not interior.
    an = plateau_analysis(plain_cells(_records({k: v for k, v in SYNTHETIC.items() if k != (3, 2)})))
    assert an["interior"] is False and an["missing_neighbours"] == [(3, 2)]
    # Only the best cell has several seeds: no paired std, so no plateau yet.
    an = plateau_analysis(plain_cells(_records({(2, 2): BEST, (1, 2): [0.79]})))
    assert an["pooled_std"] is None and an["plateau"] is None


def test_the_growth_rule_grows_beyond_the_edge_then_seeds_the_plateau():
    from studies.lr_recovery import next_runs, plain_cells

    def grid(best, extra=None):
        """A 3 x 3 grid, one seed, NE rising with the distance from ``best``."""
        nes = {(i, j): [0.80 + 0.001 * (abs(i - best[0]) + abs(j - best[1]))] for i in range(3) for j in range(3)}
        return {**nes, **(extra or {})}

    seeds = (0, 1, 2)
    assert next_runs(plain_cells({}), seeds) == []  # nothing finished: the initial grid comes first
    # The best on the low embedding edge: the point beyond it, first seed.
    assert next_runs(plain_cells(_records(grid((0, 1)))), seeds) == [(-1, 1, 0)]
    # In a corner: beyond both edges.
    assert next_runs(plain_cells(_records(grid((2, 2)))), seeds) == [(3, 2, 0), (2, 3, 0)]
    # The point beyond diverged: the best is bracketed, so the seeds come next, on the best cell and
    # (no paired std yet) the runner-up, (0, 0) before (0, 2) and (1, 1) at equal NE.
    bracketed = grid((0, 1), {(-1, 1): [None]})
    assert next_runs(plain_cells(_records(bracketed)), seeds) == [(0, 1, 1), (0, 1, 2), (0, 0, 1), (0, 0, 2)]
    # Interior from the start: seeds on the best and the runner-up; then the runner-up's paired std
    # (diffs .001 .003 0: std 0.00153) makes the best's 3 other neighbours (+0.001, one seed) plateau
    # cells, to be seeded; the corners (+0.002) are out.
    interior = grid((1, 1))
    assert next_runs(plain_cells(_records(interior)), seeds) == [(1, 1, 1), (1, 1, 2), (0, 1, 1), (0, 1, 2)]
    seeded = {**interior, (1, 1): [0.800, 0.801, 0.799], (0, 1): [0.801, 0.804, 0.799]}
    assert next_runs(plain_cells(_records(seeded)), seeds) == [(1, 0, 1), (1, 0, 2), (1, 2, 1), (1, 2, 2),
                                                               (2, 1, 1), (2, 1, 2)]
    done = {**seeded, **{k: [0.800, 0.803, 0.799] for k in ((1, 0), (1, 2), (2, 1))}}
    assert next_runs(plain_cells(_records(done)), seeds) == []  # satisfied
    # A best cell found beyond the old edge starts the growth again.
    moved = {**done, (3, 1): [0.790]}
    assert next_runs(plain_cells(_records(moved)), seeds) == [(4, 1, 0), (3, 0, 0), (3, 2, 0)]


def test_paired_intervals():
    from studies.lr_recovery import paired

    p = paired([0.01, 0.02, 0.03])
    half = 4.303 * 0.01 / 3 ** 0.5
    assert p["mean"] == pytest.approx(0.02) and p["ci95"] == pytest.approx([0.02 - half, 0.02 + half], rel=1e-9)
    assert paired([0.01]) == {"mean": 0.01, "ci95": None, "n": 1} and paired([]) is None


def _runs(*nes, lr=None):
    """A contender's runs as the study keeps them: an NE, or None for a diverged seed."""
    return [{"seed": k, "status": "diverged" if ne is None else "completed", "ne": ne, "wall_seconds": 1.0,
             "lr_area": lr[k] if lr else None, "bases": None, "run": f"x/seed{k}"} for k, ne in enumerate(nes)]


def test_misset_paired_differences_and_gap_closed_against_the_plateau():
    from studies.lr_recovery import plain_cells, plateau_analysis, summarize_start

    best = [0.78, 0.79, 0.77]
    cells = plain_cells(_records({(2, 2): best, (1, 2): [0.79, 0.802, 0.784]}))  # paired diffs .010 .012 .014
    an = plateau_analysis(cells)
    assert an["pooled_std"] == pytest.approx(0.002)
    lr_range = {"embedding": [1.0, 10.0], "dense": [0.001, 0.01]}
    inside, outside = {"embedding": 3.0, "dense": 0.005}, {"embedding": 0.3, "dense": 0.005}
    # Plain 0.02 worse than the best on every seed: 10 std, misset. HDET gains 0.01 on two seeds and
    # diverges on the third (NE 1): paired diffs -0.01, -0.01, +0.21.
    s = summarize_start({"plain": _runs(0.80, 0.81, 0.79, lr=[outside] * 3),
                         "hdet": _runs(0.79, 0.80, None, lr=[inside, outside, inside]),
                         "hdet_paper": _runs(0.80, 0.81, 0.79)}, cells, an, lr_range, {"embedding": 0.3, "dense": 0.005})
    assert s["misset"] and s["plain_minus_best_in_std"] == pytest.approx(10.0)
    plain, hdet = s["variants"]["plain"], s["variants"]["hdet"]
    assert plain["paired_diff"]["mean"] == pytest.approx(0.02) and plain["gap_closed"] is None
    assert hdet["paired_diff"]["mean"] == pytest.approx(0.19 / 3)
    half = 4.303 * (0.0484 / 3) ** 0.5 / 3 ** 0.5  # stdev of (-0.01, -0.01, 0.21): sqrt(0.0484 / 3)
    assert hdet["paired_diff"]["ci95"] == pytest.approx([0.19 / 3 - half, 0.19 / 3 + half], rel=1e-6)
    assert hdet["gap_closed"] == pytest.approx((-0.19 / 3) / 0.02)
    assert hdet["diverged"] == 1 and hdet["seeds"] == 3 and hdet["ne"] == pytest.approx(0.795)
    # LR areas in the plateau's range: completed seeds only (seed 2 diverged).
    assert hdet["lr_area_in_plateau"] == {"embedding": 1, "dense": 2}
    assert s["variants"]["hdet_paper"]["gap_closed"] == pytest.approx(0.0)
    # Plain 0.005 worse: 2.5 std, under 3: not misset, no gap closed.
    s = summarize_start({"plain": _runs(0.785, 0.795, 0.775), "hdet": _runs(0.78, 0.79, 0.77),
                         "hdet_paper": _runs(0.78, 0.79, 0.77)}, cells, an, lr_range, inside)
    assert not s["misset"] and s["plain_minus_best_in_std"] == pytest.approx(2.5)
    assert s["variants"]["hdet"]["gap_closed"] is None
    assert s["variants"]["hdet"]["paired_diff"]["mean"] == pytest.approx(-0.005)
    assert s["variants"]["hdet"]["lr_area_in_plateau"] == {"embedding": 0, "dense": 0}  # no LR areas recorded


def test_the_committed_study_report_from_its_results_file(tmp_path):
    """docs/lr_recovery_f2/results.jsonl rebuilds the committed report's key figures (no training)."""
    from studies.lr_recovery import render_markdown, study
    from studies.harness import StudyFiles

    files = StudyFiles.open(os.path.join(REPO, "docs", "lr_recovery_f2"), str(tmp_path))
    r = study(files, [0, 1, 2], [], report_only=True)
    committed = read_json(os.path.join(REPO, "docs", "lr_recovery.json"))
    # Complete, or partial exactly as the committed report says (contenders added and still running).
    assert r.get("partial") == committed.get("partial")
    as_json = lambda x: json.loads(json.dumps(x))
    for key in ("best_cell", "optimum_interior", "growth_next", "plateau"):
        assert committed[key] == as_json(r[key]), key
    assert {s: v["misset"] for s, v in r["starts"].items()} == {s: v["misset"] for s, v in committed["starts"].items()}
    # The misset starts are the ones with a 10x-off group; the tuned start is on the plateau.
    assert not r["starts"]["tuned"]["misset"] and r["starts"]["all_low"]["misset"]
    r.update(command="c", machine="m")
    expected = "The optimum is interior" if r["optimum_interior"] else "The optimum is NOT interior"
    assert expected in render_markdown(r)
