"""HiRadixCache over a linear-attention hybrid's stack (full-attention KV pages, recurrent
conv and state rows): a match ends where a snapshot is, a snapshot leaves and comes back
with its history as one node, every pool byte-exact."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache import HiCacheConfig, build
from hicache.models import HybridGeometry, linear_hybrid
from hicache.radix import HiRadixCache
from tests.hicache.radix.test_cache import BIG, POLICIES, assert_same, fill_random, seq, snapshot

PS = 4
GEOMETRY = HybridGeometry(("linear", "full", "linear"), 1, 8, 16, 4, (2, 4, 4), page_size=PS)


def make(policy: str = "write_through"):
    config = HiCacheConfig(hicache_ratio=2.0, write_policy=policy, io_backend="torch", state_interval=PS)
    cache = build(linear_hybrid(GEOMETRY, "tiny-hybrid"), 8 * PS, config, device="cpu", budget=BIG)
    return cache, HiRadixCache(cache)


def insert(cache, tree, tokens, slots=None, snap=True):
    kv = cache.device_pools["kv"]
    extra = {"conv": cache.device_pools["conv"].alloc(1)} if snap else None
    return tree.insert(tokens, kv.alloc(tokens.size) if slots is None else slots, extra=extra)


def test_a_snapshot_is_one_row_and_the_match_ends_on_one():
    cache, tree = make()
    assert tree.state_sizes == {"conv": 1}
    a = seq(0, 2, PS)
    ab = np.concatenate([a, seq(500, 2, PS)])
    res_a = insert(cache, tree, a)
    insert(cache, tree, ab, torch.cat([tree.device_slots(res_a.last_node), cache.device_pools["kv"].alloc(2 * PS)]),
           snap=False)
    assert tree.match_prefix(ab).device_hit_length == 2 * PS  # B's boundary has no snapshot
    tree.wait()
    tree.check_integrity()


@pytest.mark.parametrize("policy", POLICIES)
def test_history_and_snapshot_leave_and_come_back_as_one_node(policy, gen):
    cache, tree = make(policy)
    fill_random(cache, gen)
    a = seq(0, 3, PS)
    kv_slots, conv_slot = cache.device_pools["kv"].alloc(3 * PS), cache.device_pools["conv"].alloc(1)
    expected = {**snapshot(cache, {"kv": kv_slots}), **snapshot(cache, {"conv": conv_slot})}
    assert set(expected) == {"attn_kv", "conv", "recurrent"}
    tree.insert(a, kv_slots, extra={"conv": conv_slot})
    tree.insert(a, kv_slots, extra={"conv": conv_slot})  # selective backs up at the second
    tree.wait()
    assert tree.evict(3 * PS) == 3 * PS
    node = tree.match_prefix(a).last_host_node
    assert node.device is None and node.state_device is None and node.state_host is not None
    fill_random(cache, gen)  # the device forgets everything
    tree.inc_lock_ref(node)
    assert tree.load_back(node) is not None
    cache.controller.start_loading()
    tree.poll()
    tree.dec_lock_ref(node)
    m = tree.match_prefix(a)
    assert (m.device_hit_length, m.host_hit_length) == (3 * PS, 0)
    got = {**snapshot(cache, {"kv": m.device_slots}), **snapshot(cache, {"conv": node.state_device["conv"]})}
    assert_same(got, expected)
    tree.check_integrity()
