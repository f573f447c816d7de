"""The registry checks everything it serves from (docs/operations.md, "A damaged version", "Gaps in the days",
"No registry there"): each case on a real registry the job trained on the tiny data set (two days, two
versions), copied per test and damaged on disk, each ending with ``current`` on a complete published version.

- an older version's manifest truncated: the job trains and publishes the next day, ``status`` lists the damage;
- a checkpoint shard of the current version truncated, or one byte of it altered (same size): the job refuses
  before any worker starts (exit 6, the file and ``rollback to=v0001`` named); ``rollback`` repairs it and
  refuses to serve the damaged version again;
- a day missing from the data set before the new one: refused (exit 2, the day named) unless ``allow_gaps=true``;
- a path that holds no registry: ``status``, ``rollback`` and the job exit 2 and create nothing;
- versions recorded before file checksums: read as "unchecked (recorded before checksums)", served as before.

(The mismatched adopt is tests/test_cli_args.py::test_adopt_holds_the_runs_settings_against_the_days_preset.)
"""
import json
import os
import shutil

import pytest

from pipelines import retrain as R
from pipelines.registry import CHECKSUM, FILES, UNCHECKED, Registry, manifest_checksum
from data_tools.exit_status import ExitStatus

LAYOUT = ["trainer.nproc=1", "trainer.sharding_group_size=1"]
WIDE_GATE = ["gate.max_ne=100", "gate.calibration=[0.01,100]"]  # publish whatever the tiny days score


def _overrides(*entries):
    return "overrides=[" + ",".join(f"'{o}'" for o in entries) + "]"


def _job(base, *args):
    return R.main([f"registry={base / 'registry'}", f"data.root={base / 'data'}", _overrides(*LAYOUT), *WIDE_GATE,
                   *args])


# The registry these tests damage is trained once (~1 minute alone) and each test runs the job on it: the default
# run's budget (under 10 minutes on 2 cores) moves them to `make test-recovery`, which CI runs.
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_dataset):
    """A registry the job trained for real: v0001 a cold start on the first tiny day (``create=true``), v0002
    the second day warm-started from it; the third day is the next one. Returns (its directory, the days)."""
    base = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_dataset, base / "data")
    days = sorted(json.loads((base / "data" / "meta.json").read_text())["days"])
    assert _job(base, "create=true", f"until={days[0]}") == ExitStatus.OK
    assert _job(base, f"until={days[1]}") == ExitStatus.OK
    reg = Registry(str(base / "registry"))
    assert reg.list_versions() == ["v0001", "v0002"] and reg.current() == "v0002"
    return base, days


def _copy(trained, tmp_path):
    base, days = trained
    shutil.copytree(base / "data", tmp_path / "data")
    shutil.copytree(base / "registry", tmp_path / "registry", symlinks=True)  # current stays a relative link
    return Registry(str(tmp_path / "registry")), days


def _files(tmp_path):
    """Every file of the registry with its bytes (the lock's and the event log's aside)."""
    return {str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "registry").rglob("*")
            if p.is_file() and p.name not in (".lock", "retrain.jsonl")}


def _assert_serves_a_complete_version(reg, version):
    """``current`` is ``version``, published, every file as its manifest records it, and status says so."""
    assert reg.current() == version and reg.manifest(version)["status"] == "published"
    assert reg.checked(version) and reg.verify(version) is None
    assert R.main(["status", f"registry={reg.root}"]) == ExitStatus.OK


def _err_lines(capsys):
    return capsys.readouterr().err.strip().splitlines()


