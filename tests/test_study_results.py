"""The study library's results file (studies.results: round trip, a cut-off last line, skip-finished) and a run
directory's line (studies.record, studies.lr_area: LR areas, the syncs' columns and their inverse)."""
import json
import math
import os

import pytest

from recsys_hdet.constants import TASKS
from studies.lr_area import lr_area, one_cycle
from studies.provenance import REPO
from studies.record import compact_syncs, sync_records
from studies.results import (RESULTS, ResultsError, StudyFiles, append, dumps, is_finished, load, run_name,
                             study_overrides, work_dir)


def _line(name, status="completed", **keys):
    return {"name": name, "seed": 0, "overrides": ["+experiment=baseline_low", "seed=0", "optim.lr.embedding=0.6"],
            "status": status, "mean_ne": 0.78 if status == "completed" else None, **keys}


def test_append_and_load_round_trip(tmp_path):
    path = str(tmp_path / "sub" / "results.jsonl")
    assert load(path) == {}
    a, b = _line("grid/e0_d0/seed0", lr_area={"embedding": 30.0}), _line("all_low/plain/seed1", "diverged")
    append(path, a)
    append(path, b)
    assert load(path) == {a["name"]: a, b["name"]: b}
    with open(path) as f:
        lines = f.read().split("\n")
    assert lines[-1] == "" and len(lines) == 3 and json.loads(lines[0]) == a  # one compact line a run
    # A name recorded again keeps its last line.
    append(path, {**a, "mean_ne": 0.7})
    assert load(path)[a["name"]]["mean_ne"] == 0.7
    with pytest.raises(ValueError):  # NaN is not JSON: refused, not written
        append(path, {**a, "mean_ne": float("nan")})
    assert len(load(path)) == 2


def test_a_cut_off_last_line_is_left_out_and_dropped_by_the_next_append(tmp_path, capsys):
    path = str(tmp_path / "results.jsonl")
    a, b, c = _line("a/seed0"), _line("b/seed0"), _line("c/seed0")
    append(path, a)
    append(path, b)
    with open(path, "a") as f:  # a crash in the middle of the third append
        f.write(dumps(c)[:25])
    assert load(path) == {"a/seed0": a, "b/seed0": b}
    assert "last line cut off" in capsys.readouterr().err
    assert not is_finished(load(path), "c/seed0")  # so that run trains again
    append(path, c)  # drops the fragment, which would otherwise swallow this line
    assert load(path) == {"a/seed0": a, "b/seed0": b, "c/seed0": c}
    assert "dropped a cut-off last line" in capsys.readouterr().err
    # An unreadable line that is not the last is corruption, not a crash: an error.
    with open(path) as f:
        lines = f.read().split("\n")
    with open(path, "w") as f:
        f.write("\n".join([lines[0], "{not json", *lines[1:]]))
    with pytest.raises(ResultsError, match=":2:"):
        load(path)


def test_skip_finished_and_the_recorded_overrides(tmp_path):
    results = {"x/seed0": _line("x/seed0"), "y/seed0": _line("y/seed0", "diverged"),
               "z/seed0": _line("z/seed0", "crashed")}
    assert is_finished(results, "x/seed0") and is_finished(results, "y/seed0")
    assert not is_finished(results, "z/seed0") and not is_finished(results, "w/seed0")
    assert study_overrides(results["x/seed0"]) == ["optim.lr.embedding=0.6"]
    assert run_name("grid/e3_d2", 0) == "grid/e3_d2/seed0"
    # A study under docs/ keeps its run directories out of docs/ (in a folder named as its results folder); any
    # other keeps them beside its file.
    assert work_dir(os.path.join(REPO, "docs", "results", "lr_recovery", "lr_recovery_f2")) == \
        os.path.join(REPO, "outputs", "studies", "lr_recovery_f2")
    assert work_dir(str(tmp_path)) == str(tmp_path)


