"""The fairness contract every study comparison runs under (studies/contract.py, results.py, runs.py;
docs/studies.md): a collapsed run has failed, runs that trained different rows are never paired, a dirty
tree cannot record into a committed results file, every line names the commit it trained from, and
--verify retrains a recorded run and tells whether it reproduces bit for bit."""
import math
import os
import subprocess

import pytest

from studies.contract import Contract, StudyMismatch, outcome, paired_over_seeds
from studies.provenance import code_state, is_committed_path
from studies.results import StudyFiles
from studies.runs import AblationConfig, differences, print_verification, run_one, verify

ROWS = {"data": "bench", "reserve_rows": 4096, "total_steps": 960, "examples_per_step": 2048}


def _record(name, seed, ne=0.78, status="completed", rows=ROWS, task_ne=None):
    eval_ = {t: {"ne": v} for t, v in (task_ne or {"contribution": ne, "like": ne, "long_dwell": ne}).items()}
    return {"name": f"{name}/seed{seed}", "seed": seed, "status": status, "rows": dict(rows),
            "mean_ne": ne if status == "completed" else None, **({"eval": eval_} if status == "completed" else {})}


def test_a_collapsed_run_has_failed_and_is_never_paired():
    fine = _record("a", 0, 0.78)
    at_base_rate = _record("a", 1, task_ne={"contribution": 0.78, "like": 1.0001, "long_dwell": 0.79})
    just_under = _record("a", 2, task_ne={"contribution": 0.9989, "like": 0.9, "long_dwell": 0.9})
    assert outcome(fine) == "completed" and outcome(just_under) == "completed"
    assert outcome(at_base_rate) == "failed"  # 'completed' as the trainer says, but it predicts the base rate
    assert outcome(_record("a", 3, status="diverged")) == "failed"
    assert outcome(None) is None and outcome({"status": "stopped"}) is None
    contender = {0: fine, 1: at_base_rate, 2: just_under}
    reference = {0: _record("p", 0, 0.80), 1: _record("p", 1, 0.80), 2: _record("p", 2, status="diverged")}
    p = paired_over_seeds(contender, reference)
    # Only seed 0 has a result on both sides; the failures are reported beside, never counted as NE 1.
    assert p["seeds"] == [0] and p["diff"]["mean"] == pytest.approx(-0.02) and p["diff"]["n"] == 1
    assert p["failed"] == [1] and p["reference_failed"] == [2]


def test_a_pairing_across_different_trained_rows_is_refused():
    probe_rows_only_for_hdet = {**ROWS, "reserve_rows": 0, "total_steps": 976}
    with pytest.raises(StudyMismatch, match="trained different rows"):
        paired_over_seeds({0: _record("hdet", 0)}, {0: _record("plain", 0, rows=probe_rows_only_for_hdet)})


