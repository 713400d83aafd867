"""The file store's capacity holds for the directory (issue 23, items 3 and 4): with writers
racing inside one process, with two processes sharing the directory, and after a writer
died holding a reservation. No timing: barriers and a command pipe order every step."""
from __future__ import annotations

import errno
import multiprocessing
import os
import threading

from hicache.storage import FileBackend, StorageNamespace, file_ledger
from hicache.storage.file_index import FileIndex, close_index, open_index
from hicache.storage.page import HEADER_BYTES
from tests.hicache.storage.conftest import keys_for, llama, pages_of, random_pool

KEYS = keys_for(24, 64)
STEP_S = 120  # a bound on each step of a child (never reached; a hung child fails instead of hanging)


def _ns() -> StorageNamespace:
    return StorageNamespace.for_pool(llama(1), "kv")


def _obj() -> int:
    return HEADER_BYTES + _ns().object_bytes


def _on_disk(root, suffix: str = ".page") -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(suffix))


def _write(backend: FileBackend, first: int, count: int, seed: int) -> list[bool]:
    import torch
    src = random_pool(llama(1), "kv", count, torch.Generator().manual_seed(seed))
    return backend.batch_set(KEYS[first:first + count], pages_of(src, backend.namespace, count))


def test_writers_racing_in_one_process_never_exceed_the_capacity(tmp_path, monkeypatch):
    """Item 3: four I/O threads each admit one object under a cap of two before any of them
    writes; an admitted object is never another's victim, so two are stored, two refused."""
    barrier = threading.Barrier(4)
    admit = FileIndex.admit

    def admit_then_wait(self, path, size):
        out = admit(self, path, size)
        barrier.wait(timeout=STEP_S)  # every thread has been admitted before any writes
        return out
    monkeypatch.setattr(FileIndex, "admit", admit_then_wait)
    results: list[bool] = [False] * 4
    with FileBackend(_ns(), tmp_path, capacity_bytes=2 * _obj()) as backend:
        def one(i: int) -> None:
            results[i] = _write(backend, i, 1, seed=i)[0]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STEP_S)
        assert len(_on_disk(tmp_path)) == 2 and sorted(results) == [False, False, True, True]
        assert backend._index.total_bytes == 2 * _obj() and _on_disk(tmp_path, ".tmp") == []
        # the two stored objects are the two admitted first: both read back
        assert sum(backend.batch_exists([k]) for k in KEYS[:4]) == 2


def test_a_write_that_raises_gives_its_reservation_back(tmp_path, monkeypatch):
    with FileBackend(_ns(), tmp_path, capacity_bytes=2 * _obj()) as backend:
        def broken(*args, **kwargs):
            raise RuntimeError("a bug in the write path")
        monkeypatch.setattr(backend, "_write", broken)
        assert _write(backend, 0, 2, seed=1) == [False, False]  # a bug fails the batch, never the caller
        assert backend._index.total_bytes == 0 and _on_disk(tmp_path, ".tmp") == []
        monkeypatch.undo()
        assert _write(backend, 0, 2, seed=1) == [True, True] and backend.stats().evictions == 0


def _child(conn, root: str, capacity: int) -> None:
    """A second process on ``root``: runs the parent's commands in order, answers each."""
    backend = FileBackend(_ns(), root, capacity_bytes=capacity)
    conn.send("open")
    while True:
        cmd, *args = conn.recv()
        if cmd == "write":
            conn.send(_write(backend, *args))
        elif cmd == "reserve":  # admit an object, then die before writing it (a crash mid-write)
            path = backend.path(KEYS[args[0]])
            backend._subdir(os.path.dirname(path))
            backend._index.admit(path, _obj())
            conn.send("reserved")
            conn.recv()
            os._exit(0)
        else:
            backend.close()
            conn.send("closed")
            return


