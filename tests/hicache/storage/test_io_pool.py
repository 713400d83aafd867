"""StorageIO: queries, prefetches and backups on I/O threads; poll reports each once; a prefetch
stops at the first miss, at its deadline or on cancel, and says how far it got."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from hicache.storage import FileBackend, IOKind, StorageIO, StorageNamespace, StorageOp
from tests.hicache.storage.conftest import keys_for, llama, pages_of, random_pool

NS = StorageNamespace.for_pool(llama(1), "kv")


class GatedBackend(FileBackend):
    """A FileBackend whose reads wait for a gate (to hold an operation mid-run)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.entered = threading.Event(), threading.Event()

    def _get(self, keys, pages):
        self.entered.set()
        assert self.gate.wait(120), "test never opened the gate"
        return super()._get(keys, pages)


def _drain(io: StorageIO, n: int, timeout_s: float = 10.0) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += io.poll()
        time.sleep(0.002)
    return out


@pytest.fixture
def io():
    pool = StorageIO(num_threads=2, chunk_pages=2)
    yield pool
    pool.close()


def test_backup_query_prefetch_round_trip(tmp_path, gen, io):
    backend = FileBackend(NS, tmp_path)
    src, dst = random_pool(llama(1), "kv", 6, gen), random_pool(llama(1), "kv", 6, gen)
    keys = keys_for(6, 64)
    # 1. back up five pages; the scheduler only polls
    op = io.backup(backend, keys[:5], pages_of(src, NS, 5))
    (res,) = _drain(io, 1)
    assert (res.op_id, res.kind, res.ok, res.hit_pages, res.stopped) == (op.op_id, IOKind.BACKUP, [True] * 5, 5, False)
    # 2. the storage part of a lookup: leading run present
    io.query(backend, keys)
    assert [r.hit_pages for r in _drain(io, 1)] == [5]
    # 3. prefetch all six: the sixth misses, five come back byte-exact
    pf = io.prefetch(backend, keys, pages_of(dst, NS, 6))
    res = pf.result(10)
    assert res.ok == [True] * 5 + [False] and res.hit_pages == 5 and not res.stopped
    assert torch.equal(dst.buffer[:5], src.buffer[:5])
    assert [r.op_id for r in _drain(io, 1)] == [pf.op_id] and io.poll() == []  # reported once
    backend.close()


def test_channels_route_each_result_to_its_submitter(tmp_path, gen, io):
    # two users of one pool (two trees' stores): each polls only what it submitted
    backend = FileBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", 4, gen)
    keys = keys_for(4, 64)
    mine, theirs = io.channel(), io.channel()
    # 1. one backup per channel and one on the pool's own channel, all finished
    a = io.backup(backend, keys[:2], pages_of(src, NS, 2), channel=mine)
    b = io.backup(backend, keys[2:], pages_of(src, NS, 2, 2), channel=theirs)
    c = io.query(backend, keys)
    for op in (a, b, c):
        assert op.result(10) is not None  # done() implies its result is in its channel already
    # 2. each channel reports its own, once; the pool's poll only the un-channelled one
    assert [r.op_id for r in theirs.poll()] == [b.op_id] and theirs.poll() == []
    assert [r.op_id for r in io.poll()] == [c.op_id]
    assert [r.op_id for r in mine.poll()] == [a.op_id] and mine.poll() == []
    backend.close()


def test_presence_checks_each_key_alone(tmp_path, gen, io):
    # snapshots sit at scattered boundaries: which keys are present, not a leading run
    backend = FileBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", 5, gen)
    keys = keys_for(5, 64)
    stored = [1, 3, 4]
    assert backend.batch_set([keys[i] for i in stored], [pages_of(src, NS, 1, i)[0] for i in stored]) == [True] * 3
    res = io.presence(backend, keys).result(10)
    assert (res.kind, res.ok, res.hit_pages, res.stopped) == (IOKind.PRESENCE, [False, True, False, True, True], 3, False)
    assert io.query(backend, keys).result(10).hit_pages == 0  # the leading run is empty
    with pytest.raises(ValueError, match=r"keys\[0\]"):
        io.presence(backend, ["not a hash"])
    backend.close()


def test_prefetch_stops_at_the_first_miss(tmp_path, gen, io):
    backend = FileBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", 8, gen)
    keys = keys_for(8, 64)
    present = [0, 1, 2, 4, 5, 6, 7]  # hole at 3, chunks of two pages
    assert backend.batch_set([keys[i] for i in present], [pages_of(src, NS, 1, i)[0] for i in present]) == [True] * 7
    res = io.prefetch(backend, keys, pages_of(random_pool(llama(1), "kv", 8, gen), NS, 8)).result(10)
    assert res.ok == [True] * 3 + [False] * 5 and res.hit_pages == 3
    assert backend.stats().hits == 3 and backend.stats().misses == 1  # chunks after the miss never ran
    backend.close()


