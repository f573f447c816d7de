"""Every command speaks the same way (issue 58): an unknown key, a wrong type and a ``+typo`` are one line
``error: ...``, exit 2, nothing written; the unknown key with a did-you-mean, the wrong type with the type
expected, ``+key`` refused unless the command knows the key. The commands run in this process through their
own entry points (as tests/test_cli_args.py runs them), the installed ones once as subprocesses."""

import os
import sys

import pytest

from conftest import REPO, call_command, run_command

N = "/nonexistent-issue58"
# (name, module, entry point, the arguments every case gives, unknown key, its fix, wrong type, the type)
COMMANDS = [
    ("train", "recsys_hdet.train", "cli", ["data=tiny", f"run_dir={N}/run"],
     "data.bacth_size=1", "data.batch_size", "data.batch_size=abc", "int"),
    ("lr_find", "recsys_hdet.lr_find", "cli", ["data=tiny", f"run_dir={N}/run"],
     "data.bacth_size=1", "data.batch_size", "data.batch_size=abc", "int"),
    ("evaluate", "recsys_hdet.evaluate", "run", [f"run_dir={N}/run"], "bacth_size=1", "batch_size", "batch_size=abc", "int"),
    ("export", "recsys_hdet.export", "run", [f"run_dir={N}/run", f"out={N}/model"],
     "overwrit=true", "overwrite", "overwrite=maybe", "bool"),
    ("predict", "recsys_hdet.predict", "run", [f"model_dir={N}/model", f"data.root={N}/data", f"out={N}/s.parquet"],
     "bacth_size=1", "batch_size", "batch_size=abc", "int"),
    ("retrain run", "pipelines.retrain", "main", [f"registry={N}/reg", f"data.root={N}/data"],
     "eval_nprc=1", "eval_nproc", "eval_nproc=abc", "int"),
    ("retrain status", "pipelines.retrain", "main", ["status", f"registry={N}/reg"], "jsn=true", "json", "json=maybe", "bool"),
    ("retrain rollback", "pipelines.retrain", "main", ["rollback", f"registry={N}/reg"],
     "too=v0002", "to", "to=[1,2]", "Optional[str]"),
    ("retrain adopt", "pipelines.retrain", "main", ["adopt", f"registry={N}/reg", f"run_dir={N}/run"],
     "eval_nprc=1", "eval_nproc", "eval_nproc=abc", "int"),
    ("convert", "data_tools.convert", "main", [f"log={N}/l.csv", f"users={N}/u.csv", f"videos={N}/v.csv", f"data.root={N}/d"],
     "chunk_row=5", "chunk_rows", "chunk_rows=abc", "int"),
    ("generate", "data_tools.generate", "main", [f"out={N}/g"], "n_user=5", "n_users", "n_users=abc", "Optional[int]"),
    ("generate append", "data_tools.generate", "main", ["append=true", f"data.root={N}/d"], "dayz=2", "days", "days=abc", "Optional[int]"),
    ("validate", "data_tools.validate", "main", [f"data.root={N}/d"], "data.rot=x", "data.root", "data.root=[1,2]", "str"),
    ("relayout", "data_tools.relayout", "main", [f"data.root={N}/d"],
     "row_group_row=5", "row_group_rows", "row_group_rows=abc", "int"),
]


call = call_command


def one_line(module, entry, argv, monkeypatch, capsys):
    status = call(module, entry, argv, monkeypatch)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("error: "), (status, err)
    return err[0]


