"""Narrated HiRadixCache scenarios (per write policy) and a property test of random operations."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache import HiCacheConfig, build
from hicache.config import EVICTION_POLICIES
from hicache.models import mha, mla
from hicache.radix import HiRadixCache
from hicache.radix.read import child_nodes
from hicache.replay.content import ContentModel, prefix_hashes
from host_pools.memory import HostBudget
from tests.hicache.controller.rollback import arm_later_group, landed_before
from transfer_kernels import FaultyBackend

BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
POLICIES = ["write_through", "write_through_selective", "write_back"]
STACKS = {
    "mha_int8": lambda: mha(2, 2, 16, kv_quant="int8", page_size=4),
    "mla": lambda: mla(2, kv_lora_rank=128, rope_dim=64, page_size=4),
}


def make(stack, policy: str = "write_through", device_pages: int = 8, ratio: float = 2.0,
         layout: str = "page_first", backend="torch", eviction: str = "lru"):
    config = HiCacheConfig(hicache_ratio=ratio, write_policy=policy, mem_layout=layout, io_backend="torch",
                           swa_full_tokens_ratio=0.5, eviction_policy=eviction)
    cache = build(stack, device_pages * stack.page_size, config, device="cpu", budget=BIG, backend=backend)
    return cache, HiRadixCache(cache)


def seq(first: int, pages: int, page_size: int) -> np.ndarray:
    """``pages`` pages of distinct token ids starting at ``first`` (never zeros)."""
    return np.arange(first, first + pages * page_size, dtype=np.int64) + 1000


def fill_random(cache, gen) -> None:
    for pool in cache.device_pools.values():
        for views in pool.row_views():
            for v in views:
                v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=gen))


def snapshot(cache, own_slots) -> dict:
    """Bytes of the rows behind ``own_slots`` in every data pool, per layer and buffer."""
    rows = cache.stack.derive_rows(own_slots)
    return {name: [[v.index_select(0, r).clone() for v in views]
                   for views in cache.device_pools[name].row_views()] for name, r in rows.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for la, lb in zip(a[name], b[name]):
            for x, y in zip(la, lb):
                assert torch.equal(x, y), name


def backed_up(tree, tokens) -> bool:
    path, _ = tree._index.walk(tokens)
    return bool(path) and all(n.host is not None for n in path)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("stack_name", list(STACKS))
@pytest.mark.parametrize("policy", POLICIES)
def test_evict_to_host_then_load_back_is_byte_exact(policy, stack_name, layout, gen):
    cache, tree = make(STACKS[stack_name](), policy, layout=layout)
    ps, kv = cache.stack.page_size, cache.device_pools["kv"]
    fill_random(cache, gen)
    tokens = seq(0, 3, ps)
    slots = kv.alloc(3 * ps)
    expected = snapshot(cache, {"kv": slots})
    # 1. insert: the tree owns the slots; only write_through backs up at the first insert
    tree.insert(tokens, slots)
    tree.wait()
    assert backed_up(tree, tokens) == (policy == "write_through")
    # 2. selective: the second insert reaching the node backs it up
    tree.insert(tokens, slots)
    tree.wait()
    assert backed_up(tree, tokens) == (policy != "write_back")
    # 3. evict everything from the device (write_back backs up now): the node is host-only
    assert tree.evict(3 * ps) == 3 * ps
    assert kv.available() == kv.num_tokens
    node = tree.match_prefix(tokens).last_host_node
    assert node.device is None and node.host is not None
    # 4. the device forgets: its rows are reused for other data
    fill_random(cache, gen)
    # 5. match: no device hit, three pages on host
    m = tree.match_prefix(tokens)
    assert (m.device_hit_length, m.host_hit_length, m.last_host_node) == (0, 3 * ps, node)
    # 6. load back under a lock; nothing is published before the ack
    tree.inc_lock_ref(node)
    dst = tree.load_back(node)
    assert dst["kv"].numel() == 3 * ps and node.device is None
    cache.controller.start_loading()
    tree.poll()
    tree.dec_lock_ref(node)
    # 7. a device hit again, byte for byte what was inserted, in every pool, layer and buffer
    m = tree.match_prefix(tokens)
    assert (m.device_hit_length, m.host_hit_length) == (3 * ps, 0)
    assert_same(snapshot(cache, {"kv": m.device_slots}), expected)
    tree.check_integrity()


def test_split_shares_pages_and_frees_duplicate_slots():
    cache, tree = make(mha(1, 1, 8, page_size=4))
    ps, kv = 4, cache.device_pools["kv"]
    a = seq(0, 4, ps)
    b = np.concatenate([a[:2 * ps], seq(500, 2, ps)])
    # 1. insert A (4 pages)
    tree.insert(a, kv.alloc(4 * ps))
    # 2. B shares A's first 2 pages; the caller computed them again into fresh slots
    tree.insert(b, kv.alloc(4 * ps))
    # 3. the shared pages keep A's slots; B's copies went back to the allocator (6 pages held)
    assert kv.available() == kv.num_tokens - 6 * ps
    assert [c.num_tokens for c in child_nodes(tree.root)] == [2 * ps]
    # 4. a query sharing 3 pages with A splits A's tail: the match ends on a node boundary
    q = np.concatenate([a[:3 * ps], seq(900, 1, ps)])
    m = tree.match_prefix(q)
    assert m.device_hit_length == 3 * ps and m.last_device_node.end == 3 * ps
    # 5. a partial trailing page is ignored by match and refused by insert
    assert tree.match_prefix(a[:ps + 2]).device_hit_length == ps
    with pytest.raises(ValueError, match="multiple of page_size"):
        tree.insert(a[:ps + 2], torch.arange(ps + 2))
    with pytest.raises(ValueError, match="one per token"):
        tree.insert(a, torch.arange(ps))
    tree.wait()
    tree.check_integrity()


@pytest.mark.parametrize("eviction", EVICTION_POLICIES)
def test_host_eviction_never_takes_a_locked_node(eviction):
    cache, tree = make(mha(1, 1, 8, page_size=4), ratio=1.0, eviction=eviction)
    ps, kv = 4, cache.device_pools["kv"]
    host = cache.host_group.pools["kv"]
    a, b, c = seq(0, 4, ps), seq(100, 4, ps), seq(200, 4, ps)
    # 1. A and B fill the device; write-through fills the host (8 pages) with their copies
    tree.insert(a, kv.alloc(4 * ps))
    tree.insert(b, kv.alloc(4 * ps))
    tree.wait()
    assert host.available() == 0
    # 2. both leave the device: host-only now
    tree.evict(8 * ps)
    node_a = tree.match_prefix(a).last_host_node
    # 3. a request locks A (it is about to load it back)
    tree.inc_lock_ref(node_a)
    # 4. C arrives; its backup needs host room: only B may go
    tree.insert(c, kv.alloc(4 * ps))
    tree.wait()
    assert tree.match_prefix(a).host_hit_length == 4 * ps
    assert tree.match_prefix(b).host_hit_length == 0
    assert backed_up(tree, c)
    # 5. explicit host eviction under pressure still skips the locked node
    assert tree.evict_host(8 * ps) == 0
    assert tree.match_prefix(a).host_hit_length == 4 * ps
    # 6. unlocked, A is evictable again
    tree.dec_lock_ref(node_a)
    assert tree.evict_host(4 * ps) == 4 * ps
    assert tree.match_prefix(a).host_hit_length == 0
    tree.check_integrity()


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_failed_backup_leaves_node_device_only(policy):
    cache, tree = make(mha(1, 1, 8, page_size=4), policy, backend=FaultyBackend("torch", fail_on_launch=1))
    ps, kv = 4, cache.device_pools["kv"]
    host = cache.host_group.pools["kv"]
    a = seq(0, 2, ps)
    slots = kv.alloc(2 * ps)
    # 1. inserts queue a backup (selective: at the second insert)
    tree.insert(a, slots)
    tree.insert(a, slots)
    assert tree.pending_ops() == 1
    # 2. its launch fails: the controller rolls back, the ack says so
    cache.controller.start_writing()
    acks = tree.poll()
    assert [a.success for a in acks] == [False]
    # 3. the node is exactly as before: device-only, nothing held on host, not frozen
    node = tree.match_prefix(a).last_device_node
    assert node.device is not None and node.host is None and node.pending is None
    assert host.available() == host.num_tokens
    tree.check_integrity()
    # 4. the next insert reaching it retries, and succeeds
    tree.insert(a, slots)
    tree.wait()
    assert node.host is not None
    tree.check_integrity()


def test_failed_write_back_drops_the_node():
    cache, tree = make(mha(1, 1, 8, page_size=4), "write_back", backend=FaultyBackend("torch", fail_on_launch=1))
    ps, kv = 4, cache.device_pools["kv"]
    a = seq(0, 2, ps)
    tree.insert(a, kv.alloc(2 * ps))
    # 1. eviction backs the node up first; the launch fails, so the node is dropped
    assert tree.evict(2 * ps) == 2 * ps
    m = tree.match_prefix(a)
    assert (m.device_hit_length, m.host_hit_length) == (0, 0) and not tree.root.children
    tree.check_integrity()


def test_failed_load_leaves_node_host_only(gen):
    faulty = FaultyBackend("torch", fail_on_launch=10 ** 9)
    cache, tree = make(mha(2, 1, 8, page_size=4), backend=faulty)
    ps, kv = 4, cache.device_pools["kv"]
    fill_random(cache, gen)
    a = seq(0, 2, ps)
    slots = kv.alloc(2 * ps)
    expected = snapshot(cache, {"kv": slots})
    tree.insert(a, slots)
    tree.wait()
    tree.evict(2 * ps)
    node = tree.match_prefix(a).last_host_node
    # 1. the load fails mid-way: one launch group per layer (2 groups), the second raises
    #    after the first copied layer 0. Device slots freed, the node stays host-only,
    #    unlocked; before its ack is polled the tree is consistent too
    cache.controller.load_groups.min_bytes = 0
    _, first = arm_later_group(cache.controller, faulty, node.host)
    dev = tree.load_back(node)
    assert dev is not None
    cache.controller.start_loading()
    assert landed_before(cache, dev, expected, first)  # group 0 did run
    tree.check_integrity()
    tree.wait()
    assert node.device is None and node.lock_ref == 0 and kv.available() == kv.num_tokens
    tree.check_integrity()
    # 2. a second load works and is byte exact
    fill_random(cache, gen)
    tree.load_back(node)
    tree.wait()
    assert_same(snapshot(cache, {"kv": tree.match_prefix(a).device_slots}), expected)
    tree.check_integrity()


def test_backups_stay_a_prefix_when_a_parent_backup_fails():
    cache, tree = make(mha(1, 1, 8, page_size=4), backend=FaultyBackend("torch", fail_on_launch=1))
    ps, kv = 4, cache.device_pools["kv"]
    a = seq(0, 2, ps)
    ab = np.concatenate([a, seq(300, 2, ps)])
    slots = kv.alloc(2 * ps)
    # 1. A's backup is launched (and fails), but its ack is not polled yet: the controller
    #    freed its host slots, the tree still lists it in flight; that is no corruption
    tree.insert(a, slots)
    cache.controller.start_writing()
    tree.check_integrity()
    # 2. A+B: B's backup may follow A's in-flight one; it launches and succeeds (and may
    #    reuse the host slots A's rollback freed)
    tree.insert(ab, torch.cat([slots, kv.alloc(2 * ps)]))
    cache.controller.start_writing()
    tree.check_integrity()
    # 3. acks: A failed, B succeeded -> B's host copy is discarded (no orphan backups)
    assert [x.success for x in tree.poll()] == [False, True]
    assert tree.counters["backups_discarded"] == 1
    assert not backed_up(tree, a) and not backed_up(tree, ab)
    tree.check_integrity()


# ---- property test -------------------------------------------------------------------
PAGE = 2
ALPHABET = 4  # few distinct pages -> lots of shared prefixes


def _tokens(pages: list[int], page_size: int = PAGE) -> np.ndarray:
    """Token ids of a page sequence; a page's ids depend on its position too (a real prefix)."""
    out = [np.full(page_size, 1 + p * 7 + i * 31, dtype=np.int64) + np.arange(page_size)
           for i, p in enumerate(pages)]
    return np.concatenate(out) if out else np.empty(0, np.int64)