def test_deadline_and_cancel_end_early_and_say_how_far(tmp_path, gen, io):
    backend = GatedBackend(NS, tmp_path)
    src = random_pool(llama(1), "kv", 6, gen)
    keys = keys_for(6, 64)
    assert backend.batch_set(keys, pages_of(src, NS, 6)) == [True] * 6
    dst = random_pool(llama(1), "kv", 6, gen)
    # 1. a deadline already passed: nothing is read
    backend.gate.set()
    res = io.prefetch(backend, keys, pages_of(dst, NS, 6), timeout_s=0.0).result(10)
    assert res.ok == [False] * 6 and res.stopped and res.hit_pages == 0
    # 2. cancel while the first chunk runs: that chunk lands, the rest never starts
    backend.gate.clear()
    op = io.prefetch(backend, keys, pages_of(dst, NS, 6))
    assert backend.entered.wait(120)
    op.cancel()
    assert op.result(0.05) is None and not op.done()  # still owns its pages
    backend.gate.set()
    res = op.result(10)
    assert res.ok == [True, True] + [False] * 4 and res.stopped and res.hit_pages == 2
    assert torch.equal(dst.buffer[:2], src.buffer[:2])
    backend.close()


def test_bad_arguments_raise_at_submit(tmp_path, gen, io):
    backend = FileBackend(NS, tmp_path)
    pool = random_pool(llama(1), "kv", 2, gen)
    with pytest.raises(ValueError, match="one buffer per key"):
        io.backup(backend, keys_for(2, 64), pages_of(pool, NS, 1))
    with pytest.raises(ValueError, match=r"keys\[0\]"):
        io.query(backend, ["nope"])
    assert io.poll() == [] and backend.batch_exists(keys_for(2, 64)) == 0
    backend.close()


def test_an_unexpected_exception_is_reported_not_raised(tmp_path, gen, io):
    class Broken(FileBackend):
        def run(self, op, keys, pages):
            raise RuntimeError("bug in a backend")
    backend = Broken(NS, tmp_path)
    res = io.backup(backend, keys_for(2, 64), pages_of(random_pool(llama(1), "kv", 2, gen), NS, 2)).result(10)
    assert res.ok == [False, False] and res.stopped and "bug in a backend" in res.error
    backend.close()


def test_close_finishes_queued_operations_as_stopped(tmp_path, gen):
    io = StorageIO(num_threads=1, chunk_pages=1)
    backend = GatedBackend(NS, tmp_path)
    pool = random_pool(llama(1), "kv", 2, gen)
    keys = keys_for(2, 64)
    assert backend.batch_set(keys, pages_of(pool, NS, 2)) == [True, True]
    running = io.prefetch(backend, keys[:1], pages_of(pool, NS, 1))
    queued = io.prefetch(backend, keys[1:], pages_of(pool, NS, 1, first=1))
    assert backend.entered.wait(120)
    threading.Timer(0.05, backend.gate.set).start()
    io.close(wait=True)
    assert running.result(10).ok == [True]
    assert queued.result(10).ok == [False] and queued.result(10).stopped
    with pytest.raises(RuntimeError, match="closed"):
        io.query(backend, keys)
    backend.close()


class SecondChunkWaits(FileBackend):
    """A FileBackend whose second read call waits on a gate (a store stalled mid-prefetch)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.entered, self.calls = threading.Event(), threading.Event(), 0

    def _get(self, keys, pages):
        self.calls += 1
        if self.calls == 2:
            self.entered.set()
            assert self.gate.wait(60), "test never opened the gate"
        return super()._get(keys, pages)


def test_a_prefetch_reports_the_pages_its_finished_chunks_read(tmp_path, gen, io):
    """Issue 23, item 18: while a chunk is stuck, the pages before it are read, verified and
    never touched again: a caller whose deadline passed takes them and ends there."""
    backend = SecondChunkWaits(NS, tmp_path)
    src, dst = random_pool(llama(1), "kv", 6, gen), random_pool(llama(1), "kv", 6, gen)
    keys = keys_for(6, 64)
    assert backend.batch_set(keys, pages_of(src, NS, 6)) == [True] * 6
    op = io.prefetch(backend, keys, pages_of(dst, NS, 6))
    assert backend.entered.wait(60)
    assert op.progress() == 2 and not op.done()
    assert torch.equal(dst.buffer[:2], src.buffer[:2])  # those two pages are final already
    op.cancel()
    backend.gate.set()
    res = op.result(60)
    assert res.hit_pages == op.progress() == 4 and res.stopped and res.ok == [True] * 4 + [False] * 2
    backend.close()


class GatedWrites(FileBackend):
    """A FileBackend whose writes wait for a gate (a backup still running when a lookup comes)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def _set(self, keys, pages):
        assert self.gate.wait(120), "test never opened the gate"
        return super()._set(keys, pages)


def test_a_lookup_after_a_running_backup_sees_its_pages(tmp_path, gen, io):
    backend = GatedWrites(NS, tmp_path)
    src, keys = random_pool(llama(1), "kv", 3, gen), keys_for(3, 64)
    write = io.backup(backend, keys, pages_of(src, NS, 3))
    query = io.query(backend, keys, after=[write])
    presence = io.presence(backend, keys, after=[write, write])
    assert not query.done() and not presence.done()  # held back until the write is done
    backend.gate.set()
    assert query.result(10).hit_pages == 3 and presence.result(10).ok == [True] * 3
    # an operation already done holds nothing back
    assert io.query(backend, keys, after=[write]).result(10).hit_pages == 3


def test_an_operation_waiting_on_another_ends_stopped_when_the_pool_closes(tmp_path):
    pool = StorageIO(num_threads=1)
    running = StorageOp(10 ** 6, IOKind.BACKUP, 1, None)  # another's operation, finished by hand below
    query = pool.query(FileBackend(NS, tmp_path), keys_for(1, 64), after=[running])
    pool.close()  # the query waits: it can no longer be submitted
    running.future.set_result(None)
    res = query.result(10)
    assert res is not None and res.stopped and res.hit_pages == 0
