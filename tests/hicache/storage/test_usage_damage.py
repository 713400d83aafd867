"""The file store's shared usage total under damage (issue 28, items 4-7): a total that
cannot be true is rebuilt under the lock before anything is evicted, a reservation is never
lost on an error path, and a usage file unlinked under a running process is followed by
inode. Each case writes the damaged total as the issue found it (the file's own format)."""
from __future__ import annotations

import os
import struct

import pytest

from hicache.storage import FileBackend, file_ledger
from hicache.storage.file_ledger import LEDGER_FILE
from tests.hicache.storage.test_file_capacity import Child, _obj, _on_disk, _ns, _write


def _damage(root, total: int) -> None:
    """Overwrite the directory's total with a well-formed record of ``total``."""
    with open(os.path.join(root, LEDGER_FILE), "r+b") as f:
        f.write(b"hicache\x01" + struct.pack("<q", total))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _consistent(backend: FileBackend, root) -> None:
    """The shared total is the bytes on disk, nothing is reserved, no temporary is left."""
    files = _on_disk(root)
    assert backend._index.total_bytes == sum(map(os.path.getsize, files))
    assert backend._index._inflight == 0 and _on_disk(root, ".tmp") == []


def test_a_total_near_int64s_limit_is_rebuilt_and_leaks_nothing(tmp_path):
    """Item 4: with no capacity (the default) a total of 2**63-11 overflowed int64 in
    ``admit``: every write failed and left a temporary, a descriptor and its bytes."""
    with FileBackend(_ns(), tmp_path) as backend:
        assert _write(backend, 0, 2, seed=1) == [True] * 2
        _damage(tmp_path, 2**63 - 11)
        fds = _fds()
        assert _write(backend, 2, 3, seed=2) == [True] * 3
        assert _fds() == fds and len(_on_disk(tmp_path)) == 5
        _consistent(backend, tmp_path)


def test_a_ledger_that_fails_after_the_reservation_gives_it_back(tmp_path, monkeypatch):
    """Item 4: a reservation is never lost on an error path, whatever raises after it."""
    with FileBackend(_ns(), tmp_path, capacity_bytes=4 * _obj()) as backend:
        write = file_ledger.Ledger.write

        def broken(self, total):
            raise struct.error("argument out of range")
        fds = _fds()
        monkeypatch.setattr(file_ledger.Ledger, "write", broken)
        assert _write(backend, 0, 2, seed=1) == [False] * 2
        monkeypatch.setattr(file_ledger.Ledger, "write", write)
        assert _fds() == fds and _on_disk(tmp_path, ".tmp") == [] and backend._index._inflight == 0
        assert _write(backend, 0, 2, seed=1) == [True] * 2
        _consistent(backend, tmp_path)


def test_a_release_whose_ledger_fails_still_removes_its_temporary(tmp_path, monkeypatch):
    """Item 4: a failed write's temporary and descriptor go even when its total cannot be read."""
    with FileBackend(_ns(), tmp_path, capacity_bytes=4 * _obj()) as backend:
        fds = _fds()

        def eio(*args, **kwargs):
            raise OSError(5, "Input/output error")

        def failing_write(*args, **kwargs):  # the write fails, then so does the ledger
            monkeypatch.setattr(file_ledger.Ledger, "read", eio)
            eio()
        monkeypatch.setattr(backend, "_write", failing_write)
        assert _write(backend, 0, 1, seed=1) == [False]
        assert _fds() == fds and _on_disk(tmp_path, ".tmp") == [] and backend._index._inflight == 0


def test_a_huge_total_is_rebuilt_before_anything_is_evicted(tmp_path):
    """Item 5: a total of 2**62 under a capacity of 10 objects, 4 stored: one more write
    evicted all 4 before the rescan that shows 5 of 10 in use."""
    with FileBackend(_ns(), tmp_path, capacity_bytes=10 * _obj()) as backend:
        assert _write(backend, 0, 4, seed=1) == [True] * 4
        _damage(tmp_path, 2**62)
        assert _write(backend, 4, 1, seed=2) == [True]
        assert backend.stats().evictions == 0 and len(_on_disk(tmp_path)) == 5
        _consistent(backend, tmp_path)


def test_a_total_above_the_capacity_is_rebuilt_before_anything_is_evicted(tmp_path):
    """Item 5: a plausible size, but one every admission keeps under the capacity."""
    with FileBackend(_ns(), tmp_path, capacity_bytes=10 * _obj()) as backend:
        assert _write(backend, 0, 4, seed=1) == [True] * 4
        _damage(tmp_path, 12 * _obj())
        assert _write(backend, 4, 1, seed=2) == [True]
        assert backend.stats().evictions == 0 and len(_on_disk(tmp_path)) == 5
        _consistent(backend, tmp_path)


def test_a_total_too_low_for_what_is_stored_is_rebuilt(tmp_path):
    """Item 7: a total of 0 while 8 objects are stored, capacity 10: up to 18 were on disk
    before it corrected; the capacity now holds after every write."""
    cap = 10
    with FileBackend(_ns(), tmp_path, capacity_bytes=cap * _obj()) as backend:
        assert _write(backend, 0, 8, seed=1) == [True] * 8
        _damage(tmp_path, 0)
        for i in range(10):
            assert _write(backend, 8 + i, 1, seed=2 + i) == [True]
            assert len(_on_disk(tmp_path)) <= cap
        _consistent(backend, tmp_path)


def test_a_negative_total_is_rebuilt(tmp_path):
    with FileBackend(_ns(), tmp_path, capacity_bytes=4 * _obj()) as backend:
        assert _write(backend, 0, 3, seed=1) == [True] * 3
        _damage(tmp_path, -5)
        assert _write(backend, 3, 2, seed=2) == [True] * 2
        assert len(_on_disk(tmp_path)) == 4
        _consistent(backend, tmp_path)


def test_a_usage_file_unlinked_under_a_running_process_is_followed(tmp_path):
    """Item 6: the usage file removed while process A runs (the store's own refusal message
    says to remove it): A kept its deleted inode, B made a new one, two totals, 5 objects
    under a 4-object cap. A follows the path's inode under the lock and rebuilds."""
    cap = 4 * _obj()
    with FileBackend(_ns(), tmp_path, capacity_bytes=cap) as a:
        assert _write(a, 0, 2, seed=1) == [True] * 2
        os.unlink(tmp_path / LEDGER_FILE)
        child = Child(tmp_path, cap)  # B: a new usage file, its scan counts A's two objects
        try:
            assert child.ask("write", 2, 2, 2) == [True] * 2
            assert _write(a, 4, 1, seed=3) == [True]
            assert len(_on_disk(tmp_path)) == 4
            assert child.ask("write", 5, 1, 4) == [True]
            assert len(_on_disk(tmp_path)) == 4
            assert child.ask("close") == "closed"
        finally:
            child.stop()
        _consistent(a, tmp_path)
        st = os.stat(tmp_path / LEDGER_FILE)
        assert (st.st_dev, st.st_ino) == (lambda s: (s.st_dev, s.st_ino))(os.fstat(a._index._ledger._fd))
