"""The async hints — demote, prefetch, persist — on the tree: DONE only when their bytes are
in place (copies held on a gate the test opens), cancelled prefetches, storage, and
faults: a raising callee leaks no lock, no job and no retain."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hicache.models import mha
from hicache.radix.hints import HintState
from hicache.radix.prefetch import PrefetchOutcome
from hicache.replay.content import ContentModel, prefix_hashes
from tests.hicache.radix import storage_env
from tests.hicache.radix.test_cache import seq
from tests.hicache.radix.test_hints import PS, make, on_device, put


class HeldCopies:
    """The controller's copies held until the test opens ``gate``, as a busy device holds
    them: a launched batch neither copies nor completes (its event) before that."""

    def __init__(self, ctrl) -> None:
        self.gate = threading.Event()
        launcher = ctrl._launcher
        start = launcher.start

        def held(batch) -> None:
            gate, ran = self.gate, []

            class Event:
                def query(self) -> bool:
                    if gate.is_set() and not ran:
                        ran.append(start(batch))  # the copy runs now, then the batch is complete
                    return bool(ran)
            batch.event = Event()
        launcher.start = held


def filled(cache, tokens) -> tuple[ContentModel, list[int]]:
    """Device content of ``tokens`` (the tree's own slots) made to match the content model."""
    content, hashes = ContentModel(cache), prefix_hashes(tokens, PS)
    slots = cache.device_pools["kv"].alloc(tokens.size)
    content.fill("kv", slots, hashes)
    return content, hashes, slots


def host_rows(cache, tree, tokens) -> torch.Tensor:
    m = tree.match_prefix(tokens)
    return tree.device_slots(m.last_device_node), m


def test_a_demote_is_done_only_when_its_copy_is_on_the_host():
    cache, tree, clock = make(policy="write_back")  # nothing backed up at insert
    tokens = seq(0, 3, PS)
    content, hashes, slots = filled(cache, tokens)
    tree.insert(tokens, slots)
    held = HeldCopies(cache.controller)
    kv = cache.device_pools["kv"]
    free = kv.available()
    # 1. demote: the backup is queued and launched, but its copy is held
    ticket = tree.hint(tokens, "demote")
    cache.controller.start_writing()
    for _ in range(3):
        tree.poll()
    assert ticket.state is HintState.ACCEPTED and ticket.busy
    node = tree.match_prefix(tokens).last_device_node
    assert node.host is None and on_device(tree, tokens) == 3 * PS and kv.available() == free
    # 2. the copy lands: DONE, the device pages are free, the host pages hold the bytes
    held.gate.set()
    tree.poll()
    assert ticket.state is HintState.DONE and kv.available() == free + 3 * PS
    m = tree.match_prefix(tokens)
    assert (m.device_hit_length, m.host_hit_length) == (0, 3 * PS)
    tree.inc_lock_ref(m.last_host_node)
    tree.load_back(m.last_host_node)
    tree.wait()
    tree.dec_lock_ref(m.last_host_node)
    assert content.verify("kv", tree.match_prefix(tokens).device_slots, hashes, "demoted") > 0
    tree.check_integrity()


def test_a_prefetch_is_done_only_when_its_pages_are_on_the_device():
    cache, tree, clock = make()
    tokens = seq(0, 3, PS)
    content, hashes, slots = filled(cache, tokens)
    tree.insert(tokens, slots)
    tree.wait()
    assert tree.hint(tokens, "demote").wait() is HintState.DONE
    held = HeldCopies(cache.controller)
    # 1. prefetch to the device: the load is queued and launched, its copy held
    ticket = tree.hint(tokens, "prefetch", to="device")
    cache.controller.start_loading()
    tree.poll()
    assert ticket.state is HintState.ACCEPTED and on_device(tree, tokens) == 0
    # 2. the copy lands: DONE, and the device pages hold the bytes
    held.gate.set()
    assert ticket.wait(timeout_s=30) is HintState.DONE
    m = tree.match_prefix(tokens)
    assert m.device_hit_length == 3 * PS and content.verify("kv", m.device_slots, hashes, "prefetched") > 0
    tree.check_integrity()


def test_a_failed_backup_refuses_the_demote_and_leaves_the_prefix_on_the_device(monkeypatch):
    cache, tree, clock = make(policy="write_back")
    tokens = put(cache, tree, 0, 2)
    monkeypatch.setattr(cache.controller, "write", lambda *a, **k: None)  # the host has no room
    ticket = tree.hint(tokens, "demote")
    assert ticket.state is HintState.REFUSED and "stays on the device" in ticket.reason
    assert on_device(tree, tokens) == 2 * PS and not tree._hints.work.jobs
    tree.check_integrity()


def test_a_raising_callee_leaks_no_lock_no_job_and_no_retain(monkeypatch):
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    retain = tree.hint(a, "retain", ttl_s=30)
    assert tree.hint(a, "demote").wait() is HintState.DONE

    def broken(*args, **kwargs):
        raise RuntimeError("injected load fault")
    # 1. the load a prefetch queues raises: refused, the exception reaches the caller,
    #    the load's lock is undone, no job is left
    monkeypatch.setattr(cache.controller, "load", broken)
    before = tree.counters["hints"]
    with pytest.raises(RuntimeError, match="injected load fault"):
        tree.hint(a, "prefetch")
    assert tree.counters["hints"] == before + 1 and not tree._hints.work.jobs
    m = tree.match_prefix(a)
    assert m.last_host_node.lock_ref == 0 and retain.state is HintState.ACCEPTED
    monkeypatch.undo()
    # 2. a step of a job raises at poll: that hint is refused and logged, the tree goes on
    ticket = tree.hint(a, "prefetch")
    monkeypatch.setattr(tree._hints.work, "_prefetch_step", broken)
    tree._step()
    assert ticket.state is HintState.REFUSED and "injected load fault" in ticket.reason
    assert not tree._hints.work.jobs
    monkeypatch.undo()
    # 3. eviction raising inside a retain's pressure path leaves the book as it was
    monkeypatch.setattr(tree._evictor, "_drop", broken)
    with pytest.raises(RuntimeError):
        tree.evict(8 * PS)
    assert retain.state is HintState.ACCEPTED and len(tree._hints.book.retains) == 1
    monkeypatch.undo()
    tree.wait()
    tree.check_integrity()


def test_persist_is_done_when_the_store_acks_and_a_store_fault_refuses_it(tmp_path):
    stack = mha(1, 1, 8, page_size=PS)
    cache, tree = storage_env.make(stack, tmp_path, write_policy="write_back", storage_write_policy="write_back")
    a = seq(0, 2, PS)
    content, hashes, slots = filled(cache, a)
    tree.insert(a, slots)
    # 1. not on the host, not in storage: backed up, then written; DONE when the write is acked
    ticket = tree.hint(a, "persist")
    assert ticket.state is HintState.ACCEPTED
    assert ticket.wait(timeout_s=30) is HintState.DONE
    node = tree.match_prefix(a).last_device_node
    assert node.stored and tree.hint(a, "persist").noop  # in storage already
    tree.close()
    # 2. a store that fails every write: REFUSED, saying so
    cache2, tree2 = storage_env.make(stack, tmp_path / "b", write_policy="write_back",
                                     storage_write_policy="write_back", backend_cls=Refusing)
    b = seq(500, 2, PS)
    tree2.insert(b, filled(cache2, b)[2])
    failed = tree2.hint(b, "persist")
    assert failed.wait(timeout_s=30) is HintState.REFUSED and "not written" in failed.reason
    tree2.check_integrity()
    tree2.close()


class Refusing(storage_env.FileBackend):
    """A store whose every write fails."""

    def _set(self, keys, pages):
        return [False] * len(keys)


def test_a_cancelled_prefetch_stops_its_storage_read(tmp_path, gated):
    cache, tree, tokens = storage_env.stored(tmp_path, 3, backend_cls=gated)
    # 1. the prompt is in storage only: the prefetch reads it, a read waits at the gate
    ticket = tree.hint(tokens, "prefetch", to="host")
    assert ticket.state is HintState.ACCEPTED
    storage_env.poll_until_reading(tree, gated)
    # 2. cancel: EXPIRED at once; the read stops, its lock goes when it ends
    assert ticket.cancel() and ticket.state is HintState.EXPIRED and "cancelled" in ticket.reason
    assert not ticket.cancel()
    gated.gate.set()
    tree.drain_storage()
    assert tree.root.lock_ref == 1 and all(n.lock_ref == 0 for n in tree.root.children.values())
    tree.check_integrity()
    tree.close()


def test_a_prefetch_to_the_host_lands_from_storage(tmp_path):
    cache, tree, tokens = storage_env.stored(tmp_path, 3)
    ticket = tree.hint(tokens, "prefetch", to="host")
    assert ticket.wait(timeout_s=30) is HintState.DONE and not ticket.noop
    m = tree.match_prefix(tokens)
    assert (m.device_hit_length, m.host_hit_length) == (0, 3 * PS)
    # and to the device from there
    assert tree.hint(tokens, "prefetch").wait(timeout_s=30) is HintState.DONE
    assert on_device(tree, tokens) == 3 * PS
    tree.check_integrity()
    tree.close()


def test_hints_on_a_hybrid_prefix_move_its_snapshot_with_it():
    from tests.hicache.radix.test_hybrid import PS as DSV4_PAGE, dsv4, hit, insert
    cache, tree = dsv4(policy="write_back", device_pages=8)
    tokens = seq(0, 2, DSV4_PAGE)
    node = insert(cache, tree, tokens).last_node
    # 1. retained, then demoted: history and snapshot on the host, the match ends there
    assert tree.hint(tokens, "retain", ttl_s=60).state is HintState.ACCEPTED
    assert tree.hint(tokens, "demote").wait(timeout_s=30) is HintState.DONE
    assert hit(tree, tokens) == (0, 2 * DSV4_PAGE) and node.state_host is not None and node.state_device is None
    # 2. prefetched: both back on the device
    assert tree.hint(tokens, "prefetch").wait(timeout_s=30) is HintState.DONE
    assert hit(tree, tokens) == (2 * DSV4_PAGE, 0) and node.state_device is not None
    tree.check_integrity()
