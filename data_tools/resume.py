"""A conversion's stage directory (``.<out>.partial`` next to ``out``), and resuming from it.

Everything a conversion writes goes into its stage, which is locked (:func:`open_stage`: an fcntl
lock on the directory, so that a second conversion into the same ``out`` is refused while one runs).
:class:`_Progress` records what has been written there so far (the typed tables with the id
vocabularies, each finished day), under a key of what the staged files depend on
(:func:`resume_key`): a conversion killed half way goes on after its last finished day when run
again on the same inputs, and starts afresh on other ones (:func:`start_or_resume`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil

from data_tools.errors import data_error
from data_tools.fileio import write_text_atomic


class _Progress:
    """What a conversion has written into its stage directory so far, in ``_progress.json``: the typed
    tables with the id vocabularies (``tables``, ``ids``) and each finished day's entry for the meta file
    (``days``). A conversion killed half way is resumed from it when it runs again on the same inputs
    (``key``); a different key starts afresh. Day files are written whole before they are recorded."""

    FILE = "_progress.json"

    def __init__(self, stage: str, key: dict) -> None:
        self.path = os.path.join(stage, self.FILE)
        self.key = key
        saved = {}
        if os.path.isfile(self.path):
            with open(self.path) as f:
                saved = json.load(f)
        fresh = saved.get("key") != key
        self.tables: bool = False if fresh else bool(saved.get("tables"))
        self.ids: dict = {} if fresh else saved.get("ids") or {}
        self.days: dict = {} if fresh else saved.get("days") or {}

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps({"key": self.key, "tables": self.tables, "ids": self.ids,
                                                 "days": self.days}))

    def tables_written(self, ids: dict) -> None:
        self.tables, self.ids = True, ids
        self._save()

    def day_done(self, day: str, entry: dict) -> None:
        self.days[day] = entry
        self._save()

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


def open_stage(out: str) -> tuple[str, int]:
    """The stage directory of a conversion into ``out`` (made, and ``out``'s parent with it, when missing)
    and an open descriptor on it that holds its lock; DataError when another conversion holds it."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.partial")
    os.makedirs(tmp, mode=0o755, exist_ok=True)
    stage_lock = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(stage_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(stage_lock)
        raise data_error(out, None, f"another conversion into it is running (its stage {tmp} is locked)") from None
    return tmp, stage_lock


def resume_key(files, users: str, videos: str, counts: dict, extend_vocab: str | None, string_vocabs: dict | None,
               source: dict, row_group_rows: int) -> dict:
    """What the staged files depend on: the inputs as they are now, and every option that changes the output."""
    return {"inputs": [[os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files + [users, videos]],
            "min_count": counts, "extend_vocab": os.path.abspath(extend_vocab) if extend_vocab else None,
            "string_vocabs": string_vocabs, "source": source, "row_group_rows": row_group_rows}


def start_or_resume(tmp: str, progress: _Progress, n_days: int, verbose: bool) -> None:
    """Empties the stage ``tmp`` when ``progress`` has nothing to resume (whatever an earlier conversion
    left goes); otherwise, when ``verbose``, says how many of the ``n_days`` days are done."""
    if not progress.tables:  # nothing to resume: whatever an earlier conversion left goes
        for name in os.listdir(tmp):
            shutil.rmtree(os.path.join(tmp, name)) if os.path.isdir(os.path.join(tmp, name)) \
                else os.remove(os.path.join(tmp, name))
    elif verbose:
        print(f"resuming the conversion staged in {tmp}: {len(progress.days)} of {n_days} days done")
