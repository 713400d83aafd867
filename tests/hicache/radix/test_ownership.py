"""What the tree owns stays the tree's: snapshot slots are held once, slot tensors handed
to a caller cannot rewrite the tree, and token ids that do not fit int64 are refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.models import mha
from hicache.radix.node import EMPTY_SLOTS
from hicache.radix.read import child_nodes
from hicache.storage import page_hashes
from tests.hicache.radix.test_cache import make, seq
from tests.hicache.radix.test_hybrid import PS as DS_PS
from tests.hicache.radix.test_hybrid import SNAP, dsv4

PS = 4


def tree_state(tree) -> list:
    """Every node's key, tiers (history and snapshots), lock and transfer, and every pool's
    free slots on both tiers: what a refused call must leave alone."""
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(child_nodes(node))
        tiers = [None if t is None else t.tolist() for t in (node.device, node.host)]
        snaps = [None if s is None else {k: v.tolist() for k, v in s.items()}
                 for s in (node.state_device, node.state_host)]
        out.append(repr((node.end, node.tokens.tobytes(), tiers, snaps, node.lock_ref, node.pending)))
    cache, own = tree.cache, [p.name for p in tree.cache.stack.own_indexed]
    pools = [cache.device_pools[n].available() for n in own] + [cache.host_group.pools[n].available() for n in own]
    return sorted(out) + pools


# ---- item 2: snapshot slots are held once -------------------------------------------------
def test_snapshot_slots_another_node_holds_are_refused():
    cache, tree = dsv4(device_pages=16)
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    a, b = seq(0, 1, DS_PS), seq(5000, 1, DS_PS)
    # 1. A with its snapshot S
    s = swa.alloc(SNAP)
    node_a = tree.insert(a, kv.alloc(DS_PS), extra={"swa": s}).last_node
    tree.wait()
    b_slots = kv.alloc(DS_PS)
    before = tree_state(tree)
    # 2. B with A's snapshot slots: refused naming extra['swa'], nothing changed (B's own
    #    slots stay the caller's)
    with pytest.raises(ValueError, match=r"extra\['swa'\].*held"):
        tree.insert(b, b_slots, extra={"swa": s.clone()})
    assert tree_state(tree) == before
    # 3. A again with its own snapshot at its own boundary: accepted and kept, never freed
    tree.insert(a, tree.device_slots(node_a), extra={"swa": s.clone()})
    assert torch.equal(node_a.state_device["swa"], s)
    assert tree_state(tree) == before
    # 4. once A's device snapshot is evicted its slots are free: B may take them
    assert tree.evict_states(SNAP) == SNAP
    again = swa.alloc(SNAP)
    tree.insert(b, b_slots, extra={"swa": again})
    assert tree.match_prefix(b).device_hit_length == DS_PS
    tree.wait()
    tree.check_integrity()


def test_snapshot_slots_a_load_in_flight_holds_are_refused():
    cache, tree = dsv4(device_pages=16)
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    a, b = seq(0, 1, DS_PS), seq(5000, 1, DS_PS)
    # 1. A (history + snapshot) backed up, then evicted from the device: a host hit
    node = tree.insert(a, kv.alloc(DS_PS), extra={"swa": swa.alloc(SNAP)}).last_node
    tree.wait()
    assert tree.evict(DS_PS) == DS_PS
    # 2. its load is queued: the destination snapshot slots belong to the load now
    tree.inc_lock_ref(node)
    dst = tree.load_back(node)
    b_slots = kv.alloc(DS_PS)
    before = tree_state(tree)
    with pytest.raises(ValueError, match=r"extra\['swa'\].*held"):
        tree.insert(b, b_slots, extra={"swa": dst["swa"]})
    assert tree_state(tree) == before
    # 3. the load lands: A is a device hit with the snapshot the load brought
    tree.wait()
    tree.dec_lock_ref(node)
    assert tree.match_prefix(a).device_hit_length == DS_PS
    assert torch.equal(node.state_device["swa"], dst["swa"])
    kv.free(b_slots)  # (still the caller's: the refused insert took nothing)
    tree.check_integrity()


def test_snapshot_slots_must_be_allocated_whole_rows():
    cache, tree = dsv4(device_pages=16)
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    a, a_slots, s = seq(0, 1, DS_PS), kv.alloc(DS_PS), swa.alloc(SNAP)
    before = tree_state(tree)
    free_row = torch.arange(SNAP, dtype=torch.int64) + 5 * SNAP  # never handed out
    with pytest.raises(ValueError, match=r"extra\['swa'\].*not allocated"):
        tree.insert(a, a_slots, extra={"swa": free_row})
    with pytest.raises(ValueError, match=r"extra\['swa'\]"):
        tree.insert(a, a_slots, extra={"swa": s.flip(0)})  # not an aligned run
    assert tree_state(tree) == before
    kv.free(a_slots)
    swa.free(s)


# ---- item 3: what the tree hands out is the caller's --------------------------------------
def test_slot_tensors_handed_out_cannot_rewrite_the_tree():
    cache, tree = make(mha(1, 1, 8, page_size=PS), "write_through", device_pages=16)
    kv = cache.device_pools["kv"]
    a = seq(0, 2, PS)
    ab = np.concatenate([a, seq(100, 2, PS)])
    node_a = tree.insert(a, kv.alloc(2 * PS)).last_node
    tree.wait()
    node_b = tree.insert(ab, torch.cat([tree.device_slots(node_a), kv.alloc(2 * PS)])).last_node
    tree.wait()
    before = tree_state(tree)
    # every tensor a public call returns, edited in place: the tree does not change
    handed = [tree.match_prefix(a).device_slots, tree.match_prefix(ab).device_slots,
              tree.device_slots(node_a), tree.device_slots(node_b), node_a.device, node_a.host,
              node_b.device, node_b.host]
    for t in handed:
        t.fill_(3)
    assert tree_state(tree) == before
    # an empty result is not the tree's shared empty tensor either
    assert tree.match_prefix(seq(900, 1, PS)).device_slots is not EMPTY_SLOTS
    assert tree.device_slots(tree.root) is not EMPTY_SLOTS
    # 2. a match edited in place through torch, then inserted: checked like any caller's
    #    slots (the edit bumped the tensor's version: the match's hint is dropped)
    m = tree.match_prefix(ab)
    m.device_slots[:PS] = kv.alloc(PS)
    tree.insert(ab, m.device_slots)  # the caller's differing page is a provable duplicate: freed
    assert tree_state(tree) == before
    # 3. edited through a numpy view (torch does not see it): the tree's slots stay, the
    #    caller's page is not freed, it stays the caller's
    m = tree.match_prefix(ab)
    page = kv.alloc(PS)
    m.device_slots.numpy()[:PS] = page.numpy()
    tree.insert(ab, m.device_slots)
    kv.free(page)  # (still allocated: the tree did not free it)
    assert tree_state(tree) == before
    tree.check_integrity()


def test_load_back_and_snapshot_views_cannot_rewrite_the_tree():
    cache, tree = dsv4(device_pages=16)
    kv, swa = cache.device_pools["kv"], cache.device_pools["swa"]
    a = seq(0, 1, DS_PS)
    node = tree.insert(a, kv.alloc(DS_PS), extra={"swa": swa.alloc(SNAP)}).last_node
    tree.wait()
    dev_snap, host_snap = tree.snapshot_slots(node)
    dev_snap["swa"].fill_(1)
    host_snap["swa"].fill_(1)
    node.state_device["swa"].fill_(1)
    node.state_host["swa"].fill_(1)
    tree.check_integrity()
    # the load's destination slots, edited before the ack publishes them
    assert tree.evict(DS_PS) == DS_PS
    tree.inc_lock_ref(node)
    got = tree.load_back(node)
    expect = {k: v.clone() for k, v in got.items()}
    for t in got.values():
        t.fill_(2)
    tree.wait()
    tree.dec_lock_ref(node)
    assert torch.equal(node.device, expect["kv"]) and torch.equal(node.state_device["swa"], expect["swa"])
    tree.check_integrity()


# ---- item 17: token ids must fit int64 ------------------------------------------------------
BEYOND = [
    pytest.param(np.full(PS, 2**63, np.uint64), id="uint64-array"),
    pytest.param(torch.full((PS,), 2**63, dtype=torch.uint64), id="uint64-tensor"),
    pytest.param([2**63] * PS, id="list-2^63"),
    pytest.param([2**64 - 1] * PS, id="list-2^64-1"),
    pytest.param([2**64] * PS, id="list-2^64"),
    pytest.param([-1, 2**63, 5, 6], id="list-mixed"),
]


@pytest.mark.parametrize("ids", BEYOND)
def test_token_ids_beyond_int64_are_refused_everywhere(ids):
    cache, tree = make(mha(1, 1, 8, page_size=PS))
    kv = cache.device_pools["kv"]
    slots = kv.alloc(PS)
    before = tree_state(tree)
    for call in (tree.match_prefix, lambda t: tree.insert(t, slots), tree.prefetch):
        with pytest.raises(ValueError, match="token_ids.*int64"):
            call(ids)
    with pytest.raises(ValueError, match="token_ids.*int64"):
        page_hashes(ids, PS)
    assert tree_state(tree) == before
    kv.free(slots)


def test_negative_ids_are_keys_of_their_own():
    # negative ids are allowed (documented): they are int64 keys and hash as such; the
    # unsigned id with the same bits is refused rather than aliased onto them
    cache, tree = make(mha(1, 1, 8, page_size=PS))
    neg = np.full(PS, -1, np.int64)
    tree.insert(neg, cache.device_pools["kv"].alloc(PS))
    assert tree.match_prefix(neg).device_hit_length == PS
    with pytest.raises(ValueError, match="token_ids"):
        tree.match_prefix(np.full(PS, 2**64 - 1, np.uint64))
    assert page_hashes(neg, PS) != page_hashes(np.full(PS, 1, np.int64), PS)
    with pytest.raises(ValueError, match="token_ids"):
        page_hashes(np.full(PS, 2**64 - 1, np.uint64), PS)
    tree.wait()
    tree.check_integrity()
