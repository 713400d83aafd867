"""DeepSeek-V4 (hybrid) HiRadixCache: where matches end, snapshots on their own, all pools exact."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.config import EVICTION_POLICIES
from hicache.models import deepseek_v4, mha
from hicache.radix.check import tree_nodes
from hicache.replay.content import ContentModel, prefix_hashes, state_seed
from tests.hicache.radix.test_cache import POLICIES, assert_same, fill_random, make, seq, snapshot

PS = 256  # DeepSeek-V4 page
SNAP = 128  # one swa row: the 128-token window


def dsv4(policy: str = "write_through", device_pages: int = 8, ratio: float = 2.0, backend="torch"):
    # layers: ratio-4 (c4_kv, c4_indexer, c4 states), ratio-128 (c128_kv), plain; swa everywhere
    return make(deepseek_v4([4, 128, 0, 4]), policy, device_pages, ratio, backend=backend)


def insert(cache, tree, tokens, slots=None, snap=True):
    """Insert with fresh device slots (or ``slots``) and, if ``snap``, a fresh end snapshot."""
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    slots = kv.alloc(tokens.size) if slots is None else slots
    extra = {"swa": swa.alloc(SNAP)} if snap else None
    return tree.insert(tokens, slots, extra=extra)


def hit(tree, tokens) -> tuple[int, int]:
    m = tree.match_prefix(tokens)
    return m.device_hit_length, m.host_hit_length


def test_match_ends_at_the_deepest_boundary_with_a_snapshot():
    cache, tree = dsv4(device_pages=16)
    a, b = seq(0, 2, PS), seq(5000, 2, PS)
    ab = np.concatenate([a, b])
    query = np.concatenate([ab, seq(9000, 1, PS)])
    # 1. A with its snapshot, then A+B without one: B's history is there, its boundary is not usable
    res_a = insert(cache, tree, a)
    res_b = insert(cache, tree, ab, torch.cat([tree.device_slots(res_a.last_node),
                                               cache.device_pools["kv"].alloc(2 * PS)]), snap=False)
    assert hit(tree, query) == (2 * PS, 0)
    # 2. A+B again (its own slots), now with a snapshot at its end: the match reaches 4 pages
    insert(cache, tree, ab, tree.device_slots(res_b.last_node))
    assert hit(tree, query) == (4 * PS, 0)
    # 3. X (4 pages, snapshot) and Y sharing 2 pages with X: the branch point has no snapshot
    x = seq(20000, 4, PS)
    y = np.concatenate([x[:2 * PS], seq(30000, 2, PS)])
    res_x = insert(cache, tree, x)
    assert hit(tree, y) == (0, 0)
    res_y = insert(cache, tree, y, torch.cat([tree.device_slots(res_x.last_node)[:2 * PS],
                                              cache.device_pools["kv"].alloc(2 * PS)]))
    branch = res_y.last_node.parent  # the split: x's first 2 pages
    assert branch.end == 2 * PS and branch.state_device is None
    z = np.concatenate([x[:2 * PS], seq(40000, 2, PS)])
    assert hit(tree, z) == (0, 0)  # the branch point has history but no snapshot
    # 4. a snapshot inserted for the branch point makes it a match end
    insert(cache, tree, x[:2 * PS], tree.device_slots(branch))
    assert hit(tree, z) == (2 * PS, 0)
    tree.wait()
    tree.check_integrity()


def test_snapshot_only_eviction_keeps_the_history_chain(gen):
    cache, tree = dsv4()
    fill_random(cache, gen)
    a = seq(0, 2, PS)
    ab = np.concatenate([a, seq(5000, 2, PS)])
    res_a = insert(cache, tree, a)
    res_ab = insert(cache, tree, ab, torch.cat([tree.device_slots(res_a.last_node),
                                                cache.device_pools["kv"].alloc(2 * PS)]))
    tree.wait()  # write-through: history and snapshots are on host too
    node_b = res_ab.last_node
    expected_snap = snapshot(cache, {"swa": node_b.state_device["swa"]})
    # 1. drop both device snapshots: the history stays on the device
    assert tree.evict_states(2 * SNAP) == 2 * SNAP
    assert node_b.device is not None and node_b.state_device is None
    # 2. the match still ends at B (its snapshot is on host): only the snapshot must move
    m = tree.match_prefix(ab)
    assert (m.device_hit_length, m.host_hit_length, m.last_host_node) == (0, 4 * PS, node_b)
    fill_random(cache, gen)
    dst = tree.load_back(node_b)
    assert dst["kv"].numel() == 0 and dst["swa"].numel() == SNAP
    tree.wait()
    assert hit(tree, ab) == (4 * PS, 0)
    assert_same(snapshot(cache, {"swa": node_b.state_device["swa"]}), expected_snap)
    # 3. drop every snapshot on both tiers: history on device and host, but no match end
    tree.evict_states(2 * SNAP)
    assert tree.evict_host_states(2 * SNAP) == 2 * SNAP
    assert hit(tree, ab) == (0, 0)
    assert node_b.device is not None and node_b.host is not None and not node_b.dead
    # 4. a fresh snapshot at B's boundary makes the whole chain usable again
    insert(cache, tree, ab, tree.device_slots(node_b))
    assert hit(tree, ab) == (4 * PS, 0)
    tree.wait()
    tree.check_integrity()


@pytest.mark.parametrize("policy", POLICIES)
def test_round_trip_restores_every_pool(policy, gen):
    cache, tree = dsv4(policy)
    fill_random(cache, gen)
    a = seq(0, 3, PS)
    kv_slots, swa_slots = cache.device_pools["kv"].alloc(3 * PS), cache.device_pools["swa"].alloc(SNAP)
    expected = {**snapshot(cache, {"kv": kv_slots}), **snapshot(cache, {"swa": swa_slots})}
    assert set(expected) == {"c4_kv", "c4_indexer", "c128_kv", "swa", "c4_state", "c4_indexer_state"}
    # 1. insert (twice: selective backs up at the second), then evict history + snapshot to host
    tree.insert(a, kv_slots, extra={"swa": swa_slots})
    tree.insert(a, kv_slots, extra={"swa": swa_slots})
    tree.wait()
    assert tree.evict(3 * PS) == 3 * PS
    node = tree.match_prefix(a).last_host_node
    assert node.device is None and node.state_device is None and node.state_host is not None
    # 2. the device forgets everything; the host hit covers 3 pages
    fill_random(cache, gen)
    assert hit(tree, a) == (0, 3 * PS)
    # 3. load back history and snapshot
    tree.inc_lock_ref(node)
    assert tree.load_back(node) is not None
    cache.controller.start_loading()
    tree.poll()
    tree.dec_lock_ref(node)
    # 4. every pool holds what was inserted
    m = tree.match_prefix(a)
    assert (m.device_hit_length, m.host_hit_length) == (3 * PS, 0)
    got = {**snapshot(cache, {"kv": m.device_slots}), **snapshot(cache, {"swa": node.state_device["swa"]})}
    assert_same(got, expected)
    tree.check_integrity()


def test_extra_is_validated():
    cache, tree = dsv4()
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    a, slots = seq(0, 1, PS), kv.alloc(PS)
    with pytest.raises(ValueError, match="snapshot pools"):
        tree.insert(a, slots, extra={"c4_state": torch.arange(SNAP)})
    with pytest.raises(ValueError, match="a snapshot is 128 slots"):
        tree.insert(a, slots, extra={"swa": torch.arange(2 * SNAP)})
    # snapshot slots the swa allocator never handed out, or float ones: refused, nothing changes
    with pytest.raises(ValueError, match=r"extra\['swa'\]: slots starting at \[0\] are not allocated"):
        tree.insert(a, slots, extra={"swa": torch.arange(SNAP)})
    snap = swa.alloc(SNAP)
    with pytest.raises(TypeError, match=r"extra\['swa'\]: need integer slots"):
        tree.insert(a, slots, extra={"swa": snap.float()})
    assert not tree.root.children and kv.available() == kv.num_tokens - PS
    _, plain = make(mha(1, 1, 8, page_size=4))
    with pytest.raises(ValueError, match="snapshot pools"):
        plain.insert(seq(0, 1, 4), plain.device_pool.alloc(4), extra={"swa": torch.arange(4)})
    kv.free(slots)
    swa.free(snap)  # refused calls took nothing: the caller still owns its slots
    tree.check_integrity()


# ---- property test -------------------------------------------------------------------
def _tokens(pages: list[int]) -> np.ndarray:
    out = [np.full(PS, 1 + p * 7 + i * 31, dtype=np.int64) + np.arange(PS) for i, p in enumerate(pages)]
    return np.concatenate(out) if out else np.empty(0, np.int64)


def _alloc(pool, n, evict):
    got = pool.alloc(n)
    if got is None:
        evict(n - pool.available())
        got = pool.alloc(n)
    return got


def serve(cache, tree, content, tokens) -> None:
    """One request with content checks of every device page and the snapshot it uses."""
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    hashes = prefix_hashes(tokens, PS) if tokens.size else []
    m = tree.match_prefix(tokens)
    tree.inc_lock_ref(m.last_host_node)
    end = m.last_device_node
    if m.last_host_node is not end and tree.load_back(m.last_host_node) is not None:
        tree.wait()
        end = tree.match_prefix(tokens).last_device_node
    prefix = tree.device_slots(end)
    content.verify("kv", prefix, hashes[:end.end // PS], "prefix")
    if end.state_device:
        content.verify("swa", end.state_device["swa"], [state_seed(hashes[end.end // PS - 1])], "snapshot")
    new = _alloc(kv, tokens.size - prefix.numel(), tree.evict) if tokens.size > prefix.numel() else None
    if new is not None:
        content.fill("kv", new, hashes[prefix.numel() // PS:])
        snap = _alloc(swa, SNAP, tree.evict_states)
        if snap is not None:
            content.fill("swa", snap, [state_seed(hashes[-1])])
        tree.insert(tokens, torch.cat([prefix, new]), extra=None if snap is None else {"swa": snap})
    tree.dec_lock_ref(m.last_host_node)
    tree.wait()


def reuse_snapshot(cache, tree, i: int) -> None:
    """Insert new tokens with the device snapshot some node holds: refused, nothing taken."""
    held = [n for n in tree_nodes(tree) if n.state_device is not None]
    if not held:
        return
    kv = cache.device_pools["kv"]
    slots = kv.alloc(PS)
    if slots is None:
        return
    with pytest.raises(ValueError, match=r"extra\['swa'\].*held"):
        tree.insert(_tokens([9]), slots, extra=held[i % len(held)].state_device)
    kv.free(slots)


OPS = st.one_of(
    st.tuples(st.just("serve"), st.lists(st.integers(0, 2), min_size=1, max_size=4)),
    st.tuples(st.just("reuse_snapshot"), st.integers(0, 3)),
    st.tuples(st.just("evict"), st.integers(0, 4)),
    st.tuples(st.just("evict_host"), st.integers(0, 4)),
    st.tuples(st.just("evict_states"), st.integers(0, 3)),
    st.tuples(st.just("evict_host_states"), st.integers(0, 3)),
)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), eviction=st.sampled_from(EVICTION_POLICIES),
       ops=st.lists(OPS, min_size=1, max_size=12))
def test_random_hybrid_operations_keep_every_invariant(policy, eviction, ops):
    cache, tree = make(deepseek_v4([4, 0]), policy, device_pages=4, ratio=2.0, eviction=eviction)
    content = ContentModel(cache)
    for op, arg in ops:
        if op == "serve":
            serve(cache, tree, content, _tokens(arg))
        elif op == "reuse_snapshot":
            reuse_snapshot(cache, tree, arg)
        elif op in ("evict", "evict_host"):
            getattr(tree, op)(arg * PS)
        else:
            getattr(tree, op)(arg * SNAP)
        tree.check_integrity()