def serve(cache, tree, content, tokens: np.ndarray) -> None:
    """One request: match, lock, load back, check bytes, compute the rest, insert, unlock."""
    ps, kv = cache.stack.page_size, cache.device_pools["kv"]
    hashes = prefix_hashes(tokens, ps) if tokens.size else []
    m = tree.match_prefix(tokens)
    tree.inc_lock_ref(m.last_host_node)
    prefix = m.device_slots
    if m.host_hit_length and tree.load_back(m.last_host_node) is not None:
        tree.wait()
        again = tree.match_prefix(tokens)
        if again.last_device_node is m.last_host_node:
            prefix = again.device_slots
    content.verify("kv", prefix, hashes[:prefix.numel() // ps], "prefix")
    need = tokens.size - prefix.numel()
    new = kv.alloc(need)
    if new is None:
        tree.evict(need - kv.available())
        new = kv.alloc(need)
    if new is not None:
        content.fill("kv", new, hashes[prefix.numel() // ps:])
        tree.insert(tokens, torch.cat([prefix, new]))
    tree.dec_lock_ref(m.last_host_node)
    tree.wait()


OPS = st.one_of(
    st.tuples(st.just("serve"), st.lists(st.integers(0, ALPHABET - 1), min_size=0, max_size=6)),
    st.tuples(st.just("evict"), st.integers(0, 8)),
    st.tuples(st.just("evict_host"), st.integers(0, 8)),
    st.tuples(st.just("lock_load"), st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=6)),
    st.tuples(st.just("reinsert"), st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=6)),
)


def reinsert_reversed(tree, tokens: np.ndarray) -> None:
    """Insert the device hit of ``tokens`` again with the tree's own pages in reverse order."""
    m = tree.match_prefix(tokens)
    if m.device_hit_length:
        pages = m.device_slots.view(-1, PAGE).flip(0).reshape(-1)
        tree.insert(tokens[:m.device_hit_length], pages)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), eviction=st.sampled_from(EVICTION_POLICIES),
       ops=st.lists(OPS, min_size=1, max_size=14))