def test_the_contract_sets_the_same_rows_and_rollback_for_every_run_and_refuses_a_study_that_changes_them():
    c = Contract()
    assert c.overrides() == ["data.reserve_rows=4096", "trainer.rollback.max_rollbacks=3",
                             "trainer.rollback.lr_factor=0.5"]
    assert c.apply(["optim.lr.embedding=6"]) == [*c.overrides(), "optim.lr.embedding=6"]
    with pytest.raises(StudyMismatch, match="fairness contract"):
        c.apply(["optim.lr.embedding=6", "trainer.rollback.max_rollbacks=0"])


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A small git checkout with a committed results file under docs/."""
    root = tmp_path / "repo"
    (root / "docs" / "study").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "docs" / "study" / "results.jsonl").write_text("")
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    return root


def test_a_dirty_tree_cannot_write_a_committed_results_file(repo):
    out = str(repo / "docs" / "study")
    state = code_state(str(repo))
    assert state["clean"] and len(state["commit"]) == 40
    StudyFiles.open(out, repo=str(repo))  # clean: allowed
    (repo / "docs" / "study" / "results.jsonl").write_text('{"name": "a"}\n')  # a study's own file: still clean
    assert code_state(str(repo))["clean"]
    (repo / "code.py").write_text("x = 2\n")  # a code change that no commit holds
    assert not code_state(str(repo))["clean"]
    with pytest.raises(StudyMismatch, match="commit them first"):
        StudyFiles.open(out, repo=str(repo))
    (repo / "code.py").write_text("x = 1\n")
    (repo / "new_module.py").write_text("y = 1\n")  # untracked code counts too
    with pytest.raises(StudyMismatch, match="--allow-dirty"):
        StudyFiles.open(out, repo=str(repo))
    # A report rebuilt from the file trains nothing: allowed; --allow-dirty records elsewhere.
    assert StudyFiles.open(out, repo=str(repo), train=False).out == os.path.abspath(out)
    elsewhere = StudyFiles.open(out, repo=str(repo), allow_dirty=True)
    assert elsewhere.out == str(repo / "outputs" / "dirty" / "docs" / "study")
    assert elsewhere.results == {"a": {"name": "a"}}  # the committed lines come along, so it resumes there
    # A results file outside the checkout is never a committed one.
    assert not is_committed_path(str(repo.parent / "elsewhere" / "results.jsonl"), str(repo))


def test_differences_are_bit_for_bit_and_leave_timings_out():
    a = {"name": "x", "mean_ne": 0.7812345678901234, "wall_seconds": 10.0, "commit": "a" * 40,
         "syncs": {"losses": [[0.2, 0.21]]}, "hdet": {"seconds": 1.0, "fraction_of_train": 0.1}}
    same_but_timed = {**a, "wall_seconds": 11.0, "commit": "b" * 40, "hdet": {"seconds": 2.0, "fraction_of_train": 0.2}}
    assert differences(a, same_but_timed) == []
    one_ulp = {**a, "mean_ne": math.nextafter(a["mean_ne"], 1.0)}
    assert differences(a, one_ulp) == [f"mean_ne: recorded {a['mean_ne']!r}, retrained {one_ulp['mean_ne']!r}"]
    deep = {**a, "syncs": {"losses": [[0.2, math.nextafter(0.21, 0.0)]]}}
    assert differences(a, deep) == [f"syncs.losses.0.1: recorded 0.21, retrained {math.nextafter(0.21, 0.0)!r}"]
    # A field the lines gained after this one was recorded is nothing to compare with; a lost one is reported.
    assert differences(a, {**a, "rows": {"reserve_rows": 4096}}) == []
    assert differences({**a, "rows": {"reserve_rows": 4096}}, a) == ["rows: only in the recorded line"]


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_verify_reproduces_a_tiny_recorded_run_and_reports_a_planted_one_ulp_change(tmp_path, tiny_dataset, data_cache,
                                                                                      monkeypatch, capsys):
    monkeypatch.setenv("RECSYS_HDET_DATA", data_cache)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    files = StudyFiles.open(str(tmp_path / "study"), contract=Contract(reserve_rows=1024))
    config = AblationConfig("tiny/plain", "baseline_low", "tiny", None, None)
    overrides = ["data=tiny", "trainer.nproc=2", "trainer.sharding_group_size=1", "trainer.tensorboard=false",
                 "trainer.stop_at_step=10", "trainer.log_every=5", "trainer.periodic_checkpoint.every_steps=0"]
    res = run_one(files, config, 0, overrides)
    record = res["record"]
    assert record is not None and record["status"] == "stopped", res
    assert record["commit"] == code_state()["commit"] and record["clean"] == code_state()["clean"]
    assert record["rows"]["reserve_rows"] == 1024 and "data.reserve_rows=1024" in record["overrides"]
    assert record["layout"]["threads_per_worker"] >= 1  # verify pins it: float results depend on it
    result = verify(files, "tiny/plain/seed0")
    assert result["reproduced"], result["differences"]
    # The same retrained line against a recorded one with one planted ulp: reported, naming the field.
    loss = record["train_loss"]["avg"]
    planted = {**record, "train_loss": {**record["train_loss"], "avg": math.nextafter(loss, 2.0)}}
    assert differences(planted, result["record"]) == [
        f"train_loss.avg: recorded {planted['train_loss']['avg']!r}, retrained {loss!r}"]
    assert print_verification("tiny/plain/seed0", {**result, "differences": differences(planted, result["record"]),
                                                      "reproduced": False}) == 1
    assert "NOT reproduced, 1 differences" in capsys.readouterr().out