class Child:
    """A real second process (spawned: nothing inherited) driven step by step."""

    def __init__(self, root, capacity: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(theirs, str(root), capacity), daemon=True)
        self.proc.start()
        assert self.ask() == "open"

    def ask(self, *cmd):
        if cmd:
            self.conn.send(cmd)
        assert self.conn.poll(STEP_S), "the child process did not answer"
        return self.conn.recv()

    def stop(self) -> None:
        """Close the child if it still runs (a failed test), and reap it."""
        if self.proc.is_alive():
            try:
                self.conn.send(("close",))
            except OSError:
                pass  # it is going down by itself
        self.proc.join(STEP_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def test_two_processes_on_one_directory_share_its_capacity(tmp_path):
    """Item 4: a cap of 8 objects holds for the directory, not per process."""
    cap = 8 * _obj()
    child = Child(tmp_path, cap)
    try:
        with FileBackend(_ns(), tmp_path, capacity_bytes=cap) as parent:
            # 1. the child fills the directory; the parent, opened before, writes 8 more
            assert child.ask("write", 0, 8, 1) == [True] * 8
            assert _write(parent, 8, 8, seed=2) == [True] * 8
            assert len(_on_disk(tmp_path)) == 8 and parent.stats().evictions == 8
            # 2. the child writes 4 more: the objects it knows are gone, it learns the parent's
            assert child.ask("write", 16, 4, 3) == [True] * 4
            files = _on_disk(tmp_path)
            assert len(files) == 8 and parent._index.total_bytes == sum(map(os.path.getsize, files))
            # (which four of the parent's went depends on modification times, equal within a batch)
            assert sum(parent.batch_exists([k]) for k in KEYS[8:16]) == 4 and parent.batch_exists(KEYS[16:20]) == 4
        assert child.ask("close") == "closed"
    finally:
        child.stop()
    assert child.proc.exitcode == 0


def test_a_reservation_counts_while_its_writer_lives_and_not_after_it_died(tmp_path):
    """Item 4, crash safety: an object being written by another process counts against the
    capacity; once that process died, its reservation goes within one capacity's turnover
    of a process that stays open, and at the next open."""
    cap = 3 * _obj()
    child = Child(tmp_path, 0)
    try:
        assert child.ask("write", 0, 2, 1) == [True] * 2
        assert child.ask("reserve", 2) == "reserved"
        server = FileBackend(_ns(), tmp_path, capacity_bytes=cap)  # stays open throughout
        assert server._index.total_bytes == cap  # two objects and the write in flight
        child.conn.send(("die",))
        child.proc.join(STEP_S)
    finally:
        child.stop()
    assert child.proc.exitcode == 0
    with server:
        # three objects written evict a capacity's worth; the fourth admission rescans
        assert _write(server, 3, 3, seed=2) == [True] * 3
        assert len(_on_disk(tmp_path)) == 2 and len(_on_disk(tmp_path, ".tmp")) == 1  # the dead write's room
        assert _write(server, 6, 1, seed=3) == [True]
        assert len(_on_disk(tmp_path)) == 3 and _on_disk(tmp_path, ".tmp") == []
        assert server._index.total_bytes == cap
    # a fresh open drops a dead writer's reservation at once
    child = Child(tmp_path, 0)
    try:
        assert child.ask("reserve", 7) == "reserved"
        child.conn.send(("die",))
        child.proc.join(STEP_S)
    finally:
        child.stop()
    index = open_index(tmp_path, 0)
    assert index.total_bytes == cap and len(index) == 3 and _on_disk(tmp_path, ".tmp") == []
    close_index(index)


def test_without_file_locks_the_capacity_holds_per_process(tmp_path, monkeypatch, caplog):
    """A file system without ``flock`` (some network mounts): one warning, and the capacity
    still holds for this process's writers."""
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(file_ledger.fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="hicache.storage"):
        with FileBackend(_ns(), tmp_path, capacity_bytes=2 * _obj()) as backend:
            assert _write(backend, 0, 3, seed=1) == [True] * 3
            assert len(_on_disk(tmp_path)) == 2 and backend._index.total_bytes == 2 * _obj()
    assert [r.getMessage() for r in caplog.records if "cannot be locked" in r.getMessage()] == [
        f"file storage: {tmp_path}/.hicache-usage cannot be locked (No locks available); the capacity holds per "
        "process, not for the directory"]
