"""The model registry the scheduled retraining job publishes into (its storage layer).

Layout of a registry directory::

    registry/
      versions/<version>/      one published or rejected candidate: anything the job copies in
                               (checkpoint/, config, RunDir.SUMMARY, eval.json, report) + manifest.json
      current                  a symlink to versions/<version>: the model in service
      retrain.jsonl            the event log, one JSON object per line
      .lock                    held by the one job that may change the registry

Design:
- A version directory is written under ``versions/.tmp-<version>`` and appears under its name
  with one rename, manifest included, so a reader never sees half a version.
- ``current`` is replaced with one atomic rename of a new symlink over the old one: it always
  points at a complete version (or does not exist, before the first publish).
- Rejected candidates are kept as versions too (``manifest.status`` "rejected", the reasons in
  ``manifest.gate.reasons``): lineage shows what was tried and why it was not served.
- One job at a time: :meth:`Registry.lock` takes an exclusive, non-blocking flock on ``.lock``;
  a second job gets :class:`RegistryBusy` at once. The OS drops the lock when the holder dies.
- A damaged manifest (unreadable, not JSON, or its ``checksum`` - the sha256 of its other keys, written
  with it - not matching) marks its version as damaged, never the registry as unreadable: listing and
  ``status`` go on (the version's status reads "damaged"), ``rollback to=`` any intact version works, and
  reading that version's manifest raises :class:`RegistryError` naming the file.
- Every file a version holds (checkpoint shards and metadata, config, export, reports) is listed in its
  manifest's ``files`` with its size and sha256 (:func:`recsys_hdet.serving.manifest.file_record`, the
  record an exported model keeps of its own files), written by :meth:`Registry.add_version` from the copies
  it made. :meth:`Registry.verify` checks them (missing, another size, another content) and names the first
  damaged file; :meth:`Registry.set_current` refuses a damaged version, so ``current`` is only ever repointed
  at a version whose every file is as written. Cost: one sha256 pass over the version per check (status
  checks every version; the job, the version it warm-starts from).
- A version written before ``files`` was recorded cannot be verified: :meth:`Registry.verify` reads it as
  intact and :meth:`Registry.checked` says it was not checked (``status``: "unchecked (recorded before
  checksums)"); it loads and serves as before.
- A registry is a directory holding ``versions/`` or ``retrain.jsonl`` (:meth:`Registry.exists`); the commands
  that read one refuse a path that holds neither instead of creating it (a typo'd path is not a new registry).

Limits: a local (or POSIX) filesystem: atomic rename and flock are what it relies on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager, suppress
from typing import Any, Dict, Iterator, List, Mapping, Optional

from data_tools.fileio import LockHeld, staged_directory, try_exclusive_lock, write_manifest
from recsys_hdet.run_dir import RunDir
from recsys_hdet.serving.manifest import file_problem, file_record

MANIFEST = RunDir.VERSION_MANIFEST  # a version is a run directory with its record
CHECKSUM = "checksum"  # a manifest's own sha256 over its other keys (manifest_checksum); status and every read check it
FILES = "files"  # every file of the version (path relative to it -> size and sha256); Registry.verify checks them
UNCHECKED = "unchecked (recorded before checksums)"  # status of a version whose manifest has no FILES


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """sha256 of a manifest's content without its checksum key (canonical JSON: sorted keys)."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class RegistryBusy(RuntimeError):
    """Another job holds the registry's lock."""


class RegistryError(RuntimeError):
    """A registry operation that cannot be done (named, with the reason)."""


