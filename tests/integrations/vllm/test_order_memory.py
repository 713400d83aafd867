"""Memory that does not grow with requests (issue 37 item 3): the host index's order, under
every policy, holds what the index holds, however many lookups touch it.

The defect: under lfu / lfuda / adaptive every touch pushed a heap entry that nothing
compacted (2.0 M entries, 259 MB after 200k requests of 10 hot chunks). Counted here:
the order's heap entries, its ghosts and the adaptive policy's mini caches, and the
bytes tracemalloc sees allocated between the middle and the end of the run.
"""
from __future__ import annotations

import tracemalloc

import pytest

from hicache.config import EVICTION_POLICIES
from hicache.integrations.vllm.index import HostBlockIndex, Lookup
from hicache.integrations.vllm.order import COMPACT_SLACK
from hicache.radix.policies import scores
from hicache.radix.policies.ghosts import GHOST_SPAN
from tests.hicache.radix.test_policy_memory import policy_bytes

CHUNKS = 64
HOT = 10  # hot chunks every request carries


def run(idx: HostBlockIndex, requests: int, start: int = 0) -> None:
    """``requests`` requests (10-11 lookups each): the hot chain plus, every 16th, a fresh chunk
    stored (an eviction once full); every 64th loads the hot chain (pins: stale heap entries)."""
    hot = [(0, n) for n in range(HOT)]
    for r in range(start, start + requests):
        if r % 16:
            idx.touch(hot)
            continue
        chain = [*hot, (0, 10**6 + r)]
        idx.touch(chain)
        plan = idx.prepare_store(chain)
        if plan is not None:
            idx.complete_store(plan.keys)
        if r % 64 == 0 and all(idx.lookup(key) is Lookup.HIT for key in hot):
            idx.prepare_load(hot)
            idx.complete_load(hot)


def bounded(idx: HostBlockIndex) -> None:
    order = idx._order[0]
    idle = len(order.keys())
    assert order.heap_entries() <= 2 * idle + COMPACT_SLACK + 1
    assert len(order.chunks) <= CHUNKS
    history = order.policy.history
    assert len(history) <= GHOST_SPAN * CHUNKS
    assert all(len(getattr(s, "clocks", ())) <= scores.MAX_CHECKPOINTS for s in order.policy.all_scores())
    shadows = getattr(order.policy, "shadows", None)
    if shadows is not None:
        assert shadows.entries() <= (len(shadows.minis) + 1 + GHOST_SPAN) * CHUNKS


def group_of(key: tuple) -> int:
    return key[0]


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_every_order_is_bounded_by_what_it_holds(policy):
    """3 x 10^4 lookups per policy: the structures never pass their bounds."""
    idx = HostBlockIndex(CHUNKS, 1, group_of, eviction_policy=policy)
    for part in range(6):
        run(idx, 500, part * 500)
        bounded(idx)
    idx.check_integrity()


def test_a_million_lookups_leave_memory_flat():
    """lfu (whose heap grew with every lookup; every policy shares the order's heap, checked
    above), 10^6 lookups: no more memory held by the policy's code at the end than halfway."""
    idx = HostBlockIndex(CHUNKS, 1, group_of, eviction_policy="lfu")
    order = idx._order[0]
    run(idx, 5000)  # warm: full, ghosts at their bound
    tracemalloc.start()  # (objects made before it are not seen when freed: compare two points)
    try:
        run(idx, 50000, 5000)
        order._rebuild()  # measured compacted: the heap's stale entries are a bounded sawtooth
        half = policy_bytes()
        run(idx, 50000, 55000)
        order._rebuild()
        end = policy_bytes()
    finally:
        tracemalloc.stop()
    bounded(idx)
    # 5 x 10^5 lookups more: within 16 KiB (dict tables and int objects wobble by a few KiB;
    # the defect grew by ~1 KiB per 10^3 lookups)
    assert end - half < 16 << 10, f"{half=} {end=}"
    idx.check_integrity()
