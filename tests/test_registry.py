"""The retraining job's registry (pipelines/registry.py): atomic versions, the current pointer,
rollback, one job at a time."""
import json
import os

import pytest

from pipelines.registry import Registry, RegistryBusy, RegistryError


def _candidate(tmp_path, name):
    d = tmp_path / "cands" / name
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / ".metadata").write_text(name)
    (d / "summary.json").write_text(json.dumps({"status": "completed"}))
    return {"checkpoint": str(d / "checkpoint"), "summary.json": str(d / "summary.json")}


def test_publish_point_and_roll_back(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    assert reg.current() is None and reg.list_versions() == []
    reg.add_version("v1", _candidate(tmp_path, "v1"), {"parent": None, "train_days": ["20220410"],
                                                       "status": "published"})
    reg.set_current("v1")
    reg.add_version("v2", _candidate(tmp_path, "v2"), {"parent": "v1", "train_days": ["20220411"],
                                                       "status": "published"})
    reg.set_current("v2")
    assert reg.current() == "v2" and reg.list_versions() == ["v1", "v2"]
    assert (tmp_path / "registry" / "current" / "checkpoint" / ".metadata").read_text() == "v2"
    assert reg.rollback() == "v1" and reg.current() == "v1"
    assert json.loads((tmp_path / "registry" / "retrain.jsonl").read_text().splitlines()[-1])["event"] == "rollback"
    assert reg.rollback(to="v2") == "v2"
    assert [s["current"] for s in reg.status()] == [False, True]
    with pytest.raises(RegistryError, match="exists already"):
        reg.add_version("v2", _candidate(tmp_path, "v2b"), {})


def test_a_rejected_or_incomplete_version_is_never_current(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    reg.add_version("v1", _candidate(tmp_path, "v1"), {"status": "rejected", "gate": {"reasons": ["like NE worse"]}})
    with pytest.raises(RegistryError, match="was rejected \\(like NE worse\\)"):
        reg.set_current("v1")
    # A crashed copy leaves only a .tmp- directory: not a version, and cleaned by the next attempt.
    os.makedirs(tmp_path / "registry" / "versions" / ".tmp-v2" / "checkpoint")
    assert reg.list_versions() == ["v1"]
    with pytest.raises(RegistryError, match="no complete version"):
        reg.set_current("v2")
    reg.add_version("v2", _candidate(tmp_path, "v2"), {"status": "published"})
    assert not (tmp_path / "registry" / "versions" / ".tmp-v2").exists()
    assert reg.current() is None  # nothing was ever published


def test_one_job_at_a_time(tmp_path):
    reg = Registry(str(tmp_path / "registry"))
    with reg.lock():
        with pytest.raises(RegistryBusy, match=f"pid {os.getpid()}"):
            with Registry(str(tmp_path / "registry")).lock():
                pass
    with reg.lock():  # released: the next job gets it
        pass


def _published(tmp_path, *names):
    reg = Registry(str(tmp_path / "registry"))
    parent = None
    for name in names:
        reg.add_version(name, _candidate(tmp_path, name), {"parent": parent, "status": "published"})
        parent = name
    return reg


def _assert_current_is(reg, version):
    """``current`` is a symlink to versions/<version>, which exists and is complete, and no temporary
    link is left beside it."""
    link = reg.current_link
    assert os.path.islink(link), "current is missing"
    assert os.readlink(link) == os.path.join("versions", version)
    assert os.path.isdir(link), f"current dangles: -> {os.readlink(link)}"
    assert json.load(open(os.path.join(link, "manifest.json")))["version"] == version
    assert open(os.path.join(link, "checkpoint", ".metadata")).read() == version
    assert reg.current() == version
    assert sorted(os.listdir(reg.root)) == ["current", "versions"], "a temporary link was left behind"


@pytest.mark.parametrize("failing", [("symlink",), ("replace", "rename")], ids=["link", "move"])
def test_a_repoint_that_fails_midway_leaves_current_on_the_old_complete_version(tmp_path, monkeypatch, failing):
    # The repoint fails at its critical step (making the new link, or moving it over current, by
    # whichever call the code uses): current must still point at the old version, never be missing or
    # dangling, and no temporary link be left over.
    reg = _published(tmp_path, "v1", "v2")
    reg.set_current("v1")
    _assert_current_is(reg, "v1")
    calls = []

    def crash(src, dst, *a, **kw):
        calls.append(dst)
        raise OSError(28, "No space left on device (planted)")

    with monkeypatch.context() as m:
        for name in failing:
            m.setattr(os, name, crash)
        with pytest.raises(OSError, match="planted"):
            reg.set_current("v2")
    assert calls, f"set_current never called os.{' or os.'.join(failing)}"
    _assert_current_is(reg, "v1")
    reg.set_current("v2")  # the next attempt succeeds
    _assert_current_is(reg, "v2")


def test_a_refused_repoint_leaves_current_as_it_was(tmp_path):
    reg = _published(tmp_path, "v1")
    reg.set_current("v1")
    reg.add_version("v2", _candidate(tmp_path, "v2"), {"parent": "v1", "status": "rejected"})
    os.makedirs(os.path.join(reg.versions, ".tmp-v3", "checkpoint"))  # a half-written version
    for version in ("v2", ".tmp-v3", "v3", "v9"):
        with pytest.raises(RegistryError):
            reg.set_current(version)
        assert os.readlink(reg.current_link) == os.path.join("versions", "v1") and reg.current() == "v1"
    os.rmdir(os.path.join(reg.versions, ".tmp-v3", "checkpoint"))
    os.rmdir(os.path.join(reg.versions, ".tmp-v3"))
    _assert_current_is(reg, "v1")
