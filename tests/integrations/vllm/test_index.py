"""HostBlockIndex: the manager's state machine, narrated, plus random operation sequences."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.config import EVICTION_POLICIES
from hicache.integrations.vllm.index import HostBlockIndex, Lookup
from hicache.radix.policies.adaptive import CANDIDATES


def group_of(key: tuple) -> int:
    return key[0]


def k(group: int, n: int) -> tuple:
    return (group, n)


def test_store_load_evict_scenario():
    idx = HostBlockIndex(num_chunks=3, num_groups=1, group_of=group_of)
    # 1. store three blocks: they get the three chunk ids and are PENDING until completed
    plan = idx.prepare_store([k(0, 1), k(0, 2), k(0, 3)])
    assert plan.keys == [k(0, 1), k(0, 2), k(0, 3)] and sorted(plan.chunks) == [0, 1, 2]
    assert plan.evicted == [] and idx.lookup(k(0, 1)) is Lookup.PENDING
    # 2. the host is full of in-flight stores: a fourth store is refused, nothing changes
    assert idx.prepare_store([k(0, 4)]) is None
    assert idx.counters["store_refused"] == 1 and len(idx) == 3
    # 3. stores complete; keys become HIT; storing again is a no-op
    assert idx.complete_store([k(0, 1), k(0, 2), k(0, 3)]) == [k(0, 1), k(0, 2), k(0, 3)]
    assert idx.lookup(k(0, 2)) is Lookup.HIT
    assert idx.prepare_store([k(0, 2)]).keys == []
    # 4. load block 1 (pinned), touch block 2: LRU order is now 3, 2 (1 is pinned)
    chunk_1 = idx.prepare_load([k(0, 1)])
    idx.touch([k(0, 2)])
    # 5. a new store evicts the LRU idle block 3, never the loading block 1
    plan = idx.prepare_store([k(0, 5)])
    assert plan.evicted == [k(0, 3)] and idx.lookup(k(0, 3)) is Lookup.MISS
    idx.complete_store([k(0, 5)])
    # 6. with 1 loading and 2, 5 idle, two more stores evict 2 and 5 but not 1
    plan = idx.prepare_store([k(0, 6), k(0, 7)])
    assert sorted(plan.evicted) == [k(0, 2), k(0, 5)]
    assert idx.prepare_store([k(0, 8)]) is None  # only the loading block is left to evict
    # 7. the load completes: block 1 kept its chunk and is evictable again
    idx.complete_load([k(0, 1)])
    assert idx.prepare_load([k(0, 1)]) == chunk_1
    idx.complete_load([k(0, 1)])
    idx.check_integrity()


def test_failed_store_frees_its_chunk_and_groups_are_separate():
    idx = HostBlockIndex(num_chunks=2, num_groups=2, group_of=group_of)
    plan = idx.prepare_store([k(0, 1), k(1, 1), k(1, 2)])
    assert plan.chunks[0] in (0, 1) and sorted(plan.chunks[1:]) == [0, 1]  # per-group ids
    assert idx.complete_store([k(1, 2)], success=False) == []
    assert idx.lookup(k(1, 2)) is Lookup.MISS and idx.used(1) == 1
    assert idx.counters["store_failed"] == 1
    # group 0 still has room, group 1 too: a store into a full group 0 would not evict group 1
    idx.complete_store([k(0, 1), k(1, 1)])
    assert idx.prepare_store([k(0, 2), k(0, 3)]).evicted == [k(0, 1)]
    idx.check_integrity()


def test_keys_of_the_call_are_never_evicted_and_bad_loads_change_nothing():
    idx = HostBlockIndex(num_chunks=1, num_groups=1, group_of=group_of)
    idx.prepare_store([k(0, 1)])
    idx.complete_store([k(0, 1)])
    # storing [1, 2]: 1 is present and protected, so 2 has no chunk -> refused
    assert idx.prepare_store([k(0, 1), k(0, 2)]) is None
    with pytest.raises(ValueError, match="absent"):
        idx.prepare_load([k(0, 1), k(0, 9)])
    with pytest.raises(ValueError, match="no pending load"):
        idx.complete_load([k(0, 1)])
    assert idx.lookup(k(0, 1)) is Lookup.HIT
    idx.reset()
    assert len(idx) == 0 and idx.used(0) == 0
    idx.check_integrity()


def test_reset_quarantines_chunks_with_a_transfer_in_flight():
    # A store in flight at a reset must not have its chunk handed to a new key before the
    # workers are past it: the late copy would land in the new key's bytes.
    idx = HostBlockIndex(num_chunks=2, num_groups=1, group_of=group_of)
    idx.prepare_store([k(0, 1)])  # STORING in chunk a
    idx.prepare_store([k(0, 2)])
    idx.complete_store([k(0, 2)])
    chunk_3 = idx.prepare_load([k(0, 2)])  # LOADING from chunk b
    idx.reset()
    assert len(idx) == 0 and idx.quarantined(0) == 2 and idx.used(0) == 2
    assert idx.prepare_store([k(0, 3)]) is None  # nothing reusable yet
    idx.check_integrity()
    assert idx.release_reset() == 2 and idx.used(0) == 0
    plan = idx.prepare_store([k(0, 3), k(0, 4)])
    assert sorted(plan.chunks) == [0, 1] and chunk_3[0] in plan.chunks
    idx.check_integrity()


def test_completions_from_before_a_reset_are_ignored():
    # issue 23, item 8: a key stored (or loaded) again after a reset must not be published
    # (or unpinned) by the completion of the job that was in flight at the reset
    idx = HostBlockIndex(num_chunks=4, num_groups=1, group_of=group_of)
    old = idx.prepare_store([k(0, 1)])
    idx.prepare_store([k(0, 2)])
    idx.complete_store([k(0, 2)], epoch=old.epoch)
    old_load_epoch = idx.epoch
    idx.prepare_load([k(0, 2)])
    idx.reset()
    new = idx.prepare_store([k(0, 1), k(0, 2)])
    assert new.epoch == old.epoch + 1 and not set(new.chunks) & set(old.chunks)
    idx.complete_store([k(0, 1), k(0, 2)], epoch=old.epoch)  # the old job: ignored
    assert idx.lookup(k(0, 1)) is Lookup.PENDING and idx.counters["stale_completions"] == 2
    idx.complete_store([k(0, 1), k(0, 2)], epoch=new.epoch)
    assert idx.lookup(k(0, 1)) is Lookup.HIT
    idx.prepare_load([k(0, 2)])
    idx.complete_load([k(0, 2)], epoch=old_load_epoch)  # the old load: the new one stays pinned
    idx.complete_load([k(0, 2)], epoch=idx.epoch)  # (raises if the old one had unpinned it)
    with pytest.raises(ValueError, match="no pending load"):
        idx.complete_load([k(0, 2)], epoch=idx.epoch)
    idx.check_integrity()


def test_idle_chunks_are_free_at_once_after_a_reset():
    idx = HostBlockIndex(num_chunks=2, num_groups=1, group_of=group_of)
    idx.prepare_store([k(0, 1), k(0, 2)])
    idx.complete_store([k(0, 1)])  # idle READY: free at once; k(0, 2) still storing
    idx.reset()
    assert idx.quarantined(0) == 1
    assert idx.prepare_store([k(0, 3)]) is not None  # the idle chunk
    assert idx.prepare_store([k(0, 4)]) is None  # the other is still being written
    idx.check_integrity()


def test_groups_of_different_capacity_and_demotion():
    idx = HostBlockIndex(num_chunks=[3, 2], num_groups=2, group_of=group_of)
    assert idx.num_chunks == 5 and idx.chunks_per_group == [3, 2]
    idx.prepare_store([k(1, 1), k(1, 2)])
    assert idx.demote([k(1, 2), k(1, 9)]) == 1  # a STORING key is demoted when published
    idx.complete_store([k(1, 1), k(1, 2)])
    plan = idx.prepare_store([k(1, 3)])
    assert plan.evicted == [k(1, 2)]  # the demoted key goes first, not the older k(1, 1)
    idx.complete_store([k(1, 3)])
    idx.demote([k(1, 3)])
    assert idx.prepare_store([k(1, 4)]).evicted == [k(1, 3)]
    assert idx.counters["demoted"] == 2
    assert idx.prepare_store([k(0, n) for n in range(3)]).evicted == []  # group 0 has 3
    idx.check_integrity()


@pytest.mark.parametrize("args", [(0, 1), (1, 0), ([2, 0], 2), ([2, 2], 1)])
def test_bad_sizes(args):
    with pytest.raises(ValueError, match="must be >= 1"):
        HostBlockIndex(*args, group_of=group_of)


ops = st.lists(st.tuples(st.sampled_from(["store", "done", "fail", "load", "unload", "touch",
                                          "demote", "reset", "release"]),
                         st.lists(st.tuples(st.integers(0, 1), st.integers(0, 9)), max_size=4)),
               max_size=60)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(EVICTION_POLICIES), ops)
def test_random_sequences_keep_invariants(policy, seq):
    idx = HostBlockIndex(num_chunks=[4, 3], num_groups=2, group_of=group_of, eviction_policy=policy)
    loading: dict = {}
    for op, keys in seq:
        if op == "store":
            before = len(idx)
            plan = idx.prepare_store(keys)
            if plan is None:
                assert len(idx) == before  # a refusal changes nothing
            else:
                assert not set(plan.evicted) & set(loading)  # never evict a loading block
        elif op in ("done", "fail"):
            idx.complete_store(keys, success=op == "done")
        elif op == "load":
            ready = [key for key in dict.fromkeys(keys) if idx.lookup(key) is Lookup.HIT]
            idx.prepare_load(ready)
            for key in ready:
                loading[key] = loading.get(key, 0) + 1
        elif op == "demote":
            idx.demote(keys)
        elif op == "reset":
            idx.reset()
            loading.clear()  # vLLM drops every job's bookkeeping at a reset
        elif op == "release":
            idx.release_reset()
        elif op == "unload" and loading:
            key = next(iter(loading))
            idx.complete_load([key])
            loading[key] -= 1
            if not loading[key]:
                del loading[key]
        else:
            idx.touch(keys)
        for key in loading:
            assert idx.lookup(key) is Lookup.HIT
        idx.check_integrity()
        for g, cap in enumerate((4, 3)):
            assert 0 <= idx.used(g) <= cap


# ---- eviction policies (hicache.integrations.vllm.order) -----------------------------
def filled(policy: str, touches: dict[int, int]) -> HostBlockIndex:
    """A 5-chunk group holding keys 1..5 stored in order, then ``touches[n]`` touches of key n
    (key by key, in key order), then key 1 touched once more (the most recent)."""
    idx = HostBlockIndex(num_chunks=5, num_groups=1, group_of=group_of, eviction_policy=policy)
    keys = [k(0, n) for n in range(1, 6)]
    idx.prepare_store(keys)
    idx.complete_store(keys)
    for n, times in touches.items():
        for _ in range(times):
            idx.touch([k(0, n)])
    idx.touch([k(0, 1)])
    return idx


def eviction_order(idx: HostBlockIndex, count: int = 5) -> list[int]:
    """Store ``count`` new keys one at a time; the keys they evicted, in order."""
    out = []
    for n in range(100, 100 + count):
        plan = idx.prepare_store([k(0, n)])
        idx.complete_store(plan.keys)
        out += [key[1] for key in plan.evicted]
    idx.check_integrity()
    return out


COUNTS = {2: 3, 3: 2}  # requests (its store + touches): 2 has 4, 3 has 3, 1 has 2 (touched last), 4 and 5 1


@pytest.mark.parametrize(("policy", "expected"), [
    ("lru", [4, 5, 2, 3, 1]),  # least recently stored or touched first
    ("tiered", [4, 5, 2, 3, 1]),  # the host tier of tiered is LRU
    ("lfu", [4, 5, 100, 101, 102]),  # 1 request first, each fresh key too; 1, 3, 2 stay
    ("lfuda", [4, 5, 1, 100, 101]),  # the age reaches 1 request: fresh keys score 2, tie with 1 (older)
])
def test_each_policy_evicts_in_its_order(policy, expected):
    assert eviction_order(filled(policy, COUNTS)) == expected


def test_adaptive_starts_in_its_first_candidates_order():
    # nothing learnt yet: its first candidate (rf1: here, as lfu, a request more outweighs recency)
    assert eviction_order(filled("adaptive", COUNTS)) == eviction_order(filled(CANDIDATES[0], COUNTS))


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_a_miss_counts_and_counts_outlive_an_eviction(policy):
    """The tree's meaning of a count: every request carrying the key, hit or miss, kept
    across its eviction (the policy's ghosts)."""
    idx = HostBlockIndex(num_chunks=2, num_groups=1, group_of=group_of, eviction_policy=policy)
    a = k(0, 1)
    idx.prepare_store([a])  # a's first request stores it
    idx.complete_store([a])
    idx.touch([a])  # a second request carrying it
    for n in range(2, 6):  # newer keys of two requests each: a (as many, older) goes first in every order
        idx.touch([k(0, n)])
        idx.complete_store(idx.prepare_store([k(0, n)]).keys)
        idx.touch([k(0, n)])
        if idx.lookup(a) is Lookup.MISS:
            break
    assert idx.lookup(a) is Lookup.MISS
    idx.touch([a])  # a request carries a while it is away: a miss, counted in its ghost
    idx.prepare_store([a])  # and stores it again
    assert idx._order[0].chunks[a].hit_count == 3  # 2 before it left + the miss
    idx.check_integrity()
