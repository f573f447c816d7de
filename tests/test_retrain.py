"""The scheduled retraining job (pipelines/retrain.py).

Fast tests: planning, the gate, interrupted publishes, a damaged registry, the lock and the
command line, on hand-made registries (no training). The slow test runs the job end to end on the
retrain_demo data: three consecutive days, a planted bad day, a rerun, a concurrent job, and kills
during training and during publishing that end in the same registry state as an uninterrupted run.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from pipelines import day_plan as P
from pipelines import gate as G
from pipelines import lr_carry as C
from pipelines import retrain as R
from pipelines.day_training import training_overrides
from pipelines.registry import Registry
from pipelines.retrain_day import FAULT_ENV
from data_tools.exit_status import ExitStatus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAYS = ["20220408", "20220409", "20220410", "20220411"]


def _version(reg: Registry, tmp_path, name, status, parent, days, **manifest):
    src = tmp_path / "src" / name
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / ".metadata").write_text(name)
    reg.add_version(name, {"checkpoint": str(src / "checkpoint")},
                    {"status": status, "parent": parent, "train_days": days, "day": days[-1],
                     "gate": {"reasons": [] if status == "published" else ["like: NE worse"]}, **manifest})
    if status == "published":
        reg.set_current(name)
        reg.log_event({"event": "published", "version": name})


def _cfg(**gate):
    cfg = R.compose(["registry=/nonexistent", "data.root=/nonexistent"])
    for k, v in gate.items():
        OmegaConf.update(cfg, f"gate.{k}", v)
    return cfg


def test_plan_cold_start_then_one_day_at_a_time(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    (plan,) = P.plan_days(reg, DAYS[:3], None, force=False)
    assert plan.cold_start and plan.train_days == DAYS[:3] and plan.day == DAYS[2]
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:3])
    assert P.plan_days(reg, DAYS[:3], None, force=False) == []  # idempotent: nothing new
    plans = P.plan_days(reg, DAYS, None, force=False)
    assert [(p.day, p.train_days, p.cold_start) for p in plans] == [(DAYS[3], [DAYS[3]], False)]
    assert P.plan_days(reg, DAYS, DAYS[2], force=False) == []  # until=: later days wait
    (forced,) = P.plan_days(reg, DAYS[:3], None, force=True)
    assert forced.train_days == [DAYS[2]] and not forced.cold_start
    # A rejected day is not retried (unless forced); the next day follows it.
    _version(reg, tmp_path, "v0002", "rejected", "v0001", [DAYS[3]])
    assert P.plan_days(reg, DAYS, None, force=False) == []
    assert [p.day for p in P.plan_days(reg, DAYS + ["20220412"], None, False)] == ["20220412"]


def test_until_a_version_is_published_each_run_cold_starts(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "rejected", None, DAYS[:2])
    (plan,) = P.plan_days(reg, DAYS[:3], None, force=False)
    assert plan.cold_start and plan.train_days == DAYS[:3]


def _evals(candidate_ne, published_ne, calibration=1.0, half_width=0.005):
    cand = {"rows": 1000, "eval": {t: {"ne": ne, "calibration": calibration} for t, ne in candidate_ne.items()}}
    pub = {"eval": {t: {"ne": ne} for t, ne in published_ne.items()},
           "paired": {t: {"diff": candidate_ne[t] - ne, "low": candidate_ne[t] - ne - half_width,
                          "high": candidate_ne[t] - ne + half_width, "rows": 1000} for t, ne in published_ne.items()}} \
        if published_ne else None
    return cand, pub


def test_gate_rules():
    cfg = _cfg(ne_tolerance=0.0, max_ne=1.0, calibration=[0.8, 1.25])
    done = {"status": "completed"}
    ok = G.gate(cfg, done, *_evals({"like": 0.80, "long_dwell": 0.70}, {"like": 0.799, "long_dwell": 0.71}))
    assert ok["decision"] == "published" and ok["reasons"] == []
    assert ok["tasks"]["like"]["published_ne"] == 0.799 and ok["tasks"]["like"]["paired"]["low"] < 0
    # Worse by 0.004, but the interval reaches below zero: noise, published.
    noise = G.gate(cfg, done, *_evals({"like": 0.804}, {"like": 0.80}))
    assert noise["decision"] == "published", noise["reasons"]
    worse = G.gate(cfg, done, *_evals({"like": 0.81, "long_dwell": 0.70}, {"like": 0.80, "long_dwell": 0.71}))
    assert worse["decision"] == "rejected" and worse["reasons"] == [
        "like: NE 0.8100 worse than the published model's 0.8000 by +0.0100, interval [+0.0050, +0.0150] (z 1.96, "
        "1000 rows) entirely above gate.ne_tolerance 0"]
    tolerated = G.gate(_cfg(ne_tolerance=0.006), done, *_evals({"like": 0.81}, {"like": 0.80}))
    assert tolerated["decision"] == "published"
    useless = G.gate(cfg, done, *_evals({"like": 1.003}, None))
    assert useless["decision"] == "rejected" and "gate.max_ne" in useless["reasons"][0]
    miscalibrated = G.gate(cfg, done, *_evals({"like": 0.8}, {"like": 0.8}, calibration=1.4))
    assert "calibration 1.400 outside gate.calibration [0.8, 1.25]" in miscalibrated["reasons"][0]
    diverged = G.gate(cfg, {"status": "diverged"}, None, None)
    assert diverged["decision"] == "rejected" and "did not complete (status 'diverged')" in diverged["reasons"][0]


def _paired(low):
    return {"diff": low + 0.001, "low": low, "high": low + 0.002, "rows": 1000}


def test_gate_thresholds_hold_exactly_at_their_boundaries():
    # Each threshold at its exact value (binary-exact numbers, so no rounding decides): NE at max_ne is
    # refused (">=": no better than the positive rate), a calibration at either bound passes (inclusive),
    # an interval whose low end is exactly ne_tolerance is not "entirely above" it (passes).
    cfg = _cfg(ne_tolerance=0.25, max_ne=0.75, calibration=[0.5, 1.5])
    done = {"status": "completed"}

    def decide(ne=0.5, cal=1.0, low=None):
        cand = {"rows": 1000, "eval": {"like": {"ne": ne, "calibration": cal}}}
        pub = None if low is None else {"eval": {"like": {"ne": 0.5}}, "paired": {"like": _paired(low)}}
        return G.gate(cfg, done, cand, pub)

    assert decide()["decision"] == "published"
    at_max = decide(ne=0.75)
    assert at_max["decision"] == "rejected" and at_max["reasons"] == [
        "like: NE 0.7500 >= gate.max_ne 0.75 (no better than the held-out rows' positive rate)"]
    assert decide(ne=0.7499)["decision"] == "published"
    for cal in (0.5, 1.5):  # the bounds themselves are inside
        assert decide(cal=cal)["decision"] == "published", cal
    for cal in (0.4999, 1.5001):
        outside = decide(cal=cal)
        assert outside["decision"] == "rejected" and outside["reasons"] == [
            f"like: calibration {cal:.3f} outside gate.calibration [0.5, 1.5]"], cal
    assert decide(low=0.25)["decision"] == "published"  # not *above* the tolerance
    worse = decide(low=0.2501)
    assert worse["decision"] == "rejected" and "entirely above gate.ne_tolerance 0.25" in worse["reasons"][0]
    assert G.worse_with_confidence(_paired(0.25), 0.25) is False
    assert G.worse_with_confidence(_paired(0.2501), 0.25) is True
    assert G.worse_with_confidence({"low": None}, 0.0) is False  # no interval: no evidence of harm


def test_gate_refuses_missing_or_non_finite_metrics_and_a_missing_summary():
    cfg = _cfg(ne_tolerance=0.0, max_ne=1.0, calibration=[0.8, 1.25])
    done = {"status": "completed"}

    def decide(summary=done, **like):
        m = {"ne": 0.8, "calibration": 1.0, **like}
        return G.gate(cfg, summary, {"rows": 1000, "eval": {"like": m, "long_dwell": {"ne": 0.7, "calibration": 1.0}}},
                      None)

    assert decide()["decision"] == "published" and decide()["reasons"] == []
    for ne in (None, float("nan"), float("inf"), float("-inf")):
        d = decide(ne=ne)
        assert d["decision"] == "rejected" and d["reasons"] == ["like: NE is not finite"], (ne, d)
    no_cal = decide(calibration=None)
    assert no_cal["decision"] == "rejected" and no_cal["reasons"] == [
        "like: calibration undefined outside gate.calibration [0.8, 1.25]"]
    nan_cal = decide(calibration=float("nan"))  # NaN compares false to both bounds: outside
    assert nan_cal["decision"] == "rejected" and "like: calibration nan outside" in nan_cal["reasons"][0]
    for summary, shown in ((None, "None"), ({}, "None"), ({"status": "diverged"}, "'diverged'")):
        d = decide(summary=summary)  # good metrics do not make up for a run that did not complete
        assert d["decision"] == "rejected" and d["reasons"] == [f"the run did not complete (status {shown})"], summary
    # a completed run that was never scored has nothing checked: refused, not published
    unscored = G.gate(cfg, done, None, None)
    assert unscored["decision"] == "rejected" and unscored["reasons"] == [
        "the candidate was not scored on the held-out rows (no metrics to check)"]


def test_an_interrupted_publish_is_finished_but_a_rollback_is_not_undone(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:3])
    # Killed after the version's rename, before current's: the newest published version is not current.
    src = tmp_path / "src" / "v0002"
    (src / "checkpoint").mkdir(parents=True)
    reg.add_version("v0002", {"checkpoint": str(src / "checkpoint")},
                    {"status": "published", "parent": "v0001", "train_days": [DAYS[3]], "day": DAYS[3]})
    assert reg.current() == "v0001"
    assert P.finish_interrupted_publish(reg) == "v0002" and reg.current() == "v0002"
    assert P.finish_interrupted_publish(reg) is None
    reg.rollback()  # an operator's rollback to v0001 stays
    assert P.finish_interrupted_publish(reg) is None and reg.current() == "v0001"


def test_a_damaged_registry_is_named(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:3])
    os.rename(reg.version_dir("v0001"), str(tmp_path / "moved"))
    with pytest.raises(P.RetrainError, match="points at versions/v0001, which is missing.*rollback to="):
        P.check_registry(reg)


def _main(tmp_path, *args):
    return R.main([*args, f"registry={tmp_path / 'registry'}", f"data.root={tmp_path / 'data'}"])


def test_carried_lrs_stay_within_the_clamp_around_the_daily_preset():
    cfg = _cfg()
    preset = C.preset_lrs(cfg, "retrain_daily")
    assert set(preset) == {"embedding", "transformer", "non_embedding", "no_decay"}
    assert preset == C.preset_lrs(OmegaConf.merge(cfg, {"overrides": []}), cfg.experiment)
    changed = OmegaConf.merge(cfg, {"overrides": ["optim.lr.transformer=0.123"]})
    assert C.preset_lrs(changed, "retrain_daily")["transformer"] == 0.123  # the job's overrides count
    e, t = preset["embedding"], preset["transformer"]
    bases = {"embedding": e * 10, "transformer": t / 100, "non_embedding": preset["non_embedding"] * 2}
    clamped = C.clamp_carried(bases, preset, 4.0)
    assert clamped["embedding"] == pytest.approx(e * 4) and clamped["transformer"] == pytest.approx(t / 4)
    assert clamped["non_embedding"] == pytest.approx(preset["non_embedding"] * 2)  # inside: carried as is
    assert C.clamp_carried(bases, preset, None) == bases


def test_command_line_errors_and_statuses(tmp_path, capsys):
    assert R.main(["registry=/x"]) == 2  # data.root missing
    assert "data.root: missing" in capsys.readouterr().err
    assert R.main(["--bogus", "registry=/x", "data.root=/y"]) == 2
    assert R.main(["registry=/x", "data.root=/y", "gate.calibration=[1.2,1.3]"]) == 2
    assert R.main(["registry=/x", "data.root=/y", "carry_lr_clamp=0.5"]) == 2
    assert "carry_lr_clamp=0.5: must be a number >= 1 or null" in capsys.readouterr().err
    assert _main(tmp_path) == ExitStatus.USAGE  # no data set there: bad input
    assert "meta.json missing" in capsys.readouterr().err
    # status and rollback read the registry only: no data.root needed
    assert R.main(["status", f"registry={tmp_path / 'registry'}"]) == 2  # no registry at that path
    assert "no registry there" in capsys.readouterr().err
    os.makedirs(tmp_path / "registry")
    assert R.main(["status", f"registry={tmp_path / 'registry'}"]) == 2  # an empty directory is no registry
    assert "create one with `python -m pipelines.retrain adopt" in capsys.readouterr().err
    assert R.main(["rollback", f"registry={tmp_path / 'noreg'}"]) == 2  # no lock taken, nothing created
    assert "no registry there (nothing was created)" in capsys.readouterr().err and not (tmp_path / "noreg").exists()
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:3])
    _version(reg, tmp_path, "v0002", "published", "v0001", [DAYS[3]],
             lr_start={"embedding": 0.005, "transformer": 0.0001}, lr_preset={"embedding": 0.02, "transformer": 0.001})
    assert _main(tmp_path, "rollback") == ExitStatus.OK and reg.current() == "v0001"
    assert _main(tmp_path, "rollback", "to=v0002") == ExitStatus.OK and reg.current() == "v0002"
    assert _main(tmp_path, "rollback", "to=v0009") == ExitStatus.FAILED
    assert _main(tmp_path, "status") == ExitStatus.OK
    out = capsys.readouterr().out
    assert "* v0002 published parent=v0001" in out and "  v0001 published" in out
    assert "started from carried embedding=0.005 (x0.25 preset) transformer=0.0001 (x0.10 preset)" in out
    assert R.main(["status", "json=true", f"registry={tmp_path / 'registry'}"]) == ExitStatus.OK
    status = json.loads(capsys.readouterr().out)
    assert status["current"] == "v0002" and status["damaged"] is None
    assert [(v["version"], v["parent"], v["current"]) for v in status["versions"]] == [
        ("v0001", None, False), ("v0002", "v0001", True)]
    assert status["versions"][1]["lr_start"] == {"embedding": 0.005, "transformer": 0.0001}
    with reg.lock():  # another job holds the registry
        assert _main(tmp_path, "rollback") == ExitStatus.BUSY
    assert "BUSY" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# End to end (slow)

NPROC = 2


def _job(tmp_path, name, data, *extra, env=None):
    demo = __import__("pipelines.retrain_demo", fromlist=["x"])
    # HDET on: the carried LRs are the controller's, and a killed HDET day must resume bit for bit too
    cmd = [sys.executable, "-m", "pipelines.retrain", *extra, f"registry={tmp_path / name}", f"data.root={data}",
           "overrides=[" + ",".join(f"'{o}'" for o in (*demo.DEMO_OVERRIDES, f"trainer.nproc={NPROC}", *demo.DEMO_CONTROLLER)) + "]"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})


def _finish(proc, timeout=900):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _lineage(reg_dir):
    reg = Registry(str(reg_dir))
    out = []
    for v in reg.list_versions():
        m = reg.manifest(v)
        out.append((v, m["status"], m["parent"], m["train_days"], m["gate"]["decision"],
                    {t: round(r["candidate_ne"], 6) for t, r in m["gate"]["tasks"].items()},
                    sorted(m["hdet_bases"])))
    return out, reg.current()


@pytest.mark.slow
def test_three_days_a_bad_day_a_rerun_a_concurrent_job_and_kills(tmp_path):
    """Two registries on the same data, day by day: ``reg`` uninterrupted, ``reg2`` killed during
    training (day 1) and between its version's rename and current's (day 2). Both must end in the
    same registry state, metrics included (a resumed run is bit-identical to an uninterrupted one)."""
    from data_tools.prepare import append_synthetic_days, ensure_dataset
    from pipelines.retrain_demo import shuffle_labels

    spec = OmegaConf.load(os.path.join(ROOT, "conf", "data", "retrain_demo.yaml"))
    data = str(tmp_path / "data")
    ensure_dataset(data, OmegaConf.to_container(spec.generator), {})

    # Day 1 (cold start, v0001); a second job is refused at once while the first holds the lock.
    first = _job(tmp_path, "reg", data, "create=true")  # the first run creates the registry
    deadline = time.time() + 120
    while not (tmp_path / "reg" / ".lock").exists() and time.time() < deadline:
        time.sleep(0.2)
    code, out = _finish(_job(tmp_path, "reg", data), timeout=120)
    assert code == ExitStatus.BUSY and "locked by another retraining job" in out, out
    code, out = _finish(first)
    assert code == ExitStatus.OK, out
    killed = _job(tmp_path, "reg2", data, "create=true")
    deadline = time.time() + 600
    while time.time() < deadline and not list((tmp_path / "reg2" / "work").glob("*/checkpoint/step-*/manifest.json")):
        time.sleep(0.5)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert Registry(str(tmp_path / "reg2")).list_versions() == []
    code, out = _finish(_job(tmp_path, "reg2", data))
    assert code == ExitStatus.OK and "resum" in open(
        Registry(str(tmp_path / "reg2")).version_dir("v0001") + "/train.log").read(), out

    # Day 2: published (v0002, warm start, carried LRs: carry_lr is off by default); reg2 is killed
    # mid-publish, then finished. Switching carry_lr on is a changed setting: refused unless allowed.
    (day4,) = append_synthetic_days(data, 1)
    code, out = _finish(_job(tmp_path, "reg", data, "carry_lr=true"))
    assert code == ExitStatus.USAGE and "carry_lr: False -> True" in out, out
    code, out = _finish(_job(tmp_path, "reg", data, "carry_lr=true", "allow_config_change=true"))
    assert code == ExitStatus.OK, out
    code, out = _finish(_job(tmp_path, "reg2", data, "carry_lr=true", "allow_config_change=true",
                             env={FAULT_ENV: "kill_before_current"}))
    assert code == -signal.SIGKILL, out
    assert Registry(str(tmp_path / "reg2")).current() == "v0001"  # never pointed at an incomplete version
    code, out = _finish(_job(tmp_path, "reg2", data, "carry_lr=true"))
    assert code == ExitStatus.NOTHING_TO_DO and "finished the interrupted publish of v0002" in out, out

    # Day 3: a planted bad day (labels shuffled) is rejected; a rerun does nothing.
    (day5,) = append_synthetic_days(data, 1)
    shuffle_labels(data, day5)
    for reg in ("reg", "reg2"):
        code, out = _finish(_job(tmp_path, reg, data, "carry_lr=true"))
        assert code == ExitStatus.REJECTED and "REJECTED" in out, out
    code, out = _finish(_job(tmp_path, "reg", data, "carry_lr=true"))
    assert code == ExitStatus.NOTHING_TO_DO and "nothing to do" in out, out

    lineage, current = _lineage(tmp_path / "reg")
    assert [(v, s, p, d[-1]) for v, s, p, d, *_ in lineage] == [
        ("v0001", "published", None, "20220410"), ("v0002", "published", "v0001", day4),
        ("v0003", "rejected", "v0002", day5)]
    assert current == "v0002"
    registry = Registry(str(tmp_path / "reg"))
    m2 = registry.manifest("v0002")
    # Carried: v0001's bases, within the clamp around the preset (conf/retrain.yaml: x4).
    assert m2["lr_start"] == C.clamp_carried(registry.manifest("v0001")["hdet_bases"], m2["lr_preset"], 4.0)
    assert set(m2["hdet_bases"]) == {"embedding", "transformer", "non_embedding", "no_decay"}
    # Every version's runs held out the same slice (the loader never trains on it: test_loader).
    assert {json.dumps(registry.manifest(v)["holdout"]) for v in ("v0001", "v0002", "v0003")} \
        == {json.dumps({"fraction": 0.1, "seed": 0})}
    assert _lineage(tmp_path / "reg2") == (lineage, current)
    # Each version's report names its lineage, as the job wrote it: the gate's decision and the parent.
    for version, decision, parent in (("v0001", "published", "no parent: a cold start"),
                                      ("v0003", "rejected", "parent <code>v0002</code>")):
        report = open(os.path.join(registry.version_dir(version), "report.html")).read()
        assert f"Gate decision: <b>{decision}</b>" in report and parent in report, version


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path, tiny_dataset, capsys):
    import shutil

    shutil.copytree(tiny_dataset, tmp_path / "data")
    days = sorted(json.loads((tmp_path / "data" / "meta.json").read_text())["days"])
    assert _main(tmp_path, "dry_run=true") == ExitStatus.USAGE  # no registry there: a typo'd path is not a new one
    assert "no registry there (nothing was created)" in capsys.readouterr().err
    assert _main(tmp_path, "dry_run=true", "create=true") == ExitStatus.OK  # there is work: the run would train
    assert f"would train day {days[-1]} on {days[0]}..{days[-1]} (cold start)" in capsys.readouterr().out
    assert not (tmp_path / "registry").exists()  # a dry run writes nothing, not even the registry
    reg = Registry(str(tmp_path / "registry"))
    holdout = {"fraction": 0.1, "seed": 0}  # the job's: the dry run checks the day's setup as the run would
    _version(reg, tmp_path, "v0001", "published", None, days[:1], holdout=holdout)
    listing = lambda: sorted(os.listdir(tmp_path / "registry"))  # no lock file either
    before = listing()
    assert _main(tmp_path, "dry_run=true", f"until={days[1]}") == ExitStatus.OK
    out = capsys.readouterr().out
    assert f"would train day {days[1]} on {days[1]}..{days[1]} (warm start" in out and days[2] not in out
    assert listing() == before and reg.list_versions() == ["v0001"]
    _version(reg, tmp_path, "v0002", "published", "v0001", days[1:], holdout=holdout)
    assert _main(tmp_path, "dry_run=true") == ExitStatus.NOTHING_TO_DO  # every day trained on
    assert "nothing to do" in capsys.readouterr().out
    # "nothing to do" is the scheduler's choice (Airflow skips a task on 99); the other codes are taken
    assert _main(tmp_path, "dry_run=true", "nothing_to_do_exit=99") == 99
    assert _main(tmp_path, "dry_run=true", "nothing_to_do_exit=4") == ExitStatus.USAGE
    assert "nothing_to_do_exit=4" in capsys.readouterr().err
    assert _main(tmp_path, "until=20990101") == ExitStatus.FAILED
    assert "until=20990101: not a day of" in capsys.readouterr().err


def test_status_into_a_closed_pipe_ends_quietly(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:3])
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.retrain", "status", f"registry={tmp_path / 'registry'}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written (as `| head` after its lines)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == ExitStatus.OK, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _day_config(cfg, plan, days, warm):
    from recsys_hdet.api import compose_config

    return compose_config(training_overrides(cfg, plan, days, warm, {}))


def test_a_changed_setting_between_days_is_refused_naming_the_keys(tmp_path, tiny_dataset, capsys):
    import shutil

    from pipelines.settings import changed_settings, job_settings

    shutil.copytree(tiny_dataset, tmp_path / "data")
    days = sorted(json.loads((tmp_path / "data" / "meta.json").read_text())["days"])
    cfg = R.compose([f"registry={tmp_path / 'registry'}", f"data.root={tmp_path / 'data'}"])
    cold = _day_config(cfg, P.DayPlan(days[0], days[:1], True), days, None)
    warm = _day_config(cfg, P.DayPlan(days[1], days[1:2], False), days, "/published/checkpoint")
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, days[:1], experiment="retrain_daily",
             settings=job_settings(cfg), holdout=OmegaConf.to_container(cfg.holdout))
    version_dir = reg.version_dir("v0001")
    os.makedirs(os.path.join(version_dir, ".hydra"))
    OmegaConf.save(cold, os.path.join(version_dir, ".hydra", "config.yaml"), resolve=True)
    manifest = reg.manifest("v0001")
    # A cold start and the next warm day differ only in the keys each day sets: nothing to refuse.
    assert changed_settings(cfg, manifest, version_dir, warm, "retrain_daily").refused == []
    changed_cfg = OmegaConf.merge(cfg, {"overrides": ["model.dropout=0.3"], "seed": 4})
    changed = changed_settings(changed_cfg, manifest, version_dir,
                               _day_config(changed_cfg, P.DayPlan(days[1], days[1:2], False), days, "/p"),
                               "retrain_daily").refused
    assert "overrides: [] -> ['model.dropout=0.3']" in changed and "seed: 0 -> 4" in changed
    assert "model.dropout: 0.0 -> 0.3" in changed
    # The job refuses the day before training, exit 2, the keys named, the registry unchanged.
    before = reg.list_versions()
    assert _main(tmp_path, "overrides=['model.dropout=0.3']") == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert "REFUSED" in err and "model.dropout: 0.0 -> 0.3" in err and "allow_config_change=true" in err, err
    assert reg.list_versions() == before and reg.current() == "v0001"
    assert not os.path.exists(tmp_path / "registry" / "work" / days[1] / "summary.json")
    # carry_lr=true on a plain day (the retrain_daily preset is plain) has no controller rates to carry: refused.
    assert _main(tmp_path, "carry_lr=true", "allow_config_change=true") == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert "REFUSED" in err and "carry_lr=true carries the rates the published model's HDET run trained at" in err, err
    assert reg.list_versions() == before


def _settings_case(tmp_path, carry_lr, published_carry_lr=None, **day):
    """changed_settings between a published version trained with a hand-made config and a next day
    whose config differs from it by ``day`` (dotted key -> new value)."""
    from pipelines.settings import changed_settings, job_settings

    cfg = OmegaConf.create({"experiment": "retrain_daily", "cold_start_experiment": "retrain_daily", "overrides": [],
                            "carry_lr": carry_lr, "carry_lr_clamp": 4.0, "seed": 0})
    was = OmegaConf.create({"optim": {"lr": {"embedding": 0.05, "non_embedding": 0.002}, "dense": {"eps": 1e-8}},
                            "trainer": {"warm_start": None, "warm_start_overrides": []},
                            "data": {"until": "20220408", "train_days": 3}, "seed": 0})
    version_dir = tmp_path / "v0001"
    (version_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(was, str(version_dir / ".hydra" / "config.yaml"))
    # the next day: the keys the job sets itself change as they do every day
    now = OmegaConf.merge(was, {"data": {"until": "20220409", "train_days": 1},
                                "trainer": {"warm_start": "/registry/current/checkpoint"}})
    for key, value in day.items():
        OmegaConf.update(now, key, value)
    published = OmegaConf.merge(cfg, {"carry_lr": carry_lr if published_carry_lr is None else published_carry_lr})
    parent = {"experiment": "retrain_daily", "settings": job_settings(published)}
    return changed_settings(cfg, parent, str(version_dir), now, "retrain_daily").refused


def test_the_max_lrs_are_left_out_of_the_settings_check_only_when_they_are_carried(tmp_path):
    assert _settings_case(tmp_path / "a", carry_lr=True) == []
    assert _settings_case(tmp_path / "b", carry_lr=False) == []
    # carry_lr: the day's max LRs are the carried ones, which differ from the version's: allowed
    assert _settings_case(tmp_path / "c", carry_lr=True, **{"optim.lr.embedding": 0.07,
                                                            "optim.lr.non_embedding": 0.001}) == []
    # without carry_lr a changed max LR is a changed setting, named
    assert _settings_case(tmp_path / "d", carry_lr=False, **{"optim.lr.embedding": 0.07}) == [
        "optim.lr.embedding: 0.05 -> 0.07"]
    # carry_lr leaves out optim.lr.* only: other optimizer settings are still compared
    assert _settings_case(tmp_path / "e", carry_lr=True, **{"optim.dense.eps": 1e-6, "optim.lr.embedding": 0.07}) == [
        "optim.dense.eps: 1e-08 -> 1e-06"]
    # a key that merely starts like a left-out one (trainer.warm_start_overrides) is compared
    assert _settings_case(tmp_path / "f", carry_lr=True, **{"trainer.warm_start_overrides": ["model.dropout=0.1"]}) == [
        "trainer.warm_start_overrides: [] -> ['model.dropout=0.1']"]
    # switching carry_lr on between days is itself a changed setting
    assert _settings_case(tmp_path / "g", carry_lr=True, published_carry_lr=False, **{"optim.lr.embedding": 0.07}) == [
        "carry_lr: False -> True"]


def _truncate(path):
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])


def test_a_damaged_current_manifest_is_reported_skipped_and_repaired_by_a_rollback(tmp_path, tiny_dataset, capsys):
    """A truncated manifest of the current version: status lists the version as damaged (text and JSON, exit 6,
    no traceback); the job and its dry run refuse with one line naming the file and the rollback (exit 6, the
    registry unchanged); rollback without a target cannot know the parent; rollback to= an intact version
    repairs it. A manifest edited in place (valid JSON) fails its checksum."""
    reg = Registry(str(tmp_path / "registry"))
    _version(reg, tmp_path, "v0001", "published", None, DAYS[:2])
    _version(reg, tmp_path, "v0002", "published", "v0001", DAYS[:3])
    _truncate(reg.manifest_path("v0002"))
    registry = f"registry={reg.root}"
    files = lambda: {str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "registry").rglob("*")
                     if p.is_file() and p.name != ".lock"}  # the lock file is the job's, its content empty
    before = files()
    capsys.readouterr()

    assert R.main(["status", registry]) == ExitStatus.DAMAGED
    out, err = capsys.readouterr()
    assert "v0002 damaged" in out and "v0001 published" in out and "Traceback" not in out + err
    assert reg.manifest_path("v0002") in err and "rollback to=" in err
    assert R.main(["status", "json=true", registry]) == ExitStatus.DAMAGED
    status = json.loads(capsys.readouterr().out)
    by_version = {v["version"]: v for v in status["versions"]}
    assert by_version["v0002"]["status"] == "damaged" and "unreadable" in by_version["v0002"]["damage"]
    assert by_version["v0001"]["damage"] is None and status["damaged"] and status["current"] == "v0002"

    for dry in ([], ["dry_run=true"]):
        assert R.main([registry, f"data.root={tiny_dataset}", *dry]) == ExitStatus.DAMAGED
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and reg.manifest_path("v0002") in err[0] and "rollback to=VERSION" in err[0], err
    assert files() == before

    assert R.main(["rollback", registry]) == ExitStatus.FAILED and "rollback to=VERSION" in capsys.readouterr().err
    assert reg.current() == "v0002"
    assert R.main(["rollback", "to=v0001", registry]) == ExitStatus.OK and reg.current() == "v0001"

    manifest = json.loads(open(reg.manifest_path("v0001")).read())
    manifest["day"] = DAYS[3]  # an edit that keeps the JSON valid
    with open(reg.manifest_path("v0001"), "w") as f:
        json.dump(manifest, f)
    assert "checksum does not match" in reg.damage("v0001")