class Registry:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.versions = os.path.join(self.root, "versions")
        self.current_link = os.path.join(self.root, "current")
        self.events = os.path.join(self.root, "retrain.jsonl")

    # -- reading -------------------------------------------------------------------------------
    def version_dir(self, version: str) -> str:
        return os.path.join(self.versions, version)

    def manifest_path(self, version: str) -> str:
        return os.path.join(self.version_dir(version), MANIFEST)

    def manifest(self, version: str) -> Dict[str, Any]:
        """The version's manifest; RegistryError naming the file when it is damaged (:meth:`damage`)."""
        manifest, damage = self._read(version)
        if damage:
            raise RegistryError(f"{self.manifest_path(version)}: damaged manifest ({damage})")
        return manifest

    def damage(self, version: str) -> Optional[str]:
        """What is wrong with the version's manifest (unreadable, not JSON, its checksum does not match its
        content), or None when it is intact."""
        return self._read(version)[1]

    def _read(self, version: str) -> tuple:
        path = self.manifest_path(version)
        try:
            with open(path) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            return {}, f"unreadable: {type(e).__name__}: {e}"
        if not isinstance(manifest, dict):
            return {}, "not a JSON object"
        recorded = manifest.get(CHECKSUM)
        if recorded is not None and recorded != manifest_checksum(manifest):  # versions written before: none
            return {}, "its checksum does not match its content (edited or corrupted)"
        return manifest, None

    def exists(self) -> bool:
        """Whether ``root`` holds a registry: its ``versions/`` or its event log (a job that failed before its
        first version wrote the log)."""
        return os.path.isdir(self.versions) or os.path.isfile(self.events)

    def checked(self, version: str) -> bool:
        """Whether the version's manifest lists its files (versions written before: not, read as intact)."""
        return FILES in self._read(version)[0]

    def verify(self, version: str) -> Optional[str]:
        """What is damaged in the version, as ``PATH: problem``: its manifest (:meth:`damage`), else the first
        file its manifest lists that is missing, of another size or of another sha256 (and how many more);
        None when every listed file is as written (or none is listed: :meth:`checked`)."""
        manifest, damage = self._read(version)
        if damage:
            return f"{self.manifest_path(version)}: damaged manifest ({damage})"
        problems = [(name, problem) for name, recorded in sorted((manifest.get(FILES) or {}).items())
                    if (problem := file_problem(os.path.join(self.version_dir(version), name), recorded))]
        if not problems:
            return None
        name, problem = problems[0]
        more = f" (and {len(problems) - 1} more damaged file(s))" if len(problems) > 1 else ""
        return f"{os.path.join(self.version_dir(version), name)}: {problem}{more}"

    def intact_manifest(self, version: str) -> Optional[Dict[str, Any]]:
        """The version's manifest, or None when it is damaged (a reader that can do without it)."""
        manifest, damage = self._read(version)
        return None if damage else manifest

    def list_versions(self) -> List[str]:
        """Complete versions (a manifest file: intact or damaged), oldest first (by the time they were
        written; a damaged one by its name)."""
        if not os.path.isdir(self.versions):
            return []
        names = [n for n in os.listdir(self.versions) if not n.startswith(".")
                 and os.path.isfile(os.path.join(self.versions, n, MANIFEST))]
        return sorted(names, key=lambda n: (self._read(n)[0].get("created", 0.0), n))

    def current(self) -> Optional[str]:
        """The version ``current`` points at, or None before the first publish."""
        if not os.path.islink(self.current_link):
            return None
        return os.path.basename(os.readlink(self.current_link).rstrip("/"))

    # -- writing -------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        try:
            held = try_exclusive_lock(os.path.join(self.root, ".lock"))
        except LockHeld as e:
            raise RegistryBusy(f"{self.root} is locked by another retraining job ({e.holder})") from None
        with held:
            yield

    def add_version(self, version: str, files: Mapping[str, str], manifest: Mapping[str, Any]) -> str:
        """Copies ``files`` (name in the version -> source file or directory) and writes the manifest
        into ``versions/<version>``, atomically. Returns the version's directory."""
        final = self.version_dir(version)
        if os.path.exists(final):
            raise RegistryError(f"{final}: version {version!r} exists already (versions are never rewritten)")
        with staged_directory(final, stage=os.path.join(self.versions, f".tmp-{version}")) as tmp:
            for name, source in files.items():
                target = os.path.join(tmp, name)
                if os.path.isdir(source):
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)
            # recorded from the copies: what the version holds, as written
            files = {os.path.relpath(os.path.join(d, f), tmp): file_record(os.path.join(d, f))
                     for d, _, names in os.walk(tmp) for f in names}
            body = {**manifest, "version": version, "created": time.time(), FILES: dict(sorted(files.items()))}
            write_manifest(tmp, MANIFEST, {**body, CHECKSUM: manifest_checksum(body)})
        return final

    def set_current(self, version: str) -> None:
        """Points ``current`` at ``version`` with one atomic rename; RegistryError when it is not a complete,
        published and undamaged version (:meth:`verify`)."""
        if version not in self.list_versions():
            raise RegistryError(f"{self.version_dir(version)}: no complete version {version!r}")
        damage = self.verify(version)
        if damage:
            raise RegistryError(f"version {version!r} is damaged, it cannot be served: {damage}")
        manifest = self.manifest(version)
        if manifest.get("status", "published") != "published":
            reasons = "; ".join(manifest.get("gate", {}).get("reasons", [])) or "no reason recorded"
            raise RegistryError(f"version {version!r} was {manifest.get('status')} ({reasons}); it cannot be served")
        tmp_link = os.path.join(self.root, f".current-{os.getpid()}")
        if os.path.lexists(tmp_link):
            os.remove(tmp_link)
        os.symlink(os.path.join("versions", version), tmp_link)
        try:
            os.replace(tmp_link, self.current_link)
        except BaseException:  # current is untouched; the new link must not be left beside it
            with suppress(OSError):
                os.remove(tmp_link)
            raise

    def rollback(self, to: Optional[str] = None) -> str:
        """Points ``current`` at ``to``, or at the published version before the current one (its
        parent in the manifests). Returns the version now current."""
        if to is None:
            now = self.current()
            if now is None:
                raise RegistryError(f"{self.root}: nothing is published, nothing to roll back")
            manifest, damage = self._read(now)
            if damage:
                raise RegistryError(f"{self.manifest_path(now)}: damaged manifest ({damage}): its parent "
                                    "is unknown; name the version to serve: rollback to=VERSION")
            to = manifest.get("parent")
            if to is None:
                raise RegistryError(f"version {now!r} has no parent to roll back to")
        self.set_current(to)
        self.log_event({"event": "rollback", "current": to})
        return to

    def intact_ancestor(self, version: str) -> Optional[str]:
        """The nearest published, undamaged version in ``version``'s lineage before it (its parent, else the
        parent's parent ...), which a rollback can serve; None when there is none or the lineage is unknown."""
        seen = {version}
        parent = (self.intact_manifest(version) or {}).get("parent")
        while parent is not None and parent not in seen and parent in self.list_versions():
            seen.add(parent)
            manifest = self.intact_manifest(parent)
            if manifest is None:
                return None  # its own parent is unknown
            if manifest.get("status", "published") == "published" and self.verify(parent) is None:
                return parent
            parent = manifest.get("parent")
        return None

    def log_event(self, event: Mapping[str, Any]) -> None:
        os.makedirs(self.root, exist_ok=True)
        with open(self.events, "a") as f:
            f.write(json.dumps({"time": time.time(), **event}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def status(self) -> List[Dict[str, Any]]:
        """Every version's lineage line, oldest first: version, parent, train_days, status (published or
        rejected; "damaged" when :meth:`verify` finds damage, named in ``damage``), whether its files were
        checked (:data:`UNCHECKED` when its manifest lists none), whether it is current, and its whole
        manifest (empty when the manifest itself is damaged)."""
        cur = self.current()
        out = []
        for v in self.list_versions():
            m = self._read(v)[0]
            damage = self.verify(v)
            out.append({"version": v, "parent": m.get("parent"), "train_days": m.get("train_days"),
                        "status": "damaged" if damage else m.get("status"), "current": v == cur, "manifest": m,
                        "damage": damage, "files": "damaged" if damage else "ok" if FILES in m else UNCHECKED})
        return out
