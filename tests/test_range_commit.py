"""The range test's kill test tables (studies/range_commit.py): each form's runs and seeds, the kill rule's verdict,
and the re-reading of the first form's recorded curves with every candidate smoothing window."""

import math

import pytest

from recsys_hdet.hdet.range_test.rule import CLASSIC_SMOOTHING, smoothing, suggest_multiplier
from recsys_hdet.constants import DENSE_GROUPS
from studies import range_commit as rc

ANCHOR = (60.0, 0.003)


def _line(start, emb_of_best, dense_of_best, curves=None):
    """A sweep-and-commit run's results line that committed these factors of the best cell."""
    committed = {"embedding": ANCHOR[0] * emb_of_best, **{g: ANCHOR[1] * dense_of_best for g in DENSE_GROUPS}}
    fe, fd = rc.KILL_STARTS[start]
    axes = {"embedding": {"multiplier": emb_of_best / fe, "range_edge": None},
            "dense": {"multiplier": dense_of_best / fd, "range_edge": None}}
    for axis, curve in (curves or {}).items():
        axes[axis]["loss"] = curve
    return {"status": "stopped", "hdet": {"range_test": {"committed": committed, "axes": axes}}}


def test_a_form_reads_its_own_runs_and_seeds_and_two_seeds_outside_at_one_start_kill_it():
    assert rc.CURRENT == "divisors_10_20" and rc.KILL_TESTS[rc.CURRENT].seeds == (6, 7, 8)
    assert rc.KILL_TESTS[rc.CURRENT].divisors == {"embedding": 10.0, "dense": 20.0}
    assert rc.KILL_TESTS["window_1_decade"].seeds == (3, 4, 5) and rc.KILL_TESTS["window_1_decade"].divisors is None
    assert rc.KILL_TESTS["classic"].seeds == (0, 1, 2) and rc.KILL_TESTS["classic"].window_decades is None
    assert rc.run_name("best", 6) == "range_commit_divisors/best/seed6"
    assert rc.run_name("best", 3, "window_1_decade") == "range_commit_window1/best/seed3"
    assert rc.run_name("best", 0, "classic") == "range_commit/best/seed0"  # the first form's recorded lines
    assert "hdet.range_test.divisors.dense=20" in rc.overrides("best", 6, ANCHOR)
    results = {rc.run_name(s, seed): _line(s, 1.0, 1.0) for s in rc.KILL_STARTS for seed in (6, 7, 8)}
    t = rc.table(results, ANCHOR)
    assert t["verdict"] == "passed" and t["killed_at"] == [] and t["seeds"] == [6, 7, 8]
    # x3.2 is inside, just past it is not; one seed outside at a start is allowed, two kill the form there
    results[rc.run_name("all_low", 6)] = _line("all_low", 3.2 * 0.999, 1 / 3.2 * 1.001)
    results[rc.run_name("all_low", 7)] = _line("all_low", 1.0, 3.2 * 1.01)
    t = rc.table(results, ANCHOR)
    assert t["starts"]["all_low"]["outside"] == 1 and t["verdict"] == "passed"
    results[rc.run_name("all_low", 8)] = _line("all_low", 1 / 3.2 / 1.01, 1.0)
    t = rc.table(results, ANCHOR)
    assert t["killed_at"] == ["all_low"] and t["verdict"] == "killed"
    of_best = t["starts"]["all_low"]["seeds"][1]["of_best"]
    assert of_best["embedding"] == pytest.approx(1.0) and of_best["dense"] == pytest.approx(3.232)
    # the classic form's lines are not the current form's, and a missing seed leaves the verdict pending
    assert rc.table({k.replace("range_commit_divisors", "range_commit_window1"): v for k, v in results.items()},
                    ANCHOR)["verdict"] == "pending"
    del results[rc.run_name("best", 7)]
    assert rc.table({k: v for k, v in results.items() if "all_low" not in k}, ANCHOR)["verdict"] == "pending"


def test_the_windows_re_read_the_first_form_s_curves_as_the_rule_reads_them():
    """rule_dev re-reads each recorded curve with each window: the suggestion is the rule's on that curve times the
    start's factor; with fastai's 0.98 it is the rule the curves were committed under."""
    steps, low, high = rc.SWEEP
    # the loss falls until step 60 then rises slowly: the smoothed minimum, and so the suggestion, moves with the
    # window
    curve = [1.0 - 0.005 * k if k <= 60 else 0.7 + 0.01 * (k - 60) for k in range(steps)]
    per_step = list(range(1, steps + 1))
    results = {rc.run_name(s, seed, "classic"): _line(s, 1.0, 1.0, {"embedding": curve, "dense": curve})
               for s in rc.KILL_STARTS for seed in (0, 1, 2)}
    dev = rc.rule_dev(results, ANCHOR)
    assert list(dev["windows"]) == ["0.25", "0.5", "1", "2", "fastai_0.98"]
    for key, window in (("1", 1.0), ("fastai_0.98", None)):
        beta = CLASSIC_SMOOTHING if window is None else smoothing(low, high, steps, window)
        m = suggest_multiplier(per_step, curve, low, high, steps, beta)
        entry = dev["windows"][key]
        assert entry["beta"] == pytest.approx(beta) and entry["replicas"]["runs"] == 21
        assert entry["finder"]["runs"] == 0  # no finder lines here
        emb = entry["replicas"]["axes"]["embedding"]
        # every start's factor times the same multiplier: the geometric mean of the factors times m
        logs = [math.log10(f[0] * m) for f in rc.KILL_STARTS.values()]
        assert emb["geomean"] == pytest.approx(10 ** (sum(logs) / len(logs)))
        outside_starts = [s for s, f in rc.KILL_STARTS.items() if not 1 / 3.2 <= f[0] * m <= 3.2
                          or not 1 / 3.2 <= f[1] * m <= 3.2]
        assert entry["replicas"]["killed_at"] == outside_starts
    assert dev["windows"]["0.25"]["beta"] < dev["windows"]["1"]["beta"] < dev["windows"]["fastai_0.98"]["beta"]


