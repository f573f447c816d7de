"""The scaling benchmark's data (:mod:`benchmarks.scaling`): the synthetic raw pieces of days, generated once
and reused by a rerun (:func:`ensure_pieces`), a size's converter inputs (:func:`raw_inputs`), its conversion
measured (:func:`convert`) and the converted data set's facts (:func:`data_facts`)."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import sys
from typing import Any, Dict, List, Tuple

from benchmarks.processes import python, run_measured
from data_tools.contract import read_meta
from data_tools.synthetic_files import CONFIG_FILE, LOG_FILE, USER_FILE, VIDEO_FILE

FIXED_IDS = {"n_users": 27_000, "n_authors": 30_000, "n_music": 10_000, "n_tags": 1_000}


def generator_fields(n_videos: int, rows_per_day: int, days: int) -> Dict[str, int]:
    return {**FIXED_IDS, "n_videos": n_videos, "impressions_per_day": rows_per_day, "days": days, "seed": 0}


def data_key(n_videos: int, rows_per_day: int) -> str:
    """A data set's folder name under --out-dir (the other ids are FIXED_IDS)."""
    return f"v{n_videos}_r{rows_per_day}"


def processed_root(out_dir: str, n_videos: int, rows_per_day: int, days: int) -> str:
    """Where a data set of ``days`` days is converted to under --out-dir (its raw pieces: ``out_dir/raw/<key>``)."""
    return os.path.join(out_dir, "processed", data_key(n_videos, rows_per_day), f"days_{days:03d}")


def ensure_pieces(raw_dir: str, n_videos: int, rows_per_day: int, day_counts: List[int]) -> List[str]:
    """The raw pieces ``[0, d1), [d1, d2), ...`` for the sorted ``day_counts``, generated when missing."""
    pieces, start = [], 0
    for end in day_counts:
        path = os.path.join(raw_dir, f"days_{start:03d}-{end:03d}")
        expected = generator_fields(n_videos, rows_per_day, end)
        if not os.path.isdir(path):
            generate_piece(path, expected, start)
        with open(os.path.join(path, CONFIG_FILE)) as f:
            written = json.load(f)
        if {k: written[k] for k in expected} != expected:
            raise SystemExit(f"{path} was generated with {written}, not {expected}: delete it to regenerate")
        pieces.append(path)
        start = end
    return pieces


def generate_piece(path: str, fields: Dict[str, int], from_day: int) -> None:
    """Days ``[from_day, fields['days'])`` (the earlier ones only drawn past, not simulated or written) into ``path``,
    via a temporary directory renamed into place, so a piece that exists is complete."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"generating {path} ({(fields['days'] - from_day) * fields['impressions_per_day']:,} rows)", flush=True)
    m = python("import json, sys\nfrom data_tools.synthetic import generate\n"
               "generate(json.loads(sys.argv[1]), sys.argv[2], from_day=int(sys.argv[3]))",
               json.dumps(fields), tmp, str(from_day))
    os.rename(tmp, path)
    print(f"  generated in {m.seconds:.0f} s", flush=True)


def raw_inputs(pieces: List[str]) -> Dict[str, Any]:
    """The converter's inputs for the days of ``pieces``: their logs, and the user and video files
    (the same in every piece: checked)."""
    for name in (USER_FILE, VIDEO_FILE):
        for piece in pieces[1:]:
            if not filecmp.cmp(os.path.join(pieces[0], name), os.path.join(piece, name), shallow=False):
                raise SystemExit(f"{name} differs between {pieces[0]} and {piece}: the pieces are not one data set")
    return {"log": [os.path.join(p, LOG_FILE) for p in pieces], "users": os.path.join(pieces[0], USER_FILE),
            "videos": os.path.join(pieces[0], VIDEO_FILE)}


def convert(raw: Dict[str, Any], out: str) -> Dict[str, Any]:
    """The converter's command into a fresh ``out`` (an earlier output or resumable stage removed): its wall
    time, peak RSS and each phase's seconds and peak RSS as it prints them (:mod:`data_tools.phase_log`).
    The peak is the larger of ``wait4``'s and the one the converter prints: its per-phase reset of the
    high-water mark hides its earlier phases from ``wait4``."""
    for old in (out, os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")):
        shutil.rmtree(old, ignore_errors=True)
    m = run_measured([sys.executable, "-m", "data_tools.convert", f"log=[{','.join(raw['log'])}]",
                      f"users={raw['users']}", f"videos={raw['videos']}", f"data.root={out}"])
    phases, printed_peak = convert_phases(m.stdout)
    return {"convert_seconds": m.seconds, "convert_peak_rss_mb": max(m.peak_rss_mb, printed_peak),
            "convert_phases": phases}


def convert_phases(stdout: str) -> Tuple[Dict[str, Dict[str, float]], float]:
    """The phases (``phase NAME: S s, peak RSS M MB``) and the whole peak (``peak RSS M MB ...``) the converter
    printed; SystemExit if it printed none (its output changed: the benchmark would record nothing)."""
    phases, peak = {}, None
    for line in stdout.splitlines():
        found = re.fullmatch(r"phase (.+): ([0-9.]+) s, peak RSS ([0-9.]+) MB", line)
        if found:
            phases[found[1]] = {"seconds": float(found[2]), "peak_rss_mb": float(found[3])}
        elif line.startswith("peak RSS "):
            peak = float(line.split()[2])
    if not phases or peak is None:
        raise SystemExit(f"the converter printed no phases or peak (its output changed?):\n{stdout[-2000:]}")
    return phases, peak


def data_facts(root: str) -> Dict[str, Any]:
    meta = read_meta(root)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)
    rows = sum(d["rows"] for d in meta["days"].values())
    return {"rows": rows, "days": len(meta["days"]), "distinct_videos": meta["ids"]["video_id"]["distinct_raw_ids"],
            "processed_bytes_per_row": size / rows}