def test_the_ablation_runner_skips_a_run_with_a_line_and_refuses_other_overrides(tmp_path):
    from studies.contract import StudyMismatch
    from studies.runs import AblationConfig, run_one

    study = StudyFiles.open(str(tmp_path), contract=None)  # the skip and mismatch rules alone
    study.add(_line("baseline_low/seed0"))
    cfg = AblationConfig("baseline_low", "baseline_low", "", None, None)
    res = run_one(study, cfg, 0, ["optim.lr.embedding=0.6"])  # nothing is trained: its line exists
    assert res["skipped"] and res["record"]["name"] == "baseline_low/seed0"
    assert not os.path.exists(tmp_path / "runs")
    with pytest.raises(StudyMismatch, match="seed0: finished with overrides"):
        run_one(study, cfg, 0, ["optim.lr.embedding=0.7"])
    assert run_one(study, cfg, 0, ["optim.lr.embedding=0.7"], report_only=True)["record"] is not None
    assert run_one(study, cfg, 1, [], report_only=True) == {"skipped": True, "record": None}
    # A run directory finished after its line was lost (a crash between the two) is recorded, not retrained.
    _fake_run_dir(tmp_path / "runs" / "baseline_low" / "seed1", ["optim.lr.embedding=0.6"], seed=1)
    res = run_one(study, cfg, 1, ["optim.lr.embedding=0.6"])
    assert res["skipped"] and res["record"]["name"] == "baseline_low/seed1"
    assert StudyFiles.open(str(tmp_path), contract=None).results == study.results
    assert res["record"]["lr_area"]["embedding"] == pytest.approx(30.0, rel=1e-9)


def _fake_run_dir(path, overrides, seed=0, total=100):
    """A finished plain run's directory as the trainer leaves it (the files a line is made of)."""
    os.makedirs(path / ".hydra")
    lr = {"embedding": 0.6, "transformer": 0.001, "non_embedding": 0.001, "no_decay": 0.001}
    schedule = {"name": "one_cycle", "pct_start": 0.3, "anneal_strategy": "cos", "div_factor": 25.0,
                "final_div_factor": 1e4}
    (path / ".hydra" / "overrides.yaml").write_text(
        "\n".join(f"- {o}" for o in ["+experiment=baseline_low", f"seed={seed}", *overrides]) + "\n")
    (path / ".hydra" / "config.yaml").write_text(json.dumps(
        {"seed": seed, "optim": {"lr": lr, "schedule": schedule}, "trainer": {"nproc": 4, "sharding_group_size": 2},
         "hdet": {"enabled": False}, "data": {"name": "bench", "batch_size": 512, "reserve_rows": 4096}}))
    sched = {g: one_cycle(schedule, v, total) for g, v in lr.items()}
    with open(path / "metrics.jsonl", "w") as f:
        for s in range(25, total + 1, 25):
            f.write(json.dumps({"step": s, "lr": {g: sched[g](min(s, total - 1))[0] for g in lr}}) + "\n")
    (path / "train.log").write_text(f"training {total} steps x 2048 examples on days ...\n")
    ev = {t: {"ne": 0.8, "auc": 0.7, "logloss": 0.1, "calibration": 1.0} for t in TASKS}
    (path / "summary.json").write_text(json.dumps(
        {"status": "completed", "steps": total, "wall_seconds": 10.0, "train_loss": {"avg": 0.2}, "eval": ev}))


def test_lr_area_is_the_override_ratio_for_a_plain_run_and_the_mean_log_multiplier_otherwise():
    schedule = {"pct_start": 0.3, "anneal_strategy": "cos", "div_factor": 25.0, "final_div_factor": 1e4}
    preset = {"embedding": 0.02, "transformer": 0.001}
    total = 100
    plain = {g: one_cycle(schedule, lr, total) for g, lr in preset.items()}
    # The trainer logs the LR each step ran with; the last step logs the schedule's last value.
    metrics = [{"step": s, "lr": {"embedding": 30 * plain["embedding"](min(s, total - 1))[0],
                                  "transformer": (2.0 if s < 50 else 0.5) * plain["transformer"](min(s, total - 1))[0]}}
               for s in range(10, total + 1, 10)]
    metrics.append({"step": 5, "loss": 1.0})  # a line without LRs does not count
    area = lr_area(metrics, schedule, preset, total)
    assert area["embedding"] == pytest.approx(30.0, rel=1e-12)
    # 4 of the 10 logged steps at x2, 6 at x0.5: exp((4 ln 2 - 6 ln 2) / 10)
    assert area["transformer"] == pytest.approx(math.exp(-0.2 * math.log(2)), rel=1e-12)