@pytest.mark.parametrize("name, module, entry, base, unknown, fix, wrong, expected", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_unknown_key_wrong_type_and_plus_typo_are_one_line_exit_2(name, module, entry, base, unknown, fix, wrong,
                                                                   expected, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    key = unknown.split("=")[0]
    for argv in ([*base, unknown], [*base, "+" + unknown]):
        line = one_line(module, entry, argv, monkeypatch, capsys)
        assert f"config {key}: unknown key" in line and f"did you mean {fix}?" in line, line
    line = one_line(module, entry, [*base, wrong], monkeypatch, capsys)
    assert f"config {wrong.split('=')[0]}:" in line and f"(expected {expected})" in line, line
    assert os.listdir(tmp_path) == [], "a refused command writes nothing"


@pytest.mark.parametrize("module, entry, argv, said", [
    ("recsys_hdet.evaluate", "run", [f"run_dir={N}/run", "+batch_size=5"], f"run_dir={N}/run: no such directory"),
    ("pipelines.retrain", "main", ["rollback", f"registry={N}/reg", "+to=v0001"], "no registry there (nothing was created)"),
    ("data_tools.validate", "main", [f"+data.root={N}/d"], f"{N}/d"),
])
def test_plus_on_a_key_the_command_knows_is_that_key(module, entry, argv, said, monkeypatch, capsys):
    call(module, entry, argv, monkeypatch)
    err = capsys.readouterr().err
    assert said in err and "unknown key" not in err, err


def test_an_unknown_preset_is_one_line_with_the_choices(monkeypatch, capsys):
    line = one_line("recsys_hdet.train", "cli", ["+experiment=no_such_preset", f"run_dir={N}/run"], monkeypatch, capsys)
    assert "experiment/no_such_preset" in line and "demo" in line, line


def test_messages_name_the_key_as_typed_once(monkeypatch, capsys):
    line = one_line("pipelines.retrain", "main", ["adopt", f"registry={N}/reg", f"run_dir={N}/run"], monkeypatch, capsys)
    assert line.count("run_dir=") == 1, line
    line = one_line("recsys_hdet.predict", "run", [f"model_dir={N}/m", f"data.root={N}/d", f"out={N}/s.parquet"],
                    monkeypatch, capsys)
    assert f"model_dir={N}/m" in line and " model=" not in line, line


def test_the_commands_refuse_a_plus_typo_in_one_line_as_subprocesses(tmp_path):
    # The case: `recsys-hdet-evaluate +bacth_size=1 run_dir=...` ran and ignored the typo.
    for cmd in (["recsys_hdet.evaluate", "+bacth_size=1", f"run_dir={tmp_path}"],
                ["recsys_hdet.export", "+overwrit=true", f"run_dir={tmp_path}", f"out={tmp_path / 'm'}"]):
        proc = run_command([sys.executable, "-m", *cmd], cwd=REPO, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: config "), proc.stderr
        assert "did you mean" in lines[0] and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


def test_one_run_directory_naming_scheme():
    # Three schemes once (<date>/<time> in --help, the config's, `make demo`'s 20261128-143217): now one.
    from recsys_hdet.lr_find import usage as lr_find_usage
    from recsys_hdet.run_dir import TIME_FORMAT, TIME_SHOWN
    from recsys_hdet.train import usage as train_usage

    with open(os.path.join(REPO, "conf", "config.yaml")) as f:
        assert f"${{now:{TIME_FORMAT}}}" in f.read()
    with open(os.path.join(REPO, "Makefile")) as f:
        assert f"$(shell date +{TIME_FORMAT})" in f.read()
    with open(os.path.join(REPO, "recsys_hdet", "lr_find.py")) as f:
        assert "${{now:{TIME_FORMAT}}}" in f.read()
    for text in (train_usage(), lr_find_usage()):
        assert TIME_SHOWN in text and "<date>" not in text and "<time>" not in text


def _schemas():
    from data_tools.convert import ConvertArgs
    from data_tools.generate import _arguments
    from data_tools.relayout import RelayoutArgs
    from data_tools.validate import ValidateArgs
    from recsys_hdet.config import SCHEMAS

    return [("recsys_hdet.train", "cli", SCHEMAS["config"]), ("recsys_hdet.lr_find", "cli", SCHEMAS["config"]),
            ("recsys_hdet.evaluate", "run", SCHEMAS["evaluate"]), ("recsys_hdet.export", "run", SCHEMAS["export"]),
            ("recsys_hdet.predict", "run", SCHEMAS["predict"]), ("pipelines.retrain", "main", SCHEMAS["retrain"]),
            ("data_tools.convert", "main", ConvertArgs), ("data_tools.generate", "main", _arguments()),
            ("data_tools.validate", "main", ValidateArgs), ("data_tools.relayout", "main", RelayoutArgs)]


def test_every_key_of_every_commands_schema_is_in_its_help_with_a_meaning(monkeypatch, capsys):
    from data_tools.cli_args import schema_keys
    from data_tools.cli_help import has_markup

    for module, entry, schema in _schemas():
        assert call(module, entry, ["--help"], monkeypatch) in (None, 0)
        out = capsys.readouterr().out
        lines = {line.split("=", 1)[0].strip(): line for line in out.splitlines() if line.startswith("  ") and "=" in line}
        missing = [k for k in schema_keys(schema) if k not in lines]
        assert not missing, f"{module} --help lacks {missing}"
        assert not has_markup(out), f"{module} --help shows reStructuredText"
        assert all("(default " in lines[k] or "(required" in lines[k] or "(optional" in lines[k] for k in schema_keys(schema))
        if schema.__name__ in ("EvaluateConfig", "ExportConfig", "PredictConfig", "RetrainConfig", "ConvertArgs"):
            bare = [k for k in schema_keys(schema) if lines[k].split("=", 1)[1].split(maxsplit=1)[1].startswith("(")]
            assert not bare, f"{module} --help: no meaning for {bare}"
        if module in ("recsys_hdet.train", "recsys_hdet.lr_find"):  # presets in full, not cut
            assert "Compare with the same run without exploration: +experiment=dropout_recovery hdet=disabled." in out
            assert not any(line.rstrip().endswith(" ...") for line in out.splitlines())  # cut preset texts
            assert "  trainer.nproc=INT" in out and "local workers when not under torchrun" in out
            assert "  optim.dense.type=adam|adamw|prodigy|schedulefree_adamw" in out
