"""One spelling per argument in every command (issue 47): the data set is ``data.root=DIR``, a run
``run_dir=DIR``, an output ``out=PATH``, every other option ``key=value`` (data_tools.cli_args). Each old
spelling is refused with exit 2 and one line naming the new one; the shared parser's errors are one line;
``retrain adopt`` takes the run's data preset and layout from its recorded config."""

import importlib
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from conftest import REPO, call_command, run_command

# (module, its entry point, argv, the new spelling the refusal names)
OLD_SPELLINGS = [
    ("data_tools.convert", "main", ["--log", "a.csv", "--out", "D"], "use log=CSV"),
    ("data_tools.convert", "main", ["log=a.csv", "--out", "D"], "--out is no longer accepted; use data.root=DIR"),
    ("data_tools.convert", "main", ["--append-to", "D"], "use data.root=DIR append=true"),
    ("data_tools.convert", "main", ["--min-count", "user_id=2"], "use min_count.NAME=INT"),
    ("data_tools.convert", "main", ["--chunk-rows", "5"], "--chunk-rows is no longer accepted; use chunk_rows=N"),
    ("data_tools.convert", "main", ["--overwrite"], "use overwrite=true"),
    ("data_tools.validate", "main", ["D"], "a positional argument (D) is no longer accepted; use data.root=DIR"),
    ("data_tools.relayout", "main", ["D"], "use data.root=DIR"),
    ("data_tools.relayout", "main", ["data.root=D", "--row-group-rows", "5"], "use row_group_rows=N"),
    ("data_tools.generate", "main", ["--out", "D"], "--out is no longer accepted; use out=DIR"),
    ("data_tools.generate", "main", ["--append-to", "D"], "use data.root=DIR append=true"),
    ("data_tools.generate", "main", ["append=true", "out=D"], "out=D with append=true is no longer accepted"),
    ("data_tools.generate", "main", ["out=D", "--n-users", "5"], "--n-users is no longer accepted; use n_users=INT"),
    ("pipelines.retrain", "main", ["registry=R", "data_root=D"], "data_root= is no longer accepted; use data.root=DIR"),
    ("pipelines.retrain", "main", ["adopt", "registry=R", "run_dir=X", "data_root=D"], "use data.root=DIR"),
    ("pipelines.retrain", "main", ["--until", "20220410", "registry=R"], "use until=DAY"),
    ("pipelines.retrain", "main", ["--dry-run", "registry=R"], "use dry_run=true"),
    ("pipelines.retrain", "main", ["--force", "registry=R"], "use force=true"),
    ("pipelines.retrain", "main", ["rollback", "--to", "v0001", "registry=R"], "use to=VERSION"),
    ("pipelines.retrain", "main", ["status", "--json", "registry=R"], "use json=true"),
    ("recsys_hdet.train", "cli", ["data=tiny", "hydra.run.dir=D"], "hydra.run.dir= is no longer accepted; use run_dir=DIR"),
    ("recsys_hdet.lr_find", "cli", ["hydra.run.dir=D"], "use run_dir=DIR"),
    ("recsys_hdet.evaluate", "run", ["run_dir=R", "data_root=D"], "data_root= is no longer accepted; use data.root=DIR"),
    ("recsys_hdet.export", "run", ["run_dir=R", "out=M", "data_root=D"], "use data.root=DIR"),
    ("recsys_hdet.predict", "run", ["model_dir=M", "input=D", "out=S"],
     "input= is no longer accepted; use data.root=DIR (a processed data set) or log=CSV (a raw log)"),
]


_call = call_command