def test_syncs_are_stored_as_columns_and_read_back():
    records = [{"step": 50 * k, "losses": [0.2 + 1e-5 * k, 0.21, 0.2, 0.19], "excluded": [],
                "hparams": {"lr/embedding": {"base": 0.06, "values": [0.06 * 1.25, 0.06 / 1.25], "velocity": 0.0,
                                             "next_base": 0.061 * k, "log_offset": 0.0}}} for k in (1, 2)]
    cols = compact_syncs(records)
    assert cols["step"] == [50, 100] and "excluded" not in cols
    assert cols["hparams"]["lr/embedding"]["mult"] == [[1.25, 0.8], [1.25, 0.8]]
    back = sync_records({"syncs": json.loads(json.dumps(cols))})
    for r, b in zip(records, back):
        assert b["step"] == r["step"] and b["losses"] == pytest.approx(r["losses"], rel=1e-10)
        h, k = r["hparams"]["lr/embedding"], b["hparams"]["lr/embedding"]
        assert k["values"] == pytest.approx(h["values"], rel=1e-6)
        assert k["next_base"] == pytest.approx(h["next_base"], rel=1e-6) and k["velocity"] == 0.0
    assert sync_records({"status": "completed"}) == []


def test_a_committed_study_line_rebuilds_what_the_reports_read():
    """One line of each committed study carries what its report reads (a cheap check of the
    conversion: every study's report is rebuilt from these files alone)."""
    docs = os.path.join(REPO, "docs", "results")
    f2 = load(os.path.join(docs, "lr_recovery", "lr_recovery_f2", RESULTS))
    hdet = f2["all_low/hdet/seed0"]
    assert hdet["status"] == "completed" and hdet["hdet"]["config"]["score"] == "regression"
    assert len(sync_records(hdet)) == hdet["hdet"]["syncs"] == 20
    plain = f2["all_low/plain/seed0"]
    assert plain["lr_area"]["embedding"] == pytest.approx(0.6 / 0.02, rel=1e-6)
    assert plain["mean_ne"] == pytest.approx(sum(plain["eval"][t]["ne"] for t in TASKS) / 3, rel=1e-12)
    assert {r["status"] for r in f2.values()} == {"completed", "diverged"}
    for study in ("lr_recovery/lr_recovery", "ablation/ablation", "probe_bias/probe_bias", "signal_noise/signal_noise"):
        assert load(os.path.join(docs, study, RESULTS))


def test_paired_runs_pairs_by_seed_and_reports_each_configuration_s_speed():
    from studies import paired_runs as P

    pset = P.PairedSet("t", {"a": (), "b": ()}, (("a", "b"),), seeds=(0, 1, 2))
    results = {}
    for s, (ne_a, ne_b) in enumerate([(0.80, 0.78), (0.79, 0.78), (0.81, 0.78)]):
        results[f"a/seed{s}"] = {**_line(f"a/seed{s}"), "mean_ne": ne_a, "examples_per_sec": 100.0 + s}
        results[f"b/seed{s}"] = {**_line(f"b/seed{s}"), "mean_ne": ne_b, "examples_per_sec": 200.0}
    results["b/seed2"] = {**results["b/seed2"], "status": "diverged"}  # not completed: seed 2 unpaired
    summary = P.summarize(pset, results)
    pair = summary["pairs"][0]
    assert pair["seeds"] == [0, 1] and pair["mean"] == pytest.approx(0.015)
    assert summary["configs"]["a"]["examples_per_sec"] == 101.0 and summary["configs"]["b"]["completed"] == 2
    assert "| a | 3 / 3 | 0.8000 |" in P.render("t", pset, summary)


def test_a_run_recorded_while_hdet_enabled_loaded_the_controller_compares_as_hdet_controller():
    """conf/hdet/enabled.yaml held the controller until CONTROLLER_WAS_ENABLED_UNTIL (the range test on the replicas
    took the name, the controller moved to controller.yaml): a line from then that spelled hdet=enabled without a
    range test is read as hdet=controller; a range-test line, a later or unknown commit, keep their spelling."""
    from studies.results import CONTROLLER_WAS_ENABLED_UNTIL, current_spelling

    before = "e7f78bf"  # an ancestor of the commit that moved the controller
    controller = ["data.reserve_rows=4096", "hdet=enabled", "hdet.alpha=0.25"]
    assert current_spelling(controller, before) == ["data.reserve_rows=4096", "hdet=controller", "hdet.alpha=0.25"]
    assert current_spelling(controller, CONTROLLER_WAS_ENABLED_UNTIL)[1] == "hdet=controller"
    range_test = ["hdet=enabled", "hdet.range_test.steps=100"]
    assert current_spelling(range_test, before) == range_test
    assert current_spelling(controller, "0" * 40) == controller  # git cannot place it: left as recorded
    assert current_spelling(controller, None) == controller
    line = {"overrides": ["+experiment=baseline_low", "seed=1", *controller], "commit": before}
    assert study_overrides(line) == ["data.reserve_rows=4096", "hdet=controller", "hdet.alpha=0.25"]
