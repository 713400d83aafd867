"""Owned temporary folders (issue 28, item 16): removed at exit, SIGTERM included, and swept
by a later start only when their owner is gone (a dead pid, or a pid reused by a process
that started at another time) and no process of their group is left; never another live
process's folder, never one without an owner record."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hicache.integrations.vllm import env
from hicache.tmpdirs import OWNER_FILE, PENDING, OwnedDir, sweep

WAIT_S = 120  # bounds on a child's start (never reached); not timing assumptions


def _folder(parent: Path, name: str, record: dict | None) -> Path:
    path = parent / name
    path.mkdir()
    (path / "data").write_text("x")
    if record is not None:
        (path / OWNER_FILE).write_text(json.dumps(record))
    return path


def _dead_pid() -> tuple[int, float]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    return child.pid, started


def test_sweep_removes_only_folders_whose_owner_and_group_are_gone(tmp_path):
    me = psutil.Process()
    dead, dead_start = _dead_pid()
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a live group
    zombie = subprocess.Popen(["true"], start_new_session=True)  # a group of one zombie: not reaped yet
    try:
        deadline = time.monotonic() + WAIT_S
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cases = {
            "p-group-zombie": ({"pid": dead, "started": dead_start, "group": zombie.pid}, True),
            "p-dead": ({"pid": dead, "started": dead_start, "group": None}, True),
            "p-reused": ({"pid": os.getpid(), "started": me.create_time() - 3600, "group": None}, True),
            "p-live": ({"pid": os.getpid(), "started": me.create_time(), "group": None}, False),
            "p-group-runs": ({"pid": dead, "started": dead_start, "group": sleeper.pid}, False),
            "p-pending": ({"pid": dead, "started": dead_start, "group": PENDING}, False),
            "p-no-record": (None, False),
            "p-bad-record": ({"pid": "x"}, False),
            "other-dead": ({"pid": dead, "started": dead_start, "group": None}, False),  # another prefix
        }
        folders = {name: _folder(tmp_path, name, record) for name, (record, _) in cases.items()}
        (tmp_path / "p-file").write_text("not a folder")
        removed = sweep("p-", tmp_path)
        assert sorted(p.name for p in removed) == ["p-dead", "p-group-zombie", "p-reused"]
        for name, (_, swept) in cases.items():
            assert folders[name].exists() != swept, name
    finally:
        sleeper.kill()
        sleeper.wait()
        zombie.wait()
    # the group has ended: its folder goes now
    assert [p.name for p in sweep("p-", tmp_path)] == ["p-group-runs"]


def test_owned_dir_records_its_owner_and_goes_at_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    dead, dead_start = _dead_pid()
    stale = _folder(tmp_path, "hicache-t-stale", {"pid": dead, "started": dead_start, "group": None})
    with OwnedDir("hicache-t-") as owned:
        assert not stale.exists()  # swept by the start
        assert owned.path.parent == tmp_path and oct(owned.path.stat().st_mode & 0o777) == "0o700"
        record = json.loads((owned.path / OWNER_FILE).read_text())
        assert record == {"pid": os.getpid(), "started": psutil.Process().create_time(), "group": None}
        owned.set_group(1234)
        assert json.loads((owned.path / OWNER_FILE).read_text())["group"] == 1234
        assert sweep("hicache-t-", tmp_path) == []  # its owner runs
    assert list(tmp_path.iterdir()) == []


def test_verify_model_killed_by_sigterm_removes_its_temporary_store(tmp_path):
    # The store's folder exists from the start of the run; SIGTERM then: exit 143, folder gone.
    run_env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "hicache.cli", "verify-model", "--hicache-storage-backend",
                             "file", "--conversations", "64"], env=run_env, cwd=env.REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + WAIT_S
        while not any((p / OWNER_FILE).exists() for p in tmp_path.glob("hicache-verify-*")):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "verify-model made no store folder"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert "Traceback" not in err.decode()
    assert list(tmp_path.glob("hicache-verify-*")) == []
