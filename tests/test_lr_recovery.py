"""The learning-rate recovery pipeline end to end on tiny data: its artifacts and its resumability."""
import json
import os
import sys

import pytest

from conftest import REPO, read_json, run_command
from studies.lr_recovery import CONTROLLER_STARTS, CONTROLLER_VARIANTS, VARIANTS


def _study(out, data_cache, *extra):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "studies.lr_recovery", "data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1",
           "--out", str(out), "--docs", str(out), "--anchor", "0.06", "0.003", "--max-rounds", "1",
           "--starts", "best", "all_low", "--seeds", "0", *extra]
    return run_command(cmd, env=env, timeout=2400)


@pytest.mark.slow  # the neighbourhood (9 runs) and every contender from 2 starts; `make test-all` runs it
def test_recovery_study_writes_its_table_and_resumes(tmp_path, tiny_dataset, data_cache):
    out = tmp_path / "study"
    proc = _study(out, data_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = read_json(out / "lr_recovery.json")
    assert len(r["grid"]) >= 9 and r["anchor"]["embedding"] == 0.06
    assert set(r["starts"]) == {"best", "all_low"}
    for start in r["starts"].values():
        assert set(start["variants"]) == set(VARIANTS) and isinstance(start["misset"], bool)
        hdet = start["variants"]["hdet"]
        assert hdet["seeds"] == 1 and hdet["paired_diff"] is None or hdet["paired_diff"]["ci95"] is None
        for runs in start["runs"].values():
            assert all(run["commit"] and run["clean"] is not None for run in runs)
    # The best start's plain run is the anchor cell's grid run: the same run.
    assert r["starts"]["best"]["runs"]["plain_rollback"][0]["run"] == "grid/e2_d2/seed0"
    finder = r["starts"]["best"]["runs"]["lr_finder"][0]["lr_finder"]
    assert set(finder["multiplier"]) == {"embedding", "dense"} and finder["sweeps"]["dense"]["steps"] > 0
    assert set(r["variants"]) == set(VARIANTS) and "failed" in r["variants"]["prodigy"]["best"]
    again = _study(out, data_cache)
    assert again.returncode == 0 and "CRASHED" not in again.stdout
    assert "skipped (finished earlier)" in again.stdout and read_json(out / "lr_recovery.json")["starts"] == r["starts"]


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


def test_the_plateau_is_within_one_pooled_paired_std_of_the_best_cell_and_away_from_failure():
    from studies.lr_recovery import plain_cells, plateau_analysis

    cells = plain_cells(_records(SYNTHETIC))
    assert cells[(3, 4)].failed and cells[(2, 2)].mean == pytest.approx(0.78)
    an = plateau_analysis(cells)
    assert an["best"] == (2, 2)
    assert an["pooled_std"] == pytest.approx(POOLED, rel=1e-9) and sorted(an["pool"]) == [(1, 2), (2, 1)]
    # (1, 2): +0.002 against the pooled std 0.00158 (its own std, 0.001, is not used): out.
    assert an["stats"][(1, 2)]["diff"] == pytest.approx(0.002) and not an["stats"][(1, 2)]["within"]
    assert sorted(an["plateau"]) == [(2, 1), (2, 2), (3, 2)]
    assert an["near_failed"] == [(2, 3)]
    # A steady cell whose own std is tiny but whose difference is within the pooled std is in; with a
    # cell's own std it would be out (0.0012 > its own 0.0001).
    steady = plateau_analysis(plain_cells(_records({**SYNTHETIC, (1, 3): [b + d for b, d in zip(BEST, (0.0011, 0.0012, 0.0013))]})))
    assert steady["pooled_std"] == pytest.approx(((2 * 0.001 ** 2 + 2 * 0.002 ** 2 + 2 * 0.0001 ** 2) / 6) ** 0.5)
    assert (1, 3) in steady["plateau"]
    # Only the best cell has several seeds: no paired std, so no plateau yet.
    an = plateau_analysis(plain_cells(_records({(2, 2): BEST, (1, 2): [0.79]})))
    assert an["pooled_std"] is None and an["plateau"] is None
    # A collapsed run (NE >= 0.999 on a task) makes its cell a failed one.
    line = _line(0, 0, 0, 0.8)
    line["eval"] = {"contribution": {"ne": 1.0001}, "like": {"ne": 0.7}, "long_dwell": {"ne": 0.7}}
    assert plain_cells({line["name"]: line})[(0, 0)].failed


def test_the_neighbourhood_rule_seeds_the_anchor_s_8_neighbours_then_follows_the_best_cell():
    from studies.lr_recovery import neighbourhood_runs, plain_cells

    seeds = (0, 1, 2)
    first = neighbourhood_runs(plain_cells({}), seeds, (5, 5))
    assert len(first) == 27 and (4, 4, 0) in first and (6, 6, 2) in first
    bowl = {(5 + di, 5 + dj): [0.80 + 0.001 * (abs(di) + abs(dj)) + 0.0001 * s for s in seeds]
            for di in (-1, 0, 1) for dj in (-1, 0, 1)}
    assert neighbourhood_runs(plain_cells(_records(bowl)), seeds, (5, 5)) == []  # the anchor is the best: done
    # A neighbour is better: its own neighbourhood is trained next (5 new cells, every seed).
    moved = {**bowl, (6, 6): [0.79, 0.7901, 0.7902]}
    todo = neighbourhood_runs(plain_cells(_records(moved)), seeds, (5, 5))
    assert sorted({(i, j) for i, j, _ in todo}) == [(5, 7), (6, 7), (7, 5), (7, 6), (7, 7)]
    assert len(todo) == 15


def test_paired_intervals():
    from studies.lr_recovery import paired

    p = paired([0.01, 0.02, 0.03])
    half = 4.303 * 0.01 / 3 ** 0.5
    assert p["mean"] == pytest.approx(0.02) and p["ci95"] == pytest.approx([0.02 - half, 0.02 + half], rel=1e-9)
    assert paired([0.01]) == {"mean": 0.01, "ci95": None, "n": 1} and paired([]) is None


def _runs(variant, *nes, lr=None):
    """A contender's runs as the study keeps them, and their results lines: an NE, or None for a failed seed."""
    from studies.harness import outcome

    records, runs = {}, []
    for k, ne in enumerate(nes):
        name = f"{variant}/seed{k}"
        records[name] = {"name": name, "seed": k, "status": "diverged" if ne is None else "completed", "mean_ne": ne,
                         "rows": {"reserve_rows": 4096}}
        runs.append({"seed": k, "status": records[name]["status"], "outcome": outcome(records[name]), "ne": ne,
                     "wall_seconds": 1.0, "cost_seconds": 1.0, "lr_area": lr[k] if lr else None, "bases": None,
                     "run": name, "clean": True, "rollbacks": 0})
    return runs, records


def test_misset_paired_differences_and_gap_closed_against_the_plateau():
    from studies.lr_recovery import plain_cells, plateau_analysis, summarize_start

    best = [0.78, 0.79, 0.77]
    cells = plain_cells(_records({(2, 2): best, (1, 2): [0.79, 0.802, 0.784]}))  # paired diffs .010 .012 .014
    an = plateau_analysis(cells)
    assert an["pooled_std"] == pytest.approx(0.002)
    lr_range = {"embedding": [1.0, 10.0], "dense": [0.001, 0.01]}
    inside, outside = {"embedding": 3.0, "dense": 0.005}, {"embedding": 0.3, "dense": 0.005}

    def summarize(start_lr, **variants):
        per_variant, records = {}, {}
        for v, (runs, recs) in variants.items():
            per_variant[v] = runs
            records.update(recs)
        return summarize_start(per_variant, records, cells, an, lr_range, start_lr)

    # Plain 0.02 worse than the best on every seed: 10 std, misset. HDET gains 0.01 on two seeds and fails
    # on the third: paired over seeds 0 and 1 only, the failure beside.
    s = summarize({"embedding": 0.3, "dense": 0.005},
                  plain_rollback=_runs("plain", 0.80, 0.81, 0.79, lr=[outside] * 3),
                  hdet=_runs("hdet", 0.79, 0.80, None, lr=[inside, outside, inside]),
                  prodigy=_runs("prodigy", 0.80, 0.81, 0.79))
    assert s["misset"] and s["plain_minus_best_in_std"] == pytest.approx(10.0)
    plain, hdet = s["variants"]["plain_rollback"], s["variants"]["hdet"]
    assert plain["paired_diff"]["mean"] == pytest.approx(0.02) and plain["gap_closed"] is None
    assert hdet["paired_diff"]["mean"] == pytest.approx(-0.01) and hdet["paired_seeds"] == [0, 1]
    assert hdet["paired_diff"]["ci95"] == pytest.approx([-0.01, -0.01], abs=1e-12)
    assert hdet["gap_closed"] == pytest.approx(0.5)  # (0.01 gained) / (0.02 gap) on seeds 0, 1
    assert hdet["failed"] == 1 and hdet["diverged"] == 1 and hdet["completed"] == 2
    assert hdet["ne"] == pytest.approx(0.795)
    assert hdet["lr_area_in_plateau"] == {"embedding": 1, "dense": 2}  # completed seeds only
    assert s["variants"]["prodigy"]["gap_closed"] == pytest.approx(0.0)
    # Plain 0.005 worse: 2.5 std, under 3: not misset, no gap closed.
    s = summarize(inside, plain_rollback=_runs("plain", 0.785, 0.795, 0.775), hdet=_runs("hdet", 0.78, 0.79, 0.77))
    assert not s["misset"] and s["plain_minus_best_in_std"] == pytest.approx(2.5)
    assert s["variants"]["hdet"]["gap_closed"] is None
    assert s["variants"]["hdet"]["paired_diff"]["mean"] == pytest.approx(-0.005)
    # A plain run that failed makes the start misset, whatever the others did.
    s = summarize(inside, plain_rollback=_runs("plain", 0.785, None, 0.775), hdet=_runs("hdet", 0.78, 0.79, 0.77))
    assert s["misset"] and s["variants"]["plain_rollback"]["failed"] == 1
    assert s["variants"]["hdet"]["paired_seeds"] == [0, 2]


def test_the_lr_finder_suggests_the_smoothed_minimum_over_ten():
    from studies.lr_recovery import suggest_multiplier

    steps = list(range(1, 101))
    # The loss falls until step 61 (multiplier 0.01 x 10^(4 x 60/99) = 43.3 at step 60, 0-based), then explodes.
    loss = [1.0 - 0.005 * k if k <= 61 else 0.695 + 0.5 * (k - 61) for k in steps]
    m = suggest_multiplier({"range_test": {"steps": 100, "low": 0.01, "high": 100.0, "step": steps, "loss": loss}})
    # The smoothed curve lags: its minimum is a few steps after the raw one, never before it.
    assert 0.01 * 10 ** (4 * 60 / 99) / 10 <= m <= 0.01 * 10 ** (4 * 66 / 99) / 10
    assert suggest_multiplier({"range_test": {"steps": 100, "low": 0.01, "high": 100.0, "step": [], "loss": []}}) is None


def test_the_committed_study_report_from_its_results_file(tmp_path):
    """docs/lr_recovery_f3/results.jsonl rebuilds the committed report's figures (no training), and every
    recorded run names the clean commit it trained from."""
    from studies.harness import StudyFiles
    from studies.lr_recovery import STARTS, render_markdown, study

    files = StudyFiles.open(os.path.join(REPO, "docs", "lr_recovery_f3"), str(tmp_path), train=False)
    committed = read_json(os.path.join(REPO, "docs", "lr_recovery.json"))
    anchor = (committed["anchor"]["embedding"], committed["anchor"]["dense"])
    r = study(files, [0, 1, 2], [], report_only=True, anchor=anchor)
    # Complete, or partial exactly as the committed report says (runs still training in a later session).
    assert r.get("partial") == committed.get("partial")
    as_json = lambda x: json.loads(json.dumps(x))
    for key in ("best_cell", "plateau", "plateau_rule", "variants", "grid"):
        assert committed[key] == as_json(r[key]), key
    assert set(committed["starts"]) == set(STARTS) and {"best", "old_tuned", "emb_low"} <= set(STARTS)
    assert {"plain_rollback", "prodigy", "schedulefree", "lr_finder", "hdet"} <= set(committed["variants"])
    for v in committed["variants"].values():
        for per_start in v.values():
            assert {"failed", "paired_diff", "gap_closed"} <= set(per_start)
    runs = [run for s in committed["starts"].values() for v in s["runs"].values() for run in v if run["outcome"]]
    assert all(run["commit"] and run["clean"] is True for run in runs)
    for name, s in committed["starts"].items():  # the controller's variants are planned at its starts only
        for v, runs in s["runs"].items():
            assert all(run["planned"] == (v not in CONTROLLER_VARIANTS or name in CONTROLLER_STARTS) for run in runs)
    planned = sum(run["planned"] for s in committed["starts"].values() for v in s["runs"].values() for run in v)
    done = sum(bool(run["planned"] and run["outcome"]) for s in committed["starts"].values() for v in s["runs"].values()
               for run in v)
    assert committed.get("partial", f"{planned} of {planned} runs").startswith(f"{done} of {planned} ")
    assert set(committed["targets"]) == {"hdet", *CONTROLLER_VARIANTS}
    for s in committed["starts"].values():  # each contender's entry names the commits of its finished runs
        for v, entry in s["variants"].items():
            assert entry["commits"] == sorted({run["commit"] for run in s["runs"][v] if run["outcome"]}) and entry["clean"]
    assert all(len(line["commit"]) == 40 and line["clean"] is True for line in files.results.values())
    if committed["plateau_rule"]:
        assert committed["plateau_rule"]["std"] == "pooled"
    r.update(command="c", machine="m")
    assert "fairness contract" in render_markdown(r)


def test_the_controller_targets_are_met_only_when_every_condition_holds():
    from studies.lr_recovery import TARGET_STARTS, targets

    def entry(diff, ci, fraction, in_plateau=3, near=3, failed=0, seeds=3):
        return {"paired_diff": {"mean": diff, "ci95": ci, "n": seeds}, "gap_fraction": fraction, "seeds": seeds,
                "failed": failed, "lr_area_in_plateau_both": in_plateau, "lr_area_within_2x_of_start": near}

    def runs(nes):
        return [{"seed": s, "ne": ne, "outcome": "completed"} for s, ne in enumerate(nes)]

    good = entry(-0.010, [-0.015, -0.005], 0.80)
    cases = {"all_low": good,
             "all_high": entry(-0.010, [-0.021, +0.001], 0.80),   # the interval reaches 0: missed
             "emb_low_dense_high": entry(-0.010, [-0.015, -0.005], 0.70),  # 70% < 75%: missed
             "emb_low": entry(-0.010, [-0.015, -0.005], 0.80, in_plateau=1)}  # 1 of 3 seeds in the plateau: missed
    results = {}
    for start in (*TARGET_STARTS, "best"):
        v = entry(+0.0005, [-0.002, +0.003], None, near=2) if start == "best" else cases[start]
        results[start] = {"variants": {"hdet": v},
                          "runs": {"hdet": runs([0.780, 0.781, 0.779]), "prodigy": runs([0.782, 0.783, 0.781]),
                                   "schedulefree": runs([0.781, 0.782, 0.780]),
                                   # the LR finder beats it at all_low (by 0.0005 on average)
                                   "lr_finder": runs([0.7795, 0.7805, 0.7785] if start == "all_low" else [0.790] * 3)}}
    t = targets(results, variants=("hdet",))["hdet"]
    assert [t["starts"][s]["met"] for s in TARGET_STARTS] == [True, False, False, False]
    assert t["anchors"]["all_low"]["met"] is False and t["anchors"]["all_low"]["diff"]["lr_finder"] == pytest.approx(0.0005)
    assert t["anchors"]["all_high"]["met"] is True and t["anchors"]["all_high"]["diff"]["prodigy"] == pytest.approx(-0.002)
    assert t["best"]["met"] is True
    results["best"]["variants"]["hdet"] = entry(+0.0015, [-0.001, +0.004], None)  # mean above +0.001
    assert targets(results, variants=("hdet",))["hdet"]["best"]["met"] is False
    results["all_low"]["variants"]["hdet"] = {**good, "seeds": 2}  # a seed still training: pending, not missed
    assert targets(results, variants=("hdet",))["hdet"]["starts"]["all_low"]["met"] is None
