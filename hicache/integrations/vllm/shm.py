"""The shared memory a vLLM server leaves in /dev/shm, found while it runs and removed
when it stops.

vLLM's processes create POSIX shared memory: its message queues' ``psm_*`` segments
(Python's ``multiprocessing.shared_memory``) and Python's named semaphores (``sem.mp-*``).
Their creators, or multiprocessing's resource tracker, unlink them at a clean exit, but
vLLM's own shutdown SIGKILLs its engine, and whatever of the process group outlives the
server is SIGKILLed too (the resource tracker with it), so some stay behind, held by no
process. `ShmTracker` notes the /dev/shm inodes the server's process group maps or holds
open while it runs (``/proc/<pid>/maps`` and ``fd``, read at each poll and when a stop
begins) and, once the group has ended, removes this user's ``psm_*`` / ``sem.mp-*``
entries among them that no live process holds. Nothing else in /dev/shm is touched: not
another server's, not an entry this group never held. Linux only (elsewhere ``/proc`` is
missing and it does nothing).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

SHM_DIR = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")  # multiprocessing's shared memory and named semaphores
PROC = Path("/proc")


def _pids() -> Iterator[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def group_pids(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (a zombie holds no memory)."""
    out = []
    for pid in _pids():
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(pid)
    return out


def _shm_dev() -> int | None:
    try:
        return SHM_DIR.stat().st_dev
    except OSError:
        return None


def held_by(pid: int, dev: int) -> set[int]:
    """Inodes of /dev/shm (device ``dev``) that process ``pid`` maps or has open (empty
    when unreadable). By inode, not name: a named semaphore is mapped under the temporary
    name glibc made it with (``sem.XXXXXX (deleted)``) before linking it as ``sem.mp-*``."""
    inodes, shm = set(), f" {SHM_DIR}/"
    try:
        for line in (PROC / str(pid) / "maps").read_text().splitlines():
            if shm in line:
                fields = line.split(maxsplit=5)  # address perms offset dev inode path
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if os.makedev(major, minor) == dev:
                    inodes.add(int(fields[4]))
    except (OSError, ValueError, IndexError):
        pass
    fd_dir = PROC / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd).startswith(str(SHM_DIR) + "/"):
                st = os.stat(fd_dir / fd)
                if st.st_dev == dev:
                    inodes.add(st.st_ino)
        except OSError:
            continue
    return inodes


def held_anywhere(inodes: Iterable[int], dev: int) -> set[int]:
    """Which of ``inodes`` some live process (that this user can inspect) holds."""
    wanted, held = set(inodes), set()
    for pid in _pids():
        if not wanted - held:
            break
        held |= held_by(pid, dev) & wanted
    return held


def entries() -> dict[int, str]:
    """This user's multiprocessing entries of /dev/shm: inode -> name."""
    out = {}
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIXES)]
    except OSError:
        return out
    for name in names:
        try:
            st = os.lstat(SHM_DIR / name)
        except OSError:
            continue
        if st.st_uid == os.getuid():
            out[st.st_ino] = name
    return out


class ShmTracker:
    """The /dev/shm entries one process group held, removed once it has ended.

    Args:
        pgid: the server's process group.
    """

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.dev = _shm_dev()
        self.seen: set[int] = set()  # inodes

    def observe(self) -> None:
        """Note what the group's processes hold now."""
        if self.dev is None:
            return
        for pid in group_pids(self.pgid):
            self.seen |= held_by(pid, self.dev)

    def release(self) -> list[str]:
        """Remove this user's ``psm_*`` / ``sem.mp-*`` entries whose inode the group held
        and no live process holds now; call it after the group has ended. Returns the
        names removed."""
        if self.dev is None or not self.seen:
            return []
        left = {ino: name for ino, name in entries().items() if ino in self.seen}
        removed = []
        for ino in sorted(set(left) - held_anywhere(left, self.dev)):
            try:
                (SHM_DIR / left[ino]).unlink()
                removed.append(left[ino])
            except FileNotFoundError:
                pass
            except OSError:
                continue  # not ours to remove after all: leave it
        return removed