def test_the_divisors_re_read_both_earlier_forms_curves_and_the_one_nearest_the_best_cell_is_chosen():
    """divisor_dev re-reads the first two kill tests' curves (seeds 0-5) with the 1-decade window and each candidate
    divisor: each suggestion is the start's factor times the curve's smoothed minimum over the divisor, and per axis
    the divisor whose geometric mean lies nearest the best cell is chosen."""
    steps, low, high = rc.SWEEP
    beta = smoothing(low, high, steps, 1.0)
    per_step = list(range(1, steps + 1))

    def curve_with_minimum_at(k):
        return [1.0 - 0.005 * i if i <= k else 1.0 - 0.005 * k + 0.02 * (i - k) for i in range(steps)]

    curves = {"embedding": curve_with_minimum_at(55), "dense": curve_with_minimum_at(70)}
    m = {a: suggest_multiplier(per_step, c, low, high, steps, beta, 1.0) for a, c in curves.items()}
    results = {}
    for form in rc.DEV_FORMS:
        for s, (fe, fd) in rc.KILL_STARTS.items():
            for seed in rc.KILL_TESTS[form].seeds:  # every start's sweeps read the same multipliers
                results[rc.run_name(s, seed, form)] = _line(s, 1.0, 1.0, curves)
    dev = rc.divisor_dev(results, ANCHOR)
    assert dev["runs"] == 42 and list(dev["axes"]["dense"]) == ["5", "7.5", "10", "12.5", "15", "20", "25", "30"]
    for axis, i in (("embedding", 0), ("dense", 1)):
        logs = [math.log10(f[i] * m[axis] / 10) for f in rc.KILL_STARTS.values()]
        assert dev["axes"][axis]["10"]["geomean"] == pytest.approx(10 ** (sum(logs) / len(logs)))
        assert dev["axes"][axis]["20"]["geomean"] == pytest.approx(dev["axes"][axis]["10"]["geomean"] / 2)
        best = min(rc.DEV_DIVISORS, key=lambda d: abs(sum(logs) / len(logs) + math.log10(10 / d)))
        assert dev["chosen"][axis] == best
    # the window_1_decade seeds' lines count too, and no other form's
    assert rc.divisor_dev({k: v for k, v in results.items() if "window1" not in k}, ANCHOR)["runs"] == 21
    assert rc.divisor_dev({}, ANCHOR)["chosen"] == {}


def _values(overrides):
    """Overrides as {key: value}, numbers compared as numbers (a line recorded 10000 where today's spell 10000.0)."""
    def value(v):
        try:
            return float(v)
        except ValueError:
            return v
    return {k: value(v) for k, v in (o.split("=", 1) for o in overrides)}


def test_each_probe_changes_one_thing_of_the_recorded_finder_sweep_and_compares_seed_by_seed():
    """studies/range_probes.py: a probe's sweep is the recorded finder_commit sweep (its overrides as recorded, less
    trainer.metrics_every, which came later and changes no loss) with the probe's one change; the table pairs each
    probe's suggestion with the recorded sweep of the same seed."""
    from studies import range_probes as rp
    from studies.results import load, study_overrides

    recorded = load(rp.TRUTH_RESULTS)
    for seed in rp.SEEDS:
        base = study_overrides(recorded[rp.recorded_name(seed)])
        half = rp.overrides("half_batch", seed, ANCHOR)
        assert half[:2] == ["+experiment=baseline_low", f"seed={seed}"]
        assert half[-2:] == ["trainer.nproc=2", "trainer.sharding_group_size=2"]
        assert _values(o for o in half[2:-2] if not o.startswith("trainer.metrics_every=")) == _values(base)
        trains = rp.overrides("embedding_trains", seed, ANCHOR)
        assert trains[-1] == "optim.lr.embedding=60" and "optim.lr.embedding=0.06" not in trains
        assert sorted(set(half[:-2]) ^ set(trains)) == ["optim.lr.embedding=0.06", "optim.lr.embedding=60"]
    with pytest.raises(ValueError, match="not one of"):
        rp.overrides("other", 0, ANCHOR)
    rt = lambda loss: {"range_test": {"steps": 100, "low": 0.001, "high": 10000.0,  # noqa: E731
                                      "step": list(range(1, len(loss) + 1)), "loss": loss}, "status": "diverged",
                       "steps": len(loss)}
    early, late = [1.0 - 0.01 * k for k in range(30)] + [9.0], [1.0 - 0.01 * k for k in range(60)] + [9.0]
    results = {rp.probe_name("half_batch", s): rt(early) for s in rp.SEEDS}
    t = rp.table(results, {rp.recorded_name(s): rt(late) for s in rp.SEEDS})
    ratio = t["probes"]["half_batch"]["ratio_geomean"]
    from studies.range_tests import sweep_suggestion

    assert ratio == pytest.approx(sweep_suggestion(rt(early)) / sweep_suggestion(rt(late)), rel=1e-12) and ratio < 0.5
    assert t["probes"]["embedding_trains"]["seeds"] == [] and t["probes"]["embedding_trains"]["ratio_geomean"] is None