def test_an_older_versions_truncated_manifest_never_stops_the_job(trained, tmp_path, capsys):
    """v0001's manifest truncated (current v0002 intact): the job trains the third day on v0002 and publishes
    v0003 (before: a RegistryError traceback, exit 1, nothing trained); status lists v0001 as damaged, exit 0."""
    reg, days = _copy(trained, tmp_path)
    path = reg.manifest_path("v0001")
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 2])
    capsys.readouterr()

    assert _job(tmp_path) == ExitStatus.OK
    out, err = capsys.readouterr()
    assert f"day {days[2]}: PUBLISHED v0003 (parent v0002)" in out and "Traceback" not in err, out + err
    assert reg.manifest("v0003")["train_days"] == [days[2]] and reg.manifest("v0003")["gap"] == []
    _assert_serves_a_complete_version(reg, "v0003")
    out = capsys.readouterr().out
    assert "v0001 damaged" in out and f"damaged: {path}: damaged manifest (unreadable" in out, out
    assert R.main(["status", "json=true", f"registry={reg.root}"]) == ExitStatus.OK
    status = {v["version"]: v for v in json.loads(capsys.readouterr().out)["versions"]}
    assert status["v0001"]["status"] == "damaged" and path in status["v0001"]["damage"]
    assert [status[v]["files"] for v in ("v0002", "v0003")] == ["ok", "ok"]
    assert _job(tmp_path) == 5  # a rerun: the days of every version known, the damaged one's from the event log


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _flip_a_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte], ids=["truncated", "one-byte-altered"])
def test_a_damaged_checkpoint_shard_of_the_current_version_is_refused_before_any_worker_starts(trained, tmp_path,
                                                                                              capsys, damage):
    """A shard of v0002's checkpoint truncated, or one byte of it altered (same size): the job and its dry run exit
    6 with one line naming the shard and `rollback to=v0001`, before any worker starts (no run directory; before:
    a truncated shard killed the workers, exit 1, "a rerun resumes it"; an altered byte trained and published);
    status lists v0002 as damaged (exit 6); the rollback serves v0001, a rollback to v0002 is refused; the day then
    plans on v0001."""
    reg, days = _copy(trained, tmp_path)
    shard = sorted((tmp_path / "registry" / "versions" / "v0002" / "checkpoint").glob("*.distcp"))[0]
    damage(shard)
    before = _files(tmp_path)
    capsys.readouterr()

    for dry in (["dry_run=true"], []):
        assert _job(tmp_path, *dry) == ExitStatus.DAMAGED
        err = _err_lines(capsys)
        assert len(err) == 1 and str(shard) in err[0] and "rollback to=v0001" in err[0], err
        assert "Traceback" not in err[0]
    assert not (tmp_path / "registry" / "work").exists() and _files(tmp_path) == before
    assert json.loads((tmp_path / "registry" / "retrain.jsonl").read_text().splitlines()[-1])["event"] == "damaged"

    assert R.main(["status", f"registry={reg.root}"]) == ExitStatus.DAMAGED
    out, err = capsys.readouterr()
    assert "* v0002 damaged" in out and f"damaged: {shard}:" in out and "rollback to=v0001" in err, out + err
    assert R.main(["status", "json=true", f"registry={reg.root}"]) == ExitStatus.DAMAGED
    status = {v["version"]: v for v in json.loads(capsys.readouterr().out)["versions"]}
    assert status["v0002"]["files"] == "damaged" and str(shard) in status["v0002"]["damage"]
    assert status["v0001"]["damage"] is None

    assert R.main(["rollback", f"registry={reg.root}"]) == ExitStatus.OK
    assert "current: v0002 -> v0001" in capsys.readouterr().out
    assert R.main(["rollback", "to=v0002", f"registry={reg.root}"]) == ExitStatus.FAILED
    err = _err_lines(capsys)
    assert len(err) == 1 and "damaged, it cannot be served" in err[0] and str(shard) in err[0], err
    _assert_serves_a_complete_version(reg, "v0001")
    assert "v0002 damaged" in capsys.readouterr().out  # still listed, no longer in service
    assert _job(tmp_path, "dry_run=true") == ExitStatus.OK
    assert f"would train day {days[2]} on {days[2]}..{days[2]} (warm start" in capsys.readouterr().out