@pytest.mark.parametrize("module, entry, argv, new", OLD_SPELLINGS, ids=[f"{m}:{' '.join(a)}" for m, _, a, _ in OLD_SPELLINGS])
def test_an_old_spelling_is_refused_naming_the_new_one(module, entry, argv, new, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing may be written, not even Hydra's output directory
    assert _call(module, entry, argv, monkeypatch) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and new in lines[0] and "error" in lines[0], err
    assert os.listdir(tmp_path) == []


def test_the_installed_commands_refuse_an_old_spelling_too(tmp_path):
    bin_dir = os.path.dirname(sys.executable)
    for cmd, new in ((["recsys-hdet-validate", str(tmp_path)], "use data.root=DIR"),
                     (["recsys-hdet-convert", "--out", str(tmp_path / "o")], "use data.root=DIR")):
        proc = subprocess.run([os.path.join(bin_dir, cmd[0]), *cmd[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and new in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---- the shared parser (data_tools.cli_args) -------------------------------------------------------------

@pytest.mark.parametrize("module, argv, said", [
    ("relayout", ["data.root=D", "bogus=1"], "config bogus: unknown key"),
    ("relayout", ["data.root=D", "row_group_rows=many"], "config row_group_rows: Value 'many'"),
    ("relayout", [], "config data.root: missing (pass data.root=DIR)"),
    ("relayout", ["data.root=D", "row_group_rows=1,2"], "several values"),
    ("generate", ["out"], "out: expected key=value"),
    ("convert", ["log=a.csv", "users=u.csv", "videos=v.csv"], "config data.root: missing (pass data.root=DIR)"),
])
def test_a_bad_argument_is_one_line_and_exit_2(module, argv, said, capsys):
    main = importlib.import_module(f"data_tools.{module}").main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_help_lists_the_keys(capsys):
    from data_tools.convert import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for key in ("log=CSV", "data.root=DIR", "append=true", "min_count={NAME:INT}", "chunk_rows=N", "overwrite=true"):
        assert f"  {key}" in out, key


def test_values_take_hydras_grammar():
    from data_tools.cli_args import parse
    from data_tools.convert import ConvertArgs

    common = ["users=u.csv", "videos=v.csv", "data.root=D"]
    args = parse(["log=[a.csv,b.csv]", *common, "min_count.user_id=5", "overwrite=true", "chunk_rows=10"], ConvertArgs,
                 "convert", "")
    assert args.log == ["a.csv", "b.csv"] and args.min_count == {"user_id": 5} and args.overwrite and args.chunk_rows == 10
    args = parse(["log=raw/log_standard_*.csv", *common, "min_count={user_id:5,video_id:2}"], ConvertArgs, "convert", "")
    assert args.log == "raw/log_standard_*.csv" and args.min_count == {"user_id": 5, "video_id": 2}
    assert args.data.root == "D" and not args.append


def test_run_dir_becomes_hydras_run_dir_before_hydra_reads_it(monkeypatch, capsys):
    from recsys_hdet.config import run_dir_argument

    monkeypatch.setattr(sys, "argv", ["train", "+experiment=demo", "run_dir=outputs/x", "seed=1"])
    run_dir_argument()
    assert sys.argv == ["train", "+experiment=demo", "hydra.run.dir=outputs/x", "seed=1"]
    monkeypatch.setattr(sys, "argv", ["train", "-m", "run_dir=outputs/x", "seed=1,2"])
    with pytest.raises(SystemExit) as e:
        run_dir_argument()
    assert e.value.code == 2 and "hydra.sweep.dir" in capsys.readouterr().err


# ---- retrain adopt: the run's own data preset and layout ------------------------------------------------

def _recorded_run(tmp_path, overrides):
    """A run directory's recorded config and overrides (as the training command writes them) for ``overrides``."""
    from recsys_hdet.config import compose
    from recsys_hdet.run_dir import RunDir

    run = RunDir(str(tmp_path / "run"))
    os.makedirs(run.path(RunDir.HYDRA))
    OmegaConf.save(compose("config", overrides), run.path(RunDir.CONFIG))
    OmegaConf.save(OmegaConf.create(list(overrides)), run.path(RunDir.OVERRIDES))
    return SimpleNamespace(cfg=run.config(), files=run)


def test_adopt_takes_the_overrides_from_the_runs_recorded_config(tmp_path):
    from pipelines import retrain as R
    from pipelines.day_plan import RetrainError
    from pipelines.registry_commands import adopted_overrides

    run = _recorded_run(tmp_path, ["+experiment=retrain_daily", "data=tiny", "data.root=/data", "trainer.nproc=2",
                                   "seed=3", "data.eval_days=1"])
    cfg = R.compose(["registry=/x"], needs_data=False, command="adopt")
    # the job's own keys (the data set, the day window, the seed) and the preset are the job's
    assert adopted_overrides(cfg, run, given=False) == ["data=tiny", "trainer.nproc=2"]
    cfg.overrides = ["trainer.nproc=2", "data=tiny"]  # given, and the same config: accepted as given
    assert adopted_overrides(cfg, run, given=True) == ["trainer.nproc=2", "data=tiny"]
    for contradicting, key in ((["data=kuairand", "trainer.nproc=2"], "data.name: 'tiny' -> 'kuairand'"),
                               (["data=tiny"], "trainer.nproc: 2 -> 4")):
        cfg.overrides = contradicting
        with pytest.raises(RetrainError, match="leave overrides out") as e:
            adopted_overrides(cfg, run, given=True)
        assert key in str(e.value), str(e.value)
    # a run of another preset: its config is the registry's settings, so the job's preset's other values are
    # refused, named, as the daily check would refuse every day (here the demo preset's max LRs)
    other = _recorded_run(tmp_path / "demo", ["+experiment=demo", "trainer.nproc=2"])
    with pytest.raises(RetrainError, match="every day's run would be refused the same way") as e:
        adopted_overrides(R.compose(["registry=/x"], needs_data=False, command="adopt"), other, given=False)
    assert "optim.lr.embedding: 0.05 -> 0.02; optim.lr.no_decay: 0.002 -> 0.001" in str(e.value), str(e.value)
    # allowed: the job's experiment gets data=<the run's>
    allowed = R.compose(["registry=/x", "allow_config_change=true"], needs_data=False, command="adopt")
    assert adopted_overrides(allowed, other, given=False) == ["trainer.nproc=2", "data=demo"]


@pytest.mark.slow  # the default run's budget (under 10 minutes on 2 cores): run by `make test-recovery` in CI
def test_adopt_holds_the_runs_settings_against_the_days_preset(hdet_run, tmp_path, data_cache, tiny_dataset):
    """The tiny HDET run (the default preset, HDET's controller) adopted into a job whose days train the
    ``retrain_daily`` preset: refused (exit 2, the differing keys named, nothing created; before: adopted without a
    word); with allow_config_change=true adopted, the keys noted, and the run's config is the registry's settings:
    the next day's dry run, with the version's own overrides, is refused naming the keys its run would change
    (before: exit 0, and the day trained with the preset's values); current stays on the complete v0001."""
    from pipelines.registry import Registry

    run = tmp_path / "run"
    shutil.copytree(hdet_run, run)
    env = {**os.environ, "RECSYS_HDET_DATA": data_cache, "PYTHONWARNINGS": "ignore"}
    lenient = ["gate.max_ne=100", "gate.calibration=[0.01,100]"]  # the tiny run's metrics are not the point here
    cmd = [sys.executable, "-m", "pipelines.retrain", "adopt", f"run_dir={run}", *lenient]
    refused = run_command([*cmd, f"registry={tmp_path / 'r1'}", "overrides=['data=demo']"], env=env, timeout=300)
    assert refused.returncode == 2 and "data.name: 'tiny' -> 'demo'" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "r1").exists()
    refused = run_command([*cmd, f"registry={tmp_path / 'r2'}"], env=env, timeout=300)
    changed = "optim.lr.embedding: 0.05 -> 0.02"  # the default preset's max LRs, retrain_daily's after the arrow
    assert refused.returncode == 2 and changed in refused.stderr and "allow_config_change=true" in refused.stderr, \
        refused.stderr[-2000:]
    assert not (tmp_path / "r2").exists()
    proc = run_command([*cmd, f"registry={tmp_path / 'r2'}", "allow_config_change=true"], env=env, timeout=300)
    assert proc.returncode == 0 and "adopted" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "note: experiment=retrain_daily composes another config than the run's" in proc.stderr and \
        changed in proc.stderr, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "r2" / "versions" / "v0001" / "manifest.json").read_text())
    recorded = OmegaConf.load(run / ".hydra" / "overrides.yaml")
    assert manifest["settings"]["overrides"] == [o for o in recorded if not o.startswith("data.root")]
    assert manifest["settings"]["overrides"][0] == "data=tiny"

    overrides = "overrides=[" + ",".join(f"'{o}'" for o in manifest["settings"]["overrides"]) + "]"
    dry = run_command([sys.executable, "-m", "pipelines.retrain", f"registry={tmp_path / 'r2'}",
                       f"data.root={tiny_dataset}", overrides, "dry_run=true"], env=env, timeout=300)
    lines = dry.stderr.strip().splitlines()
    assert dry.returncode == 2 and len(lines) == 1 and "REFUSED" in lines[0], dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "differ from the published version v0001's" in lines[0] and changed in lines[0], lines[0]
    reg = Registry(str(tmp_path / "r2"))
    assert reg.current() == "v0001" and reg.verify("v0001") is None and reg.checked("v0001")


# Each command that needs an argument, run with none: the key it needs named in one line, exit 2 (the Hydra
# commands' `???` keys included: predict and export used to end in Hydra's MissingMandatoryValue traceback).
NO_ARGUMENTS = [("recsys_hdet.predict", "model_dir"), ("recsys_hdet.export", "run_dir"),
                ("recsys_hdet.evaluate", "run_dir"), ("data_tools.convert", "log"), ("data_tools.validate", "data.root"),
                ("data_tools.relayout", "data.root"), ("data_tools.generate", "out"), ("pipelines.retrain", "registry")]


@pytest.mark.parametrize("module, key", NO_ARGUMENTS, ids=[m for m, _ in NO_ARGUMENTS])
def test_a_command_without_its_mandatory_argument_names_it_in_one_line_and_exits_2(module, key, tmp_path):
    proc = run_command([sys.executable, "-m", module], cwd=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert key in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # the retraining job's usage follows its one line (its verbs and keys); every other command says one line
    assert len(lines) == 1 or module == "pipelines.retrain" and lines[1].startswith("usage:"), proc.stderr
    assert os.listdir(tmp_path) == []