def test_random_operations_keep_every_invariant(policy, eviction, ops):
    cache, tree = make(mha(1, 1, 2, page_size=PAGE), policy, device_pages=6, ratio=2.0, eviction=eviction)
    content = ContentModel(cache)
    for op, arg in ops:
        if op == "serve":
            serve(cache, tree, content, _tokens(arg))
        elif op == "evict":
            tree.evict(arg * PAGE)
        elif op == "evict_host":
            tree.evict_host(arg * PAGE)
        elif op == "reinsert":  # must free nothing the tree serves: later serves check the bytes
            reinsert_reversed(tree, _tokens(arg))
        else:  # a request that locks and loads, then gives up before inserting
            m = tree.match_prefix(_tokens(arg))
            tree.inc_lock_ref(m.last_host_node)
            if m.host_hit_length:
                tree.load_back(m.last_host_node)
            tree.wait()
            tree.dec_lock_ref(m.last_host_node)
        tree.check_integrity()


def test_public_names_of_the_tree_still_resolve():
    import hicache
    import hicache.radix_cache as alias
    assert alias.HiRadixCache is HiRadixCache is hicache.HiRadixCache


def test_the_tree_without_a_store_never_loads_the_storage_layer():
    # the vLLM environment has no xxhash: importing hicache (and the tree) must not need it
    import subprocess
    import sys
    code = ("import sys, hicache, hicache.radix; "
            "assert not [m for m in sys.modules if m.startswith('hicache.storage') or m == 'xxhash']")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_backup_acked_after_its_node_split_reaches_both_halves():
    # A backup in flight on one node; an insert of a shorter branch splits that node before
    # the ack: the ack's chain is then the two halves (both still pending on the op), and
    # the host slots are dealt top-down, page for page. Without the split the chain is the
    # node alone (the common case the ack publishes without walking up).
    cache, tree = make(mha(1, 1, 8, page_size=4), device_pages=16)
    ps, kv = 4, cache.device_pools["kv"]
    a = seq(0, 3, ps)
    tree.insert(a, kv.alloc(3 * ps))
    (op,) = tree._transfers.pending
    branch = np.concatenate([a[:ps], seq(500, 1, ps)])  # shares a's first page only
    m = tree.match_prefix(branch)
    tree.insert(branch, torch.cat((m.device_slots, kv.alloc(ps))))
    upper = tree.match_prefix(a[:ps]).last_device_node
    lower = tree.match_prefix(a).last_device_node
    assert upper is not lower and upper.pending == op and lower.pending == op
    host = tree._transfers.pending[op].dst["kv"].clone()
    cache.controller.start_writing()
    assert [ack.success for ack in tree.poll() if ack.op_id == op] == [True]
    assert upper.pending is None and lower.pending is None
    assert torch.equal(upper.host, host[:ps]) and torch.equal(lower.host, host[ps:])
    tree.wait()
    single = tree.match_prefix(branch).last_device_node
    assert single.host is not None and single.pending is None
    tree.check_integrity()