def test_a_day_missing_before_the_new_one_is_refused_unless_allowed(trained, tmp_path, capsys):
    """The next two days appended, the first removed (its file and its meta.json entry): the job and its dry run
    exit 2 naming the missing day, nothing trained (before: the later day trained on v0002 and published);
    allow_gaps=true plans it with a note naming the gap."""
    from data_tools.prepare import append_synthetic_days

    reg, days = _copy(trained, tmp_path)
    (new,) = append_synthetic_days(str(tmp_path / "data"), 1)
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    os.remove(tmp_path / "data" / meta["days"].pop(days[2])["file"])
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    before = _files(tmp_path)
    capsys.readouterr()

    for dry in (["dry_run=true"], []):
        assert _job(tmp_path, *dry) == ExitStatus.USAGE
        err = _err_lines(capsys)
        assert len(err) == 1 and f"missing from the data set: {days[2]} before day {new}" in err[0], err
        assert "allow_gaps=true" in err[0]
    assert not (tmp_path / "registry" / "work").exists() and _files(tmp_path) == before
    _assert_serves_a_complete_version(reg, "v0002")
    capsys.readouterr()
    assert _job(tmp_path, "dry_run=true", "allow_gaps=true") == ExitStatus.OK
    out = capsys.readouterr().out
    assert f"day {new}: trains across a gap (allow_gaps=true): day(s) {days[2]} missing" in out, out


def test_a_path_that_holds_no_registry_is_refused_and_nothing_is_created(trained, tmp_path, capsys, monkeypatch):
    """A typo'd registry path: status, rollback, the job and its dry run exit 2 with one line saying to create one
    with adopt, and create nothing (before: rollback made the directory and a .lock, exit 1, and status then read
    it as an empty registry, exit 0); a missing data set is exit 2 too (before: 1)."""
    base, _ = trained
    monkeypatch.chdir(tmp_path)
    for args in (["status"], ["status", "json=true"], ["rollback"], ["rollback", "to=v0001"],
                 [f"data.root={base / 'data'}"], [f"data.root={base / 'data'}", "dry_run=true"]):
        assert R.main([*args, "registry=noreg"]) == ExitStatus.USAGE, args
        err = _err_lines(capsys)
        assert len(err) == 1 and f"registry={tmp_path / 'noreg'}: no registry there (nothing was created)" in err[0] \
            and "adopt run_dir=RUN" in err[0], (args, err)
        assert os.listdir(tmp_path) == [], args
    assert R.main([f"registry={base / 'registry'}", "data.root=/nonexistent", "dry_run=true"]) == ExitStatus.USAGE
    err = _err_lines(capsys)
    assert len(err) == 1 and "data.root=/nonexistent: no processed data set there" in err[0], err
    _assert_serves_a_complete_version(Registry(str(base / "registry")), "v0002")


def _as_before_checksums(reg, version):
    """The version's manifest as the job wrote it before file checksums: no FILES (its own checksum rewritten)."""
    manifest = json.loads(open(reg.manifest_path(version)).read())
    body = {k: v for k, v in manifest.items() if k not in (FILES, CHECKSUM)}
    open(reg.manifest_path(version), "w").write(json.dumps({**body, CHECKSUM: manifest_checksum(body)}))


def test_versions_recorded_before_checksums_load_unchecked(trained, tmp_path, capsys):
    """Both versions' manifests without ``files`` (as written before this check): status exits 0 and says each is
    "unchecked (recorded before checksums)"; the dry run plans the next day on v0002 with a note that its files
    are not verified; a rollback to either works. A version written now is checked (the fixture's)."""
    reg, days = _copy(trained, tmp_path)
    for v in ("v0001", "v0002"):
        _as_before_checksums(reg, v)
        assert reg.damage(v) is None and not reg.checked(v) and reg.verify(v) is None
    capsys.readouterr()
    assert R.main(["status", f"registry={reg.root}"]) == ExitStatus.OK
    out = capsys.readouterr().out
    assert out.count(f"files {UNCHECKED}") == 2 and "damaged" not in out, out
    assert R.main(["status", "json=true", f"registry={reg.root}"]) == ExitStatus.OK
    assert [v["files"] for v in json.loads(capsys.readouterr().out)["versions"]] == [UNCHECKED, UNCHECKED]
    assert _job(tmp_path, "dry_run=true") == ExitStatus.OK
    out = capsys.readouterr().out
    assert "note: the current version v0002's files are not verified: it was recorded before checksums" in out, out
    assert R.main(["rollback", f"registry={reg.root}"]) == ExitStatus.OK and reg.current() == "v0001"
    assert R.main(["rollback", "to=v0002", f"registry={reg.root}"]) == ExitStatus.OK and reg.current() == "v0002"
    assert Registry(str(trained[0] / "registry")).checked("v0002")
