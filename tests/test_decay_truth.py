"""The decay truth study (studies/decay_truth.py, issue 60 part 1): its plan as data (each variant's overrides give
each group the decay it names; a schedule two variants share is one run), resumability (a run with a line is never
trained again), the report's statistics from synthetic lines, and (slow) the study end to end on the tiny data."""
import json
import os
import sys

import pytest

from conftest import REPO, run_command
from studies import decay_truth
from studies.contract import CONTRACT, StudyMismatch, outcome
from studies.decay_truth_plan import (GRID, PCT_START, RATES, REFERENCE, VARIANTS, owner, rate_overrides, run_base,
                                      runs, variant_overrides)
from studies.results import StudyFiles, run_name

GROUPS = ("embedding", "transformer", "non_embedding", "no_decay")
ANCHOR = (60.0, 0.003)


def test_each_variant_s_overrides_give_each_group_exactly_its_decay():
    from recsys_hdet.components.lr_scheduler import DelayedDecay, OneCycle, build_schedules
    from recsys_hdet.config import compose, validate_config

    assert variant_overrides(VARIANTS[REFERENCE]) == []
    assert variant_overrides(VARIANTS["emb_late"]) == ["optim.schedule.groups.embedding.decay_start=0.7"]
    assert variant_overrides(VARIANTS["paper_ordering"]) == ["optim.schedule.groups.non_embedding.decay_start=0.5",
                                                             "optim.schedule.groups.no_decay.decay_start=0.7"]
    for name, v in VARIANTS.items():
        cfg = compose("config", ["+experiment=baseline_low", *rate_overrides("best_cell", ANCHOR), *variant_overrides(v)])
        validate_config(cfg)
        schedules = build_schedules(cfg.optim, GROUPS, 960)
        for g in GROUPS:
            start, shape = v.of(g)
            s = schedules[g]
            if (start, shape) == (PCT_START, "cos"):
                assert type(s) is OneCycle, (name, g)
            else:
                assert isinstance(s, DelayedDecay) and (s.decay_start, s.decay_strategy) == (start, shape), (name, g)
        assert v.uniform == (len({v.of(g) for g in GROUPS}) == 1)


def test_the_variants_are_the_pre_registered_ones():
    """The families the issue names, and the text of the rule the report quotes (written before any run)."""
    fam = {}
    for name, v in VARIANTS.items():
        fam.setdefault(v.family, []).append(name)
    assert fam["reference"] == [REFERENCE] and set(fam["embedding"]) == {"emb_early", "emb_late"}
    assert set(fam["dense_fastest"]) == {"transformer_fastest", "non_embedding_fastest", "no_decay_fastest"}
    assert VARIANTS["emb_early"].of("embedding")[0] < VARIANTS["emb_early"].of("transformer")[0]
    assert VARIANTS["emb_late"].of("embedding")[0] > VARIANTS["emb_late"].of("no_decay")[0]
    paper = VARIANTS["paper_ordering"]
    assert paper.of("transformer")[0] < paper.of("non_embedding")[0] < paper.of("no_decay")[0]
    assert {v.of("embedding")[1] for v in VARIANTS.values() if v.family == "shape"} == {"linear"}
    assert VARIANTS["shape_wsd"].of("no_decay") == (0.8, "linear")
    assert len(fam["grid"]) == len(GRID) ** 2
    rule = decay_truth.rule()
    assert "The gain to find" in rule and "0.002 NE" in rule and "Nothing here changes after the first run" in rule


def test_a_schedule_two_variants_share_is_one_run():
    assert owner("grid_e0.3_d0.3") == REFERENCE and owner("grid_e0.3_d0.7") == "emb_early"
    assert owner("grid_e0.7_d0.3") == "emb_late" and owner("grid_e0.5_d0.5") == "grid_e0.5_d0.5"
    planned = runs(list(RATES), list(VARIANTS), [0, 1, 2], ANCHOR)
    assert len(planned) == 15 * 2 * 3 == len({(b, s) for b, s, _ in planned})
    assert planned[0][0] == "best_cell/shared"
    only = runs(["best_cell"], ["emb_late"], [0], ANCHOR)  # the reference always comes with a variant
    assert [b for b, _, _ in only] == ["best_cell/shared", "best_cell/emb_late"]
    range_test = dict(((b, s), o) for b, s, o in runs(["range_test"], ["emb_late"], [1], ANCHOR))
    overrides = range_test[("range_test/emb_late", 1)]
    assert "hdet=enabled" in overrides and "optim.lr.embedding=60" in overrides and "optim.lr.no_decay=0.003" in overrides
    assert overrides[-1] == "optim.schedule.groups.embedding.decay_start=0.7"


