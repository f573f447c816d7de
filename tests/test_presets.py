"""Every experiment preset composes with the base config and passes validation (no training)."""
import os

import pytest
from hydra import compose, initialize_config_dir

from conftest import REPO
from recsys_hdet.config import validate_config

# Every file in conf/experiment, the shared fragments (_hdet_common, _warm_start) included.
PRESETS = sorted(f[:-5] for f in os.listdir(os.path.join(REPO, "conf", "experiment")) if f.endswith(".yaml"))


def test_every_user_facing_preset_is_in_the_readme():
    readme = open(os.path.join(REPO, "README.md")).read()
    assert len(PRESETS) >= 15
    missing = [p for p in PRESETS if not p.startswith("_") and f"`{p}`" not in readme]
    assert not missing, f"presets not documented in README.md: {missing}"


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_and_validates(preset, monkeypatch, tmp_path):
    monkeypatch.setenv("RECSYS_HDET_DATA", str(tmp_path))
    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={preset}"])
    validate_config(cfg)
    if not preset.startswith("_"):
        assert cfg.experiment_name == preset


def test_help_lists_every_preset_and_only_what_each_command_uses():
    import subprocess
    import sys

    run = lambda *args: subprocess.run([sys.executable, "-m", *args, "--help"], cwd=REPO, capture_output=True,
                                       text=True, timeout=120)
    train = run("recsys_hdet.train")
    assert train.returncode == 0, train.stderr
    listed = [line.split()[0] for line in train.stdout.split("presets (+experiment=NAME):\n")[1].split("\n\n")[0].splitlines()]
    assert listed == [p for p in PRESETS if not p.startswith("_")], train.stdout
    evaluate = run("recsys_hdet.evaluate")
    assert evaluate.returncode == 0 and "run_dir" in evaluate.stdout and "report.html" in evaluate.stdout
    import re

    keys = re.sub(r"^data:\n  root:.*\n", "", evaluate.stdout, flags=re.M)  # data.root: the data set in every command
    groups = re.findall(r"^\s*(data|model|optim|trainer|hdet|experiment)\s*[:=]", keys, flags=re.M)
    assert not groups, f"the training config's groups are not evaluation's: {groups}"
    validate = run("data_tools.validate")
    assert validate.returncode == 0 and "data.root=DIR" in validate.stdout and "meta.json" in validate.stdout


def test_the_schemas_choices_are_the_components_own():
    # The schema lists each choice for Hydra (refused at composition); the components that keep their own
    # lists (the HDET engine knows no config) must not drift from it. The data choices (train exposure, day
    # read) are the schema's enums themselves (components/dataset.py, dataloader.py check against them).
    from recsys_hdet import config_values as S
    from recsys_hdet.components.optimizer import EMBEDDING_OPTIMIZERS
    from recsys_hdet.hdet.controller.config import SCORES, HDETScore, HDETSignal
    from recsys_hdet.hdet.controller.signals import SIGNALS

    assert set(HDETSignal) == set(SIGNALS)
    assert set(HDETScore) == set(SCORES)
    assert set(S.EmbeddingOptimizer) == set(EMBEDDING_OPTIMIZERS)
