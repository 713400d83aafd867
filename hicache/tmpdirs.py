"""Temporary folders owned by one process: removed when it is done (also on SIGTERM, with
`sigterm_unwinds`), and, when it was killed first (SIGKILL, a crash, the out-of-memory
killer), by the next process that makes one with the same prefix.

Each folder holds ``.hicache-owner``, a JSON record: the owner's pid, when that process
started (a pid reused by a later process is not the owner), and the process group that
uses the folder when there is one (`hicache serve-vllm`'s vLLM, which may outlive a
killed launcher). `sweep` removes a folder only when all of these hold: it is this user's,
it has a record, its owner is gone (no such pid, or that pid started at another time), no
process of its group is left, and the group was recorded whenever a child was started. A
folder without a readable record (being made, or made by an older hicache) is never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil

from bounded_input import read_json

OWNER_FILE = ".hicache-owner"
OWNER_MAX_BYTES = 4096  # a record is ~80 bytes
START_SLACK_S = 1.0  # psutil derives start times from the boot time: allow for its rounding
PENDING = "pending"  # the group while a child is being started (unknown: keep the folder)


def _started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch); ``None`` when there is none."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs (zombies, which an init that does not reap
    orphans may keep forever, do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's processes hold the id: not ours to judge
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except OSError:
            continue
    return False


def owner_gone(record: dict) -> bool:
    """Whether the owner and the group of an ``.hicache-owner`` record have all ended."""
    try:
        pid, started, group = int(record["pid"]), float(record["started"]), record.get("group")
        started_now = _started(pid)
        if started_now is not None and abs(started_now - started) <= START_SLACK_S:
            return False  # the owner itself still runs
        if group == PENDING:
            return False  # it died while starting a child that may still run
        return group is None or not _group_alive(int(group))
    except (KeyError, TypeError, ValueError, psutil.Error):
        return False  # a record we cannot read is not evidence


def sweep(prefix: str, parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's ``prefix*`` folders under ``parent`` (default: the temporary
    folder) whose owners are gone (module docstring); returns those removed."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed = []
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for path in entries:
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            record = read_json(path / OWNER_FILE, "an owner record", OWNER_MAX_BYTES)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and owner_gone(record):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class OwnedDir:
    """A new private folder (0700) ``<tmp>/<prefix>XXXX`` with its owner recorded, made
    after sweeping dead owners' folders of the same prefix (context manager: removed at exit).

    Args:
        prefix: the folder name's start (one prefix per kind of folder).
    """

    def __init__(self, prefix: str) -> None:
        sweep(prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self._record = {"pid": os.getpid(), "started": psutil.Process().create_time(), "group": None}
        self._write()

    def set_group(self, group: int | str | None) -> None:
        """Record the process group that uses the folder (`PENDING` while it is started)."""
        self._record["group"] = group
        self._write()

    def _write(self) -> None:
        part = self.path / (OWNER_FILE + ".part")
        part.write_text(json.dumps(self._record))
        os.replace(part, self.path / OWNER_FILE)

    def remove(self) -> None:
        """Remove the folder and everything in it (idempotent)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "OwnedDir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class Terminated(KeyboardInterrupt):
    """SIGTERM raised as Ctrl-C's exception (`sigterm_unwinds` with ``like_ctrl_c``): every
    handler of Ctrl-C stops the same way for it; the status is 143, not 130."""

    status = 128 + signal.SIGTERM


@contextmanager
def sigterm_unwinds(like_ctrl_c: bool = False) -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` (or `Terminated` with
    ``like_ctrl_c``) so that ``finally`` blocks and context managers (a temporary folder's
    removal, a store's writes in flight) run; Python's default would end the process at
    once. Only the first SIGTERM raises: later ones, while those clean-ups run, are ignored.
    Changes nothing off the main thread or where a handler is installed."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def unwind(sig: int, _frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop: a second SIGTERM must not cut the clean-up
        raise Terminated() if like_ctrl_c else SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