def _line(name, seed, ne, overrides, rates="best_cell", status="completed", commit=None, lr_area=1.0):
    line = {"name": name, "seed": seed, "preset": "baseline_low", "status": status, "steps": 960, "total_steps": 960,
            "overrides": ["+experiment=baseline_low", f"seed={seed}", *CONTRACT.apply(overrides)],
            "eval": {t: {"ne": ne} for t in ("contribution", "like", "long_dwell")}, "mean_ne": ne,
            "lr_area": {g: lr_area for g in GROUPS}, "rows": {"data": "bench", "reserve_rows": 4096},
            "commit": "abc", "clean": True}
    if rates == "range_test":
        line["hdet"] = {"form": "range_test", "range_test": {"committed": commit or {"embedding": 50.0 + seed}}}
    return line


def _files(tmp_path, lines=()):
    files = StudyFiles(str(tmp_path / "out"), str(tmp_path / "work"), {}, CONTRACT)
    for line in lines:
        files.add(line)
    return files


def test_a_run_with_a_line_is_never_trained_again_and_other_overrides_are_refused(tmp_path, monkeypatch):
    import studies.runs as study_runs

    trained = []
    monkeypatch.setattr(study_runs, "train_run", lambda final, overrides, **kw: trained.append(final) or
                        {"finished": False, "exit_status": 1, "process_seconds": 0.0, "log": "-"})
    planned = runs(["best_cell"], ["emb_late"], [0, 1], ANCHOR)
    done = [_line(run_name(b, s), s, 0.8, o) for b, s, o in planned[:3]]  # three of the four recorded
    files = _files(tmp_path, done)
    crashed = decay_truth.train(files, ["best_cell"], ["emb_late"], [0, 1], ANCHOR, [])
    assert [os.path.relpath(t, files.work) for t in trained] == ["runs/best_cell/emb_late/seed1"]
    assert crashed == ["best_cell/emb_late/seed1"]
    with pytest.raises(StudyMismatch, match="finished with overrides"):  # the recorded runs had no data=tiny
        decay_truth.train(files, ["best_cell"], ["emb_late"], [0, 1], ANCHOR, ["data=tiny"])


def test_the_report_pairs_each_variant_with_the_shared_schedule_and_names_the_gain(tmp_path):
    seeds = [0, 1, 2]
    ne = {REFERENCE: [0.80, 0.81, 0.79], "emb_late": [0.796, 0.805, 0.787], "shape_linear": [0.79, 0.80, 0.78],
          "transformer_fastest": [0.81, 0.80, 0.80]}
    lines = []
    for rates in RATES:
        for variant, values in ne.items():
            base = run_base(rates, variant)
            overrides = [*rate_overrides(rates, ANCHOR), *variant_overrides(VARIANTS[variant])]
            lines += [_line(run_name(base, s), s, values[s], overrides, rates,
                            lr_area=1.5 if variant == "emb_late" else 1.0) for s in seeds]
    lines[-1]["hdet"]["range_test"]["committed"] = {"embedding": 1.0}  # a commit that differs within seed 2
    result = decay_truth.study(_files(tmp_path, lines), list(RATES), seeds, ANCHOR)
    t = result["rates"]["best_cell"]
    late = t["variants"]["emb_late"]
    assert late["paired"]["diff"]["mean"] == pytest.approx(-0.004) and late["below_zero"]
    assert late["lr_area_vs_shared"]["embedding"] == pytest.approx(1.5)
    assert t["variants"]["grid_e0.7_d0.3"]["same_run_as"] == "emb_late"
    assert t["variants"]["grid_e0.3_d0.3"]["paired"] is None  # the reference's own run
    assert t["variants"]["shape_linear"]["below_zero"] and t["variants"]["shape_linear"]["paired"]["diff"]["ci95"][1] < 0
    assert t["gain"]["variant"] == "shape_linear" and t["gain"]["uniform"]  # -0.01: the best, a uniform change
    assert not t["variants"]["transformer_fastest"]["below_zero"]
    assert t["landscape"]["0.3"]["0.3"]["reference"] and t["landscape"]["0.7"]["0.3"]["mean"] == pytest.approx(-0.004)
    assert t["landscape"]["0.5"]["0.5"] is None  # not run
    commits = result["rates"]["range_test"]["commits"]
    assert commits["0"]["consistent"] and commits["0"]["runs"] == 4 and not commits["2"]["consistent"]
    # The ordering's gain (0.004) clears 0.002 at both rate sources: part 2 is worth building on this setting.
    assert result["part2"]["met"] and [p["variant"] for p in result["part2"]["orderings"]] == ["emb_late"]
    assert result["part2"]["uniform_below_zero_at_both"] == ["shape_linear"]
    assert result["partial"] == f"24 of {15 * 2 * 3} runs finished"
    md = decay_truth.render({**result, "command": "python -m studies.decay_truth", "machine": "test"})
    assert "| emb_late | 0.7 / 0.3 / 0.3 / 0.3 | 3 | - |" in md and "**The gain to find:** `shape_linear` -0.0100" in md
    assert "**NOT consistent**" in md and "Met: an ordering pays here: emb_late" in md
    one = decay_truth.study(_files(tmp_path / "one", [x for x in lines if x["name"].startswith("best_cell/")]),
                            ["best_cell"], seeds, ANCHOR)
    assert one["part2"]["met"] is None  # one rate source: not judged


