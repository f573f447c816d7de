"""The check of a range test's curves (recsys_hdet/hdet/range_test/check.py; pre-registered in
docs/results/hdet_history.md, ``range-check-rule``): on planted curves, a clean valley passes, and a shallow valley, a
minimum near an end of the sweep, a commit on the curve's upper slope, a slow rise instead of an explosion and
replicas that disagree are flagged, each with its reason; the commit records the verdict and names a flagged axis in
one line, and commits what the rule read either way."""
import math
import random

import pytest
import torch

from recsys_hdet.constants import LR_AXES
from recsys_hdet.hdet.range_test.check import check_curve
from recsys_hdet.hdet.range_test.rule import smoothing, sweep_multiplier
from recsys_hdet.hdet.range_test.sweep import ReplicaSweepPlan, commit

STEPS, LOW, HIGH = 100, 0.001, 10000.0  # the product's sweep
BETA = smoothing(LOW, HIGH, STEPS, 1.0)  # its 1-decade window
AT = [sweep_multiplier(k, LOW, HIGH, STEPS) for k in range(STEPS)]
DIVISORS = {"embedding": 10.0, "dense": 20.0}


def planted(shape, noise=0.005, seed=0):
    """A sweep's losses: ``shape(multiplier)`` times (1 + ``noise`` x a standard normal draw), reproducibly."""
    rng = random.Random(seed)
    return [shape(m) * (1 + noise * rng.gauss(0.0, 1.0)) for m in AT]


def valley(m, edge=100.0):
    """A clean valley: the loss falls from 0.7 over the decades below x1, flattens towards 0.3 and explodes above
    ``edge``."""
    return 0.3 + 0.4 / (1 + 3 * m) + (50.0 if m > edge else 0.0)


def check(losses, divisor=10.0, replicas=()):
    return check_curve(losses, LOW, HIGH, STEPS, BETA, divisor, replicas)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_clean_valley_passes(seed):
    """Falls over decades, explodes at x100 within a step: the minimum sits two decades below the top, the floor is
    narrow, most of the fall had happened at the answer (x100 / 10), the cut follows the minimum at once."""
    got = check(planted(valley, seed=seed))
    assert got["trusted"] and got["reasons"] == [], got
    assert got["window_decades"] == pytest.approx(1.0)
    bottom, top = got["minimum_decades_from_ends"]
    assert bottom > 4 and 1.5 < top < 2.5
    assert got["floor_decades"] < 0.5 and got["fall_at_commit"] > 0.7 and got["cut_decades_above_minimum"] < 0.2
    assert got["replica_spread"] is None  # one replica: nothing to compare


def test_a_shallow_valley_is_flagged():
    """The loss has fallen by x0.03 and then lies flat, within its noise (2%), for four and a half decades before it
    explodes at x1000: the noise alone could put the minimum anywhere on that floor."""
    got = check(planted(lambda m: 0.3 + 0.4 / (1 + (m / 0.003) ** 2) + (50.0 if m > 1000 else 0.0), noise=0.02))
    assert got["reasons"] == ["shallow_valley"] and not got["trusted"], got
    assert got["floor_decades"] > 1.0
    # the same fall with a tenth of the noise: the floor narrows below a decade
    quiet = check(planted(lambda m: 0.3 + 0.4 / (1 + (m / 0.003) ** 2) + (50.0 if m > 1000 else 0.0), noise=0.002))
    assert "shallow_valley" not in quiet["reasons"] and quiet["floor_decades"] < 1.0, quiet


def test_a_minimum_near_an_end_of_the_sweep_is_flagged():
    """Near the top: the loss still falls at x3000 and explodes at x5000, less than a decade below the range's top
    (the edge may lie above). Near the bottom: it explodes at x0.008, under a decade above the range's bottom, and the
    dense answer (/ 20) lies below the range."""
    top = check(planted(lambda m: 0.3 + 0.4 / (1 + 0.003 * m) + (50.0 if m > 5000 else 0.0)))
    assert "minimum_near_end" in top["reasons"] and top["minimum_decades_from_ends"][1] < 1.0, top
    assert "range_edge_high" not in top["reasons"]  # more than a sweep step from the top: on the map, yet flagged
    bottom = check(planted(lambda m: 0.3 + 0.4 / (1 + 3000 * m) + (50.0 if m > 0.008 else 0.0)), divisor=20.0)
    assert "minimum_near_end" in bottom["reasons"] and bottom["minimum_decades_from_ends"][0] < 1.0, bottom


