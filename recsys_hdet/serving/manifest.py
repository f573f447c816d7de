"""An exported model's manifest (``MODEL_DIR/manifest.json``, written by :mod:`recsys_hdet.serving.artifact`):
its format and the reading that checks it: the format version, and each file the manifest lists (``files``: the
program's and the vocabularies' size and sha256) - a missing, truncated or altered file is an
:class:`ArtifactError` naming it (``predict``: exit 2). What loading an export needs, and nothing of training: the
scoring side (:mod:`recsys_hdet.serving.predict`) imports this module, never the exporter (a contract in
pyproject.toml).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict

FORMAT = "recsys-hdet-serving"
FORMAT_VERSION = 1
PROGRAM_FILE = "model.pt2"
RAW_PROGRAM_FILE = "raw_model.pt2"  # export raw_program=true: the program that reads raw requests
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
        raise ArtifactError(f"{path}: missing; model_dir={model_dir} is not an exported model "
                            "(python -m recsys_hdet.export run_dir=... out=...)") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: not readable JSON ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format {manifest.get('format')!r} version {manifest.get('format_version')!r}; "
                            f"this code reads {FORMAT!r} version {FORMAT_VERSION}")
    if not os.path.isfile(os.path.join(os.path.dirname(path), manifest["program"])):
        raise ArtifactError(f"{os.path.join(os.path.dirname(path), manifest['program'])}: missing")
    for name, recorded in (manifest.get("files") or {}).items():  # artifacts exported before: no "files"
        problem = file_problem(os.path.join(os.path.dirname(path), name), recorded)
        if problem:
            raise ArtifactError(f"{os.path.join(os.path.dirname(path), name)}: {problem}; the artifact is damaged: "
                                "restore it or export the run again")
    return manifest


def file_record(path: str) -> Dict[str, Any]:
    """A file's size and sha256, as the manifest's ``files`` records each file of the artifact."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": os.path.getsize(path), "sha256": digest.hexdigest()}


def file_problem(path: str, recorded: Dict[str, Any]) -> str:
    """What is wrong with an artifact file against its record ('' when it matches): missing, another size
    (truncated, appended to), or another content."""
    if not os.path.isfile(path):
        return "missing"
    size = os.path.getsize(path)
    if size != recorded.get("bytes"):
        return f"{size} bytes, the manifest records {recorded.get('bytes')}"
    if file_record(path)["sha256"] != recorded.get("sha256"):
        return "its sha256 differs from the manifest's"
    return ""
