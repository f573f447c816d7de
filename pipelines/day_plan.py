"""The retraining job's plan: which days each run trains (a day some version was trained on is
skipped; the first run cold-starts on every day so far; a calendar day missing from the data set between
the last day trained and a new day is the plan's ``gap``, refused unless allowed: :func:`check_gaps`),
version names, the registry's consistency checks (a publish interrupted between the version's rename and
``current``'s is finished; the version the job warm-starts from verified file by file,
:func:`check_warm_start`), and the check of the files the day's run will read (:func:`check_inputs`).

A version whose manifest is damaged is no obstacle unless it is the one in service: its trained days are read
from the event log (the day its ``published`` or ``rejected`` event names), and it is never a parent.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from typing import Collection, List, Optional, Sequence

from pipelines.registry import Registry
from data_tools.fileio import read_jsonl


class RetrainError(RuntimeError):
    """A day (or the registry) that cannot be processed; the message names the file and problem."""


class BadInput(RetrainError):
    """A file the day's run would read is missing or damaged (exit status 2): a rerun reads the same file."""


class DaysMissing(BadInput):
    """Days missing from the data set between the last day trained and a new one (exit status 2)."""


class DamagedVersion(RetrainError):
    """The version in service, which the job would warm-start from, is damaged (exit status 6): a rerun
    cannot help, a rollback (named in the message) can."""


@dataclass
class DayPlan:
    day: str                 # the newest day of the window (the gate's day)
    train_days: List[str]
    cold_start: bool
    gap: List[str] = field(default_factory=list)  # calendar days before ``day`` and after the last day trained
    #                                                that the data set does not hold (no version trained on them)


def version_name(number: int) -> str:
    return f"v{number:04d}"


def trained_days(registry: Registry) -> List[str]:
    """Every day some version (published or rejected) was trained on, sorted; for a version whose manifest is
    damaged, the day of its event in the log (a cold start's earlier days are then left out: the plan needs
    the newest day only)."""
    days = set()
    logged = None
    for v in registry.list_versions():
        manifest = registry.intact_manifest(v)
        if manifest is None:
            if logged is None:
                logged = {e.get("version"): e.get("day") for e in read_jsonl(registry.events)
                          if e.get("event") in ("published", "rejected") and e.get("day")} \
                    if os.path.isfile(registry.events) else {}
            days.update([logged[v]] if logged.get(v) else [])
        else:
            days.update(manifest.get("train_days", []))
    return sorted(days)


def missing_days(after: str, through: str, present: Collection[str]) -> List[str]:
    """The calendar days after ``after`` up to ``through`` (YYYYMMDD) that ``present`` lacks; none when the
    days are not dates (no calendar to compare with)."""
    try:
        start, end = (dt.datetime.strptime(str(d), "%Y%m%d").date() for d in (after, through))
    except ValueError:
        return []
    days = ((start + dt.timedelta(days=k)).strftime("%Y%m%d") for k in range(1, (end - start).days + 1))
    return [d for d in days if d not in present]


def plan_days(registry: Registry, days: Sequence[str], until: Optional[str], force: bool,
              current: Optional[str] = None) -> List[DayPlan]:
    """The windows to train, in order: the days after the last day any version was trained on
    (``force``: the newest day again when there is none). Until a version is published the job
    cold-starts once, on every day up to the newest pending one; after that, one day per window.
    ``current``: the published version the run will start from (a dry run's: the one an interrupted
    publish would make current), default the registry's."""
    days = [d for d in days if until is None or d <= str(until)]
    done = trained_days(registry)
    pending = [d for d in days if not done or d > done[-1]]
    if force and not pending and days:
        pending = [days[-1]]
    if not pending:
        return []
    if (current or registry.current()) is None:
        return [DayPlan(pending[-1], [d for d in days if d <= pending[-1]], True)]
    before = [done[-1], *pending[:-1]] if done else [None] * len(pending)
    return [DayPlan(d, [d], False, missing_days(prev, d, days) if prev else []) for prev, d in zip(before, pending)]


def check_gaps(registry: Registry, plans: Sequence[DayPlan], root: str, allow: bool) -> List[str]:
    """DaysMissing naming every day missing from the data set before a planned day (``DayPlan.gap``): the
    published model would be trained on the day after them as if they had never happened, a gap that a day
    lost in transfer or deleted by mistake leaves; ``allow`` (``allow_gaps=true``): trains across them, the
    returned notes name them."""
    gaps = [(p.day, p.gap) for p in plans if p.gap]
    if not gaps:
        return []
    done = trained_days(registry)
    what = "; ".join(f"{', '.join(gap)} before day {day}" for day, gap in gaps)
    if not allow:
        raise DaysMissing(f"data.root={root}: day(s) missing from the data set: {what} (the last day trained: "
                          f"{done[-1] if done else '-'}); no version was trained on them and the next day would "
                          "train as if they had never happened: restore them (docs/data.md, New days), or pass "
                          "allow_gaps=true to train across the gap")
    return [f"day {day}: trains across a gap (allow_gaps=true): day(s) {', '.join(gap)} missing from the data set, "
            "never trained on" for day, gap in gaps]


