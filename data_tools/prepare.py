"""Make sure a processed synthetic data set exists (generate + convert on first use).

``ensure_dataset(root, generator, min_count)`` returns ``root`` when it already holds a valid
processed data set built from the same generator config, id min_count and format version; otherwise it generates the
raw KuaiRand-schema CSVs into ``root + ".raw"`` (via a temp dir + rename), converts them into
``root`` atomically and returns ``root``. An ``fcntl`` lock on ``root + ".lock"`` makes
concurrent callers (e.g. several local worker processes) wait for one builder.
A valid processed data set in ``root`` without generator provenance (e.g. converted real
KuaiRand data) is returned as is and never overwritten.

Data sets that grow: ``append_synthetic_days(root, days)`` adds the next days of a generated data
set in place (same ground truth, drift continued; ``python -m data_tools.generate append=true data.root=ROOT``).
the meta file's ``source.generator`` keeps the config the data set was generated with and
``source.appended_days`` lists the days added since. The rule ``ensure_dataset`` applies: a data set
is usable for a requested generator config when every field but ``days`` is equal and the data set
holds every day the request covers, i.e. generated days <= requested days <= generated + appended
days (it then holds the requested days and possibly later ones). A request for fewer days than were
generated, or for more than the data set holds, regenerates it as before.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import dataclasses
import datetime as dt
import glob

from data_tools import contract as C
from data_tools.append import _append_locked
from data_tools.convert import convert
from data_tools.errors import DataError, data_error
from data_tools.id_vocabs import resolve_min_count
from data_tools.synthetic import generate
from data_tools.synthetic_config import GeneratorConfig
from data_tools.synthetic_files import LOG_FILE, ORACLE_FILE, USER_FILE, VIDEO_FILE
from data_tools.validate import _load_meta, validate_processed
from data_tools.fileio import file_lock, staged_directory


def _existing(root: str, cfg: GeneratorConfig, voc: dict) -> tuple[bool, str]:
    """(usable, reason)."""
    try:
        meta = validate_processed(root)
    except DataError as e:
        return False, str(e)
    src = meta.get("source") or {}
    if "generator" not in src:
        return True, "valid processed data set (not generated here)"
    ok, why = _generator_matches(src, cfg, meta)
    if not ok:
        return False, why
    if src.get("min_count") != voc:
        return False, "id min_count differs"
    return True, "valid"


def _day_keys(start_date: int, n: int) -> list[str]:
    start = dt.datetime.strptime(str(start_date), "%Y%m%d").date()
    return [(start + dt.timedelta(days=i)).strftime("%Y%m%d") for i in range(n)]


def _generator_matches(src: dict, cfg: GeneratorConfig, meta: dict) -> tuple[bool, str]:
    """The rule in the module docstring: equal but for ``days``, and every requested day present."""
    have, want = dict(src.get("generator") or {}), cfg.to_dict()
    generated = have.pop("days", None)
    requested = want.pop("days")
    if have != want:
        return False, "generator config differs"
    if requested == generated:
        return True, "valid"
    total = (generated or 0) + len(src.get("appended_days") or [])
    if not (isinstance(generated, int) and generated < requested <= total):
        return False, (f"generator config differs (days: {requested} requested, the data set has "
                       f"{generated} generated + {total - (generated or 0)} appended)")
    missing = sorted(set(_day_keys(cfg.start_date, requested)) - set(meta["days"]))
    if missing:
        return False, f"day {missing[0]} missing"
    return True, "valid (with appended days)"


def append_synthetic_days(root: str, days: int = 1) -> list[str]:
    """Append the next ``days`` days to the synthetic data set ``root`` (built by
    :func:`ensure_dataset`) in place and return their keys ("YYYYMMDD"), in order.

    The days are what :func:`generate` writes for them with the data set's generator config and
    ``days`` = the data set's days + ``days`` (the same ground truth, the drift continued); they
    are converted with :func:`data_tools.append.append_days`'s path (old day files untouched, ids
    keep their rows). Their raw log is kept in ``source.raw_dir`` as
    ``log_synthetic_<first>[-<last>].csv`` and their oracle is added to ``oracle.json``, both
    published with the data set's files, before the meta file. Holds the lock ``ensure_dataset`` takes.
    """
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise DataError(f"append_synthetic_days: days must be an int >= 1, got {days!r}")
    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise data_error(root, None, "processed data directory not found (nothing to append to)")
    meta_path = C.meta_path(root)
    with file_lock(root + ".lock"):
        meta = _load_meta(root)
        src = meta.get("source") or {}
        if not isinstance(src.get("generator"), dict):
            raise data_error(meta_path, "source.generator", "missing: not a synthetic data set built by "
                             "ensure_dataset (append real logs with python -m data_tools.convert data.root=DIR append=true)")
        cfg = GeneratorConfig.from_dict(src["generator"])
        have = cfg.days + len(src.get("appended_days") or [])
        expected = _day_keys(cfg.start_date, have + days)
        if sorted(meta["days"]) != expected[:have]:
            raise data_error(meta_path, "days", f"{sorted(meta['days'])} are not the {have} consecutive days from "
                                                f"{cfg.start_date} its generator config and appended_days describe")
        raw = src.get("raw_dir")
        if not raw or not os.path.isdir(raw):
            raise data_error(meta_path, "source.raw_dir", f"{raw!r} is not a directory: the raw user and video "
                                                          "files the data set was converted from are needed")
        for stale in glob.glob(os.path.join(raw, ".append-tmp-*")):  # left by a killed append
            shutil.rmtree(stale, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=".append-tmp-", dir=raw)
        try:
            oracle = generate(dataclasses.replace(cfg, days=have + days), tmp, from_day=have)
            new = sorted(oracle)
            if new != expected[have:]:  # generate() writes exactly the requested days
                raise DataError(f"{tmp}: generated days {new}, expected {expected[have:]}")
            moves = []
            oracle_file = src.get("oracle_file")
            if oracle_file:
                merged = {}
                if os.path.isfile(oracle_file):
                    with open(oracle_file) as f:
                        merged = json.load(f)
                merged.update(oracle)
                staged = os.path.join(tmp, "oracle.merged.json")
                with open(staged, "w") as f:
                    json.dump(merged, f, indent=1)
                moves.append((staged, oracle_file))
            name = f"log_synthetic_{new[0]}" + (f"-{new[-1]}" if len(new) > 1 else "") + ".csv"
            final_log = os.path.join(raw, name)
            moves.append((os.path.join(tmp, LOG_FILE), final_log))
            _append_locked(os.path.join(tmp, LOG_FILE), os.path.join(raw, USER_FILE), os.path.join(raw, VIDEO_FILE),
                           root, source={"log": [final_log], "generator_days": have + days}, extra_files=moves)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return new


def ensure_dataset(root: str, generator: dict | None = None, min_count: dict | None = None) -> str:
    """Return ``root`` holding a valid processed data set, generating it if needed."""
    root = os.path.abspath(os.fspath(root))
    cfg = generator if isinstance(generator, GeneratorConfig) else GeneratorConfig.from_dict(generator)
    voc = resolve_min_count(min_count)
    ok, _ = _existing(root, cfg, voc) if os.path.exists(root) else (False, "missing")
    if ok:
        return root
    with file_lock(root + ".lock"):
        ok, reason = _existing(root, cfg, voc) if os.path.exists(root) else (False, "missing")
        if ok:  # another process built it while we waited
            return root
        t0 = time.time()
        raw = root + ".raw"
        with staged_directory(raw, replace=True) as stage:
            generate(cfg, stage)
        meta = convert(os.path.join(raw, LOG_FILE), os.path.join(raw, USER_FILE),
                       os.path.join(raw, VIDEO_FILE), root, voc, overwrite=True,
                       source={"generator": cfg.to_dict(), "min_count": voc, "raw_dir": raw,
                               "oracle_file": os.path.join(raw, ORACLE_FILE)})
        rows = sum(d["rows"] for d in meta["days"].values())
        print(f"[data_tools] generating synthetic data set into {root} ({reason}): {rows} rows, "
              f"{len(meta['days'])} days, raw CSVs in {raw}, took {time.time() - t0:.1f}s", flush=True)
        return root


def load_oracle(root: str) -> dict | None:
    """The generator's oracle.json for a data set built by ensure_dataset (None if unknown)."""
    try:
        src = C.read_meta(root).get("source") or {}
        with open(src["oracle_file"]) as f:
            return json.load(f)
    except (OSError, KeyError, ValueError):
        return None


__all__ = ["ensure_dataset", "append_synthetic_days", "load_oracle"]
