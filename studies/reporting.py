"""A study's report files: its ``<stem>.json`` and ``<stem>.md`` written atomically, a table's number format,
the line naming the machine a report was produced on, and a pre-registered rule's text.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from data_tools.fileio import write_json_atomic, write_text_atomic


def write_reports(directory: str, stem: str, result: Dict[str, Any], markdown: str) -> None:
    """A study's ``<stem>.json`` and ``<stem>.md`` in ``directory``, each written atomically."""
    os.makedirs(directory, exist_ok=True)
    write_json_atomic(os.path.join(directory, f"{stem}.json"), result)
    write_text_atomic(os.path.join(directory, f"{stem}.md"), markdown)


def fmt(x: Optional[float], digits: int = 4) -> str:
    """A number for a study table; "-" for a missing one."""
    return "-" if x is None else f"{x:.{digits}f}"


def machine_line() -> str:
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"


def preregistered(path: str, marker: str) -> str:
    """A pre-registered rule: the text of ``path`` (docs/results/hdet_history.md) between its ``<!-- marker -->`` and
    ``<!-- /marker -->`` lines, as a study's report quotes it (ValueError when the markers are missing)."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(f"<!-- {marker} -->"), text.find(f"<!-- /{marker} -->")
    if start < 0 or end < start:
        raise ValueError(f"{path}: no pre-registered rule between <!-- {marker} --> markers")
    return text[start + len(f"<!-- {marker} -->"):end].strip()
