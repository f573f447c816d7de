"""An exported model's manifest (``MODEL_DIR/manifest.json``, written by :mod:`recsys_hdet.serving.artifact`):
its format and the reading that checks it. What loading an export needs, and nothing of training: the
scoring side (:mod:`recsys_hdet.serving.predict`) imports this module, never the exporter (a contract in
pyproject.toml).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

FORMAT = "recsys-hdet-serving"
FORMAT_VERSION = 1
PROGRAM_FILE = "model.pt2"
MANIFEST_FILE = "manifest.json"


class ArtifactError(ValueError):
    """A run that cannot be exported, or a directory that is not a serving artifact (named)."""


def read_manifest(model_dir: str) -> Dict[str, Any]:
    """The artifact's manifest (ArtifactError naming the file when it is not one)."""
    path = os.path.join(os.path.abspath(model_dir), MANIFEST_FILE)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing; model={model_dir} is not an exported model "
                            "(python -m recsys_hdet.export run_dir=... out=...)") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: not readable JSON ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format {manifest.get('format')!r} version {manifest.get('format_version')!r}; "
                            f"this code reads {FORMAT!r} version {FORMAT_VERSION}")
    if not os.path.isfile(os.path.join(os.path.dirname(path), manifest["program"])):
        raise ArtifactError(f"{os.path.join(os.path.dirname(path), manifest['program'])}: missing")
    return manifest