def test_a_commit_on_the_curve_s_upper_slope_is_flagged():
    """The fall crowded into the half decade below the minimum (a steep sigmoid at x30, explosion at x100): at the
    answer (x100 / 10) the loss had barely started to fall, a narrower valley than the divisor assumes."""
    got = check(planted(lambda m: 0.3 + 0.4 / (1 + (m / 30) ** 4) + (50.0 if m > 100 else 0.0)))
    assert got["reasons"] == ["commit_on_slope"], got
    assert got["fall_at_commit"] < 0.1
    # read with divisor 1 the answer is the minimum itself: the whole fall had happened there
    at_minimum = check(planted(lambda m: 0.3 + 0.4 / (1 + (m / 30) ** 4) + (50.0 if m > 100 else 0.0)), divisor=1.0)
    assert at_minimum["trusted"] and at_minimum["fall_at_commit"] == 1.0


def test_a_slow_rise_instead_of_an_explosion_is_flagged():
    """Past x30 the loss climbs as the square root of the rate: the smoothed loss takes almost two decades to reach
    4x its minimum, not the explosion the divisor is measured from."""
    got = check(planted(lambda m: 0.3 + 0.4 / (1 + 3 * m) + (0.0 if m < 30 else 0.3 * ((m / 30) ** 0.5 - 1))))
    assert got["reasons"] == ["no_clear_explosion"], got
    assert got["cut_decades_above_minimum"] > 1.5


def test_the_commit_records_the_check_and_commits_what_the_rule_read():
    """R = 4 (two replicas per axis). The embedding's replicas explode at x100 and x1000: their minima lie a decade
    apart, flagged; the dense replicas agree (x100 and x150) on a clean valley: trusted. The commit is the rule's
    either way."""
    curves = torch.tensor([planted(valley, seed=0), planted(valley, seed=1),
                           planted(lambda m: valley(m, edge=1000.0), seed=2), planted(lambda m: valley(m, edge=150.0),
                                                                                      seed=3)], dtype=torch.float64)
    axes = commit(ReplicaSweepPlan(LR_AXES, STEPS, LOW, HIGH, DIVISORS), curves, [0, 1, 2, 3])
    emb, dense = axes["embedding"]["check"], axes["dense"]["check"]
    assert emb["reasons"] == ["replicas_disagree"] and emb["replica_spread"] > 5, emb
    assert dense["trusted"] and 1 < dense["replica_spread"] < 10 ** 0.5, dense
    assert axes["embedding"]["multiplier"] == axes["embedding"]["suggested"]  # the check never changes the commit
    # R = 2: each axis has one replica, so nothing to compare; a clean pair of curves is trusted on both axes
    two = commit(ReplicaSweepPlan(LR_AXES, STEPS, LOW, HIGH, DIVISORS), curves[:2], [0, 1])
    assert all(two[a]["check"]["trusted"] and two[a]["check"]["replica_spread"] is None for a in LR_AXES), two


def test_off_the_map_flags_are_reasons():
    """A flat, noisy curve (never descends, never explodes) is not trusted; its off-the-map flags are its reasons. A
    curve without a finite loss is not trusted."""
    flat = check(planted(lambda m: 0.4, noise=0.005))
    assert {"never_descended", "never_exploded"} <= set(flat["reasons"]) and not flat["trusted"], flat
    none = check([math.nan] * STEPS)
    assert none["reasons"] == ["no_finite_loss"] and not none["trusted"] and none["floor_decades"] is None


