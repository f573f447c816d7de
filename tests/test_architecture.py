"""The import contracts (pyproject.toml [tool.importlinter], docs/architecture.md) hold on the tree and
catch planted violations: a component that imports the HDET package, a data tool that imports the
library (data_tools is the bottom package), a leaf module that imports another data tool, a study that
imports another study, a module of the study library that imports a study, a job that imports a study (the
packages' layers), the run directory that imports a component (the library's layers), evaluation that imports
the HDET engine, and scoring with an export that imports the model code."""
import os
import shutil
import subprocess
import sys
import tomllib

from conftest import REPO

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")
PACKAGES = ("recsys_hdet", "data_tools", "pipelines", "studies", "benchmarks")


def _lint(cwd):
    return subprocess.run([LINT], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold_and_planted_upward_imports_break_them(tmp_path):
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "BROKEN" not in proc.stdout and "Contracts: 14 kept, 0 broken." in proc.stdout
    for name in PACKAGES:
        shutil.copytree(os.path.join(REPO, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    for path, line in ((("recsys_hdet", "components", "replicas.py"), "from recsys_hdet.hdet.controller import engine"),
                       (("data_tools", "vocab.py"), "from recsys_hdet import constants"),
                       (("data_tools", "fileio.py"), "from data_tools import errors"),
                       (("studies", "probe_bias.py"), "from studies import lr_recovery"),
                       (("studies", "starts.py"), "from studies import ablation"),
                       (("pipelines", "gate.py"), "from studies import stats"),
                       (("recsys_hdet", "run_dir.py"), "from recsys_hdet.components import metrics_log"),
                       (("recsys_hdet", "evaluation", "task_metrics.py"), "from recsys_hdet.hdet.controller import engine"),
                       (("recsys_hdet", "serving", "predict.py"), "from recsys_hdet.models import ranker"),
                       (("recsys_hdet", "hdet", "range_test", "job.py"), "from recsys_hdet.hdet.controller import engine")):
        with open(tmp_path.joinpath(*path), "a") as f:
            f.write(f"\n{line}  # planted\n")
    planted = _lint(tmp_path)
    assert planted.returncode == 1
    out = " ".join(planted.stdout.split())  # contract names wrap over lines
    assert "Contracts: 4 kept, 10 broken." in out, planted.stdout[-3000:]
    assert "the range test and the controller never import each other BROKEN" in out
    assert "components/ never imports hdet/ BROKEN" in out
    assert "recsys_hdet.components.replicas -> recsys_hdet.hdet.controller.engine" in out
    assert "never the reverse) BROKEN" in out and "data_tools.vocab -> recsys_hdet.constants" in out
    assert "import nothing of the project BROKEN" in out and "data_tools.fileio -> data_tools.errors" in out
    assert "no study imports another (directly or through another module) BROKEN" in out
    assert "studies.probe_bias -> studies.lr_recovery" in out
    assert "The study library (and the benchmarks) import no study BROKEN" in out
    assert "studies.starts -> studies.ablation" in out
    assert "Packages in layers: benchmarks, studies, pipelines, recsys_hdet, data_tools BROKEN" in out
    assert "pipelines.gate -> studies.stats" in out
    assert "run directory, leaves BROKEN" in out and "recsys_hdet.run_dir -> recsys_hdet.components.metrics_log" in out
    assert "Evaluation never imports the HDET engine (a run is scored the same way whatever trained it) BROKEN" in out
    assert "recsys_hdet.evaluation.task_metrics -> recsys_hdet.hdet.controller.engine" in out
    assert "no model code, training or evaluation) BROKEN" in out
    assert "recsys_hdet.serving.predict -> recsys_hdet.models.ranker" in out


def test_every_module_of_studies_is_a_study_or_a_library_module():
    """The two studies contracts cover studies/: each module is in the independence contract's list (a study) or
    in the forbidden contract's sources (the library), never both, so that a new module is placed deliberately."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    studies = next(c for c in contracts if c["name"].startswith("The studies are independent"))["modules"]
    library = next(c for c in contracts if c["name"].startswith("The study library"))
    assert sorted(library["forbidden_modules"]) == sorted(studies)
    library = [m for m in library["source_modules"] if m.startswith("studies.")]
    modules = sorted(f"studies.{f[:-3]}" for f in os.listdir(os.path.join(REPO, "studies"))
                     if f.endswith(".py") and f != "__init__.py")
    assert sorted(studies + library) == modules and not set(studies) & set(library)