def test_the_best_cell_is_the_benchmark_s_anchor_or_a_setting_s_own_once_known(tmp_path, monkeypatch):
    assert decay_truth.anchor_of(None) == ANCHOR
    emb, dense = decay_truth.anchor_of("data_regime")
    assert (round(emb, 2), dense) == (18.97, 0.003)
    emb, dense = decay_truth.anchor_of("batch_4x")
    assert (round(emb, 2), round(dense, 5)) == (18.97, 0.00949)
    # a setting whose neighbourhood is not complete: its report's anchor is still the benchmark's cell
    from studies.settings import SETTINGS

    (tmp_path / "lr_recovery.json").write_text(json.dumps(
        {"anchor": {"embedding": 60.0, "dense": 0.003, "setting_best_cell": False,
                    "from": "the benchmark's best cell, where the neighbourhood "
                    "rule started"}}))
    monkeypatch.setattr(type(SETTINGS["model_shape"]), "path", lambda self, *parts: str(tmp_path.joinpath(*parts)))
    with pytest.raises(StudyMismatch, match="not known yet"):
        decay_truth.anchor_of("model_shape")


def test_the_plan_lists_the_runs_left_and_overrides_that_move_the_shared_schedule_are_refused(tmp_path, capsys):
    assert decay_truth.main(["--plan", "--out", str(tmp_path / "p"), "--anchor", "0.06", "0.003"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "90 runs to train of 90 planned" and out[0] == "best_cell/shared/seed0"
    with pytest.raises(StudyMismatch, match="pct_start"):
        decay_truth.check_shared(["optim.schedule.pct_start=0.25"])
    decay_truth.check_shared(["data=tiny"])


@pytest.mark.slow  # two tiny runs (about a minute each on 2 busy cores), then the resumed and report-only passes
def test_the_study_trains_its_runs_on_tiny_data_resumes_and_reports(tmp_path, data_cache, tiny_dataset):
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "studies.decay_truth", "data=tiny", "data.train_days=1", "trainer.nproc=2",
           "trainer.sharding_group_size=1",
           "--out", str(out), "--work", str(tmp_path / "work"), "--anchor", "0.06", "0.003", "--rates", "best_cell",
           "--variants", "emb_late", "--seeds", "0"]
    proc = run_command(cmd, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [x["name"] for x in lines] == ["best_cell/shared/seed0", "best_cell/emb_late/seed0"]
    assert all(x["commit"] and x["rows"]["reserve_rows"] == 4096 for x in lines)
    assert lines[1]["schedule"]["groups"]["embedding"]["decay_start"] == 0.7
    trained = json.loads((tmp_path / "work" / "runs" / "best_cell" / "emb_late" / "seed0" / "summary.json").read_text())
    assert trained["lr"]["schedule"]["embedding"]["decay_start"] == 0.7  # the run trained the variant's decay
    assert not trained["lr"]["schedule"]["embedding"]["shared"] and trained["lr"]["schedule"]["no_decay"]["shared"]
    report = json.loads((out / "decay_truth.json").read_text())
    late = report["rates"]["best_cell"]["variants"]["emb_late"]
    # A run of 15 tiny steps may end at the base rate (failed by the contract): paired only where both completed.
    both = all(outcome(x) == "completed" for x in lines)
    assert late["seeds"] == [0] and late["paired"]["seeds"] == ([0] if both else [])
    assert late["failed"] == ([] if outcome(lines[1]) == "completed" else [0])
    again = run_command(cmd, env=env, timeout=300)  # resumed: nothing trained again
    assert again.returncode == 0 and "seed 0:" not in again.stdout, again.stdout
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    only = run_command([*cmd, "--report-only"], env=env, timeout=300)
    assert only.returncode == 0 and json.loads((out / "decay_truth.json").read_text())["rates"] == report["rates"]


def test_a_results_line_s_schedules_are_each_group_s_as_trained_and_the_lr_area_is_against_the_shared_one():
    from recsys_hdet.components.lr_scheduler import DelayedDecay, OneCycle
    from studies.lr_area import lr_area, schedules

    line = {"schedule": {"groups": {"embedding": {"decay_start": 0.7}}}, "total_steps": 100,
            "max_lr": {g: 1.0 for g in GROUPS}}
    built = schedules(line)
    assert isinstance(built["embedding"], DelayedDecay) and type(built["no_decay"]) is OneCycle
    metrics = [{"step": s, "lr": {g: built[g](s)[0] for g in GROUPS}} for s in range(1, 100, 10)]
    area = lr_area(metrics, line["schedule"], {g: 1.0 for g in GROUPS}, 100)
    assert area["embedding"] > 1.0 and area["no_decay"] == pytest.approx(1.0)  # held at its peak: more area