def test_the_study_tables_flagged_and_passed_commits_against_the_plateau(tmp_path):
    """``python -m studies.range_check`` on a planted checkout: three benchmark range-test runs (a clean commit on the
    plateau, a clean one off it, one whose dense curve lies on its upper slope, off it) and a plain run; no setting
    has a plateau yet. The check is recomputed from the recorded curves; on the plateau means within x10^0.25 of one
    cell on both axes; the targets cannot be judged on so few commits."""
    import json

    from studies import range_check

    def record(dense_shape, committed_emb, committed_dense, name):
        axes = {"embedding": planted(valley), "dense": planted(dense_shape)}
        rt = {"steps": STEPS, "low": LOW, "high": HIGH,
              "committed": {"embedding": committed_emb, **{g: committed_dense for g in LR_AXES["dense"]}},
              "axes": {a: {"loss": c, "smoothing": BETA, "divisor": DIVISORS[a], "replicas": {"0": {"loss": c}}}
                       for a, c in axes.items()}}
        return {"name": name, "status": "completed", "hdet": {"form": "range_test", "range_test": rt}}

    steep = lambda m: 0.3 + 0.4 / (1 + (m / 30) ** 4) + (50.0 if m > 100 else 0.0)  # noqa: E731
    lines = [record(valley, 70.0, 0.003, "best/hdet_range_test/seed0"),  # x1.17 of a cell: on
             record(valley, 60.0, 0.003 * 10 ** 0.3, "all_low/hdet_range_test/seed0"),  # dense x2.0 of every cell: off
             record(steep, 600.0, 0.003, "all_high/hdet_range_test/seed0"),  # flagged, off
             {"name": "grid/e2_d2/seed0", "status": "completed"}]
    folder = tmp_path / "docs" / "results" / "lr_recovery"
    (folder / "lr_recovery_f3").mkdir(parents=True)
    (folder / "lr_recovery_f3" / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "lr_recovery.json").write_text(json.dumps({"plateau": [{"embedding": 60.0, "dense": 0.003},
                                                                     {"embedding": 18.97, "dense": 0.003}]}))
    out = tmp_path / "out"
    assert range_check.main(["--root", str(tmp_path), "--out", str(out)]) == 0
    result = json.loads((out / "range_check.json").read_text())
    runs = {r["run"]: r for r in result["sources"]["benchmark"]["runs"]}
    assert list(runs) == ["all_high/hdet_range_test/seed0", "all_low/hdet_range_test/seed0",
                          "best/hdet_range_test/seed0"]
    assert runs["best/hdet_range_test/seed0"]["on_plateau"] and not runs["best/hdet_range_test/seed0"]["flagged"]
    assert runs["all_low/hdet_range_test/seed0"]["plateau_distance_decades"] == pytest.approx(0.3)
    assert not runs["all_low/hdet_range_test/seed0"]["on_plateau"]
    high = runs["all_high/hdet_range_test/seed0"]
    assert high["flagged"] and high["axes"]["dense"]["reasons"] == ["commit_on_slope"]
    assert high["axes"]["embedding"]["trusted"] and high["axes"]["embedding"]["recorded_agrees"] is None
    pooled = result["pooled"]
    assert (pooled["flagged_off"], pooled["flagged_on"], pooled["passed_off"], pooled["passed_on"]) == (1, 0, 1, 1)
    assert pooled["off_flag_rate"] == 0.5 and pooled["runs_with_reason"] == {"commit_on_slope": {"off": 1, "on": 0}}
    assert result["targets"] == {"off_plateau_flagged_at_least_75pct": "not judged yet",
                                 "on_plateau_flagged_at_most_10pct": "not judged yet"}
    assert not result["final"] and len(result["incomplete"]) == 3  # no setting has its runs
    assert result["sources"]["data_regime"]["note"].startswith("no plateau")
    assert "range-check-rule" not in result["rule"] and "On the plateau" in result["rule"]
    text = (out / "range_check.md").read_text()
    assert "| **pooled** | 3 | 1 | 0 | 1 | 1 | 1 of 2 (50%) | 0 of 1 (0%) |" in text and "**Interim**" in text
    judged = range_check.judge({"off": 4, "on": 10, "off_flag_rate": 0.75, "on_flag_rate": 0.2})
    assert judged == {"off_plateau_flagged_at_least_75pct": "met", "on_plateau_flagged_at_most_10pct": "missed"}


def test_the_revised_check_drops_only_the_no_clear_explosion_reason_and_is_judged_on_the_later_settings():
    """On the committed runs of the benchmark and data_regime (known: every flag there is no_clear_explosion on the
    embedding axis, 33 of 42 runs), the revised check flags none; its table reads model_shape and batch_4x alone."""
    import os

    from studies.range_check import REVISED_JUDGED_ON, study

    r = study(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fitted = [row for name in ("benchmark", "data_regime") for row in r["sources"][name]["runs"]]
    assert len(fitted) == 42 and sum(row["flagged"] for row in fitted) == 33
    assert not any(row["flagged_revised"] for row in fitted)
    held_out = sum(len(r["sources"][name]["runs"]) for name in REVISED_JUDGED_ON)
    assert r["revised"]["table"]["off"] + r["revised"]["table"]["on"] == held_out
    assert "no_clear_explosion" in r["revised"]["rule"]