def check_inputs(root: str, days: Optional[Collection[str]] = None) -> dict:
    """The data check the day's training run makes before its workers start, made by the job before it trains
    anything: the meta file and, ``days`` None, every day file of the data set (format, Parquet footer, required
    columns and types, values, row counts: :func:`data_tools.validate.validate_processed`, the function the
    run calls, ``recsys_hdet.job_inputs.prepare_data``); ``days=()``: the meta file only. Returns the meta.

    Why every day file, not only the day's window: the run validates the whole data set, so a damaged older
    day stops it as surely as the newest one; checked here, the day ends as bad input (BadInput, exit 2,
    the file named) instead of as a failed training run that a rerun would only repeat. Cost: one more read
    of every day file per job (streaming aggregates; the run reads them again)."""
    from data_tools.errors import DataError
    from data_tools.validate import validate_processed

    try:
        return validate_processed(root, days)
    except DataError as e:  # polars' messages can run over lines: the report is one
        raise BadInput(f"{' '.join(str(e).split())}: fix or restore the file; a rerun will not help") from None


def check_registry(registry: Registry) -> None:
    """RetrainError for a damaged registry: ``current`` pointing at a missing or incomplete version, or at
    one whose manifest is damaged (:meth:`Registry.damage`); the message names the file and the rollback."""
    if os.path.lexists(registry.current_link) and not os.path.islink(registry.current_link):
        raise RetrainError(f"{registry.current_link}: not a symlink; the registry is damaged (remove it, then "
                           f"run rollback to=VERSION)")
    current = registry.current()
    if current is not None and current not in registry.list_versions():
        raise RetrainError(f"{registry.current_link} points at versions/{current}, which is missing or incomplete; "
                           f"the registry is damaged: repoint it with `python -m pipelines.retrain rollback to="
                           f"VERSION registry={registry.root}` (versions: "
                           f"{registry.list_versions() or 'none'})")
    damage = registry.damage(current) if current is not None else None
    if damage:
        intact = [v for v in registry.list_versions() if not registry.damage(v)]
        raise DamagedVersion(f"{registry.manifest_path(current)}: the current version's manifest is damaged "
                             f"({damage}); nothing was trained: restore the file, or serve an intact version with "
                             f"`python -m pipelines.retrain rollback to=VERSION registry={registry.root}` (intact: "
                             f"{intact or 'none'})")


def check_warm_start(registry: Registry, version: str) -> Optional[str]:
    """Verifies every file of the version the day warm-starts from (:meth:`Registry.verify`) before any worker
    starts: DamagedVersion naming the file and the rollback to its nearest intact published ancestor. Returns
    a note when its manifest lists no files (written before checksums: loaded unchecked), else None."""
    damage = registry.verify(version)
    if damage:
        to = registry.intact_ancestor(version)
        repair = (f"serve its parent: `python -m pipelines.retrain rollback to={to} registry={registry.root}`" if to
                  else "no intact published version before it: restore the file, or start a new registry with adopt")
        raise DamagedVersion(f"the current version {version} is damaged: {damage}; nothing was trained (the day "
                             f"would warm-start from it): {repair}")
    if not registry.checked(version):
        return (f"note: the current version {version}'s files are not verified: it was recorded before checksums "
                "(its manifest lists no files)")
    return None


def finish_interrupted_publish(registry: Registry) -> Optional[str]:
    """A job killed between a published version's rename and ``current``'s leaves the newest version
    published but not current; nothing after it (no rollback, no publish event) says otherwise.
    Repoints ``current`` and returns the version, else None."""
    newest = interrupted_publish(registry)
    if newest is None:
        return None
    registry.set_current(newest)
    registry.log_event({"event": "published", "version": newest, "day": registry.manifest(newest).get("day"),
                        "note": "finished an interrupted publish"})
    return newest


def interrupted_publish(registry: Registry) -> Optional[str]:
    """The version :func:`finish_interrupted_publish` would make current (reads only), or None."""
    versions = registry.list_versions()
    if not versions:
        return None
    newest = versions[-1]
    m = registry.intact_manifest(newest)
    if m is None or m.get("status") != "published" or registry.current() == newest:
        return None
    events = read_jsonl(registry.events) if os.path.isfile(registry.events) else []
    if any(e.get("time", 0) >= m.get("created", 0) and e.get("event") in ("published", "rollback") for e in events):
        return None
    if m.get("parent") != registry.current():
        return None
    return newest
