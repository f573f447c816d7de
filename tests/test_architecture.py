"""The import contracts (pyproject.toml [tool.importlinter], docs/architecture.md) hold on the tree and
catch a planted violation: a component that imports the HDET package."""
import os
import shutil
import subprocess
import sys

from conftest import REPO

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")
PACKAGES = ("recsys_hdet", "data_tools", "pipelines", "studies", "benchmarks")


def _lint(cwd):
    return subprocess.run([LINT], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold_and_a_planted_components_to_hdet_import_breaks_them(tmp_path):
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "BROKEN" not in proc.stdout and "Contracts: 7 kept, 0 broken." in proc.stdout
    for name in PACKAGES:
        shutil.copytree(os.path.join(REPO, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    with open(tmp_path / "recsys_hdet" / "components" / "replicas.py", "a") as f:
        f.write("\nfrom recsys_hdet.hdet import engine  # planted\n")
    planted = _lint(tmp_path)
    assert planted.returncode == 1
    assert "components/ never imports hdet/ BROKEN" in planted.stdout
    assert "recsys_hdet.components.replicas -> recsys_hdet.hdet.engine" in planted.stdout
