"""Eviction policies (`hicache.radix.policies`) in the tree: each one's order on a hand-made
sequence, counts that see every request and outlive eviction (every policy, the tiered
default's host deletions included), and counts under write-back."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.config import EVICTION_POLICIES
from hicache.models import mha
from hicache.radix.policies import NAMES, make_policy
from tests.hicache.radix.test_cache import make, seq

PS = 4


def tree_of(eviction: str, policy: str = "write_through", device_pages: int = 8, ratio: float = 2.0):
    return make(mha(1, 1, 8, page_size=PS), policy, device_pages=device_pages, ratio=ratio, eviction=eviction)


def serve(cache, tree, tokens: np.ndarray, times: int = 1) -> None:
    """``times`` requests of ``tokens``: match, room made, insert (a hit count each), backups acked."""
    kv = cache.device_pools["kv"]
    for _ in range(times):
        m = tree.match_prefix(tokens)
        need = tokens.size - m.device_hit_length
        if kv.available() < need:
            tree.evict(need - kv.available())
        tree.insert(tokens, torch.cat([m.device_slots, kv.alloc(need)]))
        tree.wait()


def node_of(tree, tokens: np.ndarray):
    path, _ = tree._index.walk(tokens)  # a walk that touches nothing (no LRU change)
    return path[-1] if path and path[-1].end == tokens.size else None


def on_device(tree, tokens: np.ndarray) -> bool:
    node = node_of(tree, tokens)
    return node is not None and node.device is not None


def device_order(tree, seqs: list[np.ndarray]) -> list[int]:
    """Evict one page at a time; the indices of ``seqs`` in the order they left the device."""
    order = []
    while tree.evict(PS):
        order += [i for i, s in enumerate(seqs) if i not in order and not on_device(tree, s)]
    return order


def host_order(tree, seqs: list[np.ndarray]) -> list[int]:
    """The same for the host tier (host-only leaves, deleted one page at a time)."""
    order = []
    while tree.evict_host(PS):
        order += [i for i, s in enumerate(seqs) if i not in order and node_of(tree, s) is None]
    return order


def counted_sequence(cache, tree) -> list[np.ndarray]:
    """a once, b 3x, c 2x, d once, e once, then a matched again: five one-page nodes."""
    a, b, c, d, e = (seq(100 * i, 1, PS) for i in range(5))
    for tokens, times in ((a, 1), (b, 3), (c, 2), (d, 1), (e, 1)):
        serve(cache, tree, tokens, times)
    tree.match_prefix(a)  # a: the most recent
    return [a, b, c, d, e]


def test_the_config_lists_every_policy():
    assert EVICTION_POLICIES == NAMES


def test_lru_order_is_last_access():
    cache, tree = tree_of("lru")
    seqs = counted_sequence(cache, tree)
    assert device_order(tree, seqs) == [1, 2, 3, 4, 0]  # b c d e a: hit counts play no part
    tree.check_integrity()


def test_lfu_order_is_hit_count_then_last_access():
    cache, tree = tree_of("lfu")
    seqs = counted_sequence(cache, tree)
    # 1 hit: d, e, a (a touched last), then c (2 hits), b (3 hits)
    assert device_order(tree, seqs) == [3, 4, 0, 2, 1]
    tree.check_integrity()


@pytest.mark.parametrize(("eviction", "expected"), [
    ("rf1", [3, 4, 0, 2, 1]),  # W = 32 ticks: one request more outweighs the 2-8 ticks between them
    ("adaptive", [3, 4, 0, 2, 1]),  # nothing learnt yet: its first candidate, rf1
])
def test_blend_and_adaptive_orders(eviction, expected):
    cache, tree = tree_of(eviction)
    seqs = counted_sequence(cache, tree)
    assert device_order(tree, seqs) == expected
    tree.check_integrity()


def test_lfuda_ages_out_hits_of_long_ago():
    """a has 3 hits, then one-page requests x1.. pass a 4-page device: each victim raises the
    age L, and a request after it scores L + 1; at x10 the x's reach a's 3 (ties: LRU)."""
    orders = {}
    for eviction in ("lfuda", "lfu"):
        cache, tree = tree_of(eviction, device_pages=4)
        a = seq(0, 1, PS)
        xs = [seq(1000 * (i + 1), 1, PS) for i in range(10)]
        serve(cache, tree, a, 3)
        order = []
        for x in xs:
            serve(cache, tree, x)
            order += [s for s, t in [("a", a), *((f"x{i + 1}", t) for i, t in enumerate(xs))]
                      if s not in order and node_of(tree, t) is not None and not on_device(tree, t)]
        orders[eviction] = order
        tree.check_integrity()
    # L: 1 after x1, 2 after x4; x7 on score 3 with a, x10's eviction ties it: a goes
    assert orders["lfuda"] == ["x1", "x2", "x3", "x4", "x5", "x6", "a"]
    assert orders["lfu"] == ["x1", "x2", "x3", "x4", "x5", "x6", "x7"]  # a's 3 hits keep it forever


def test_tiered_device_ages_out_host_is_lru():
    """The sequence above on the device (lfuda: a leaves it at x10) with an 8-page host
    (LRU): each backup past 8 pages deletes the least recently used host-only leaf."""
    cache, tree = tree_of("tiered", device_pages=4, ratio=2.0)
    a = seq(0, 1, PS)
    xs = [seq(1000 * (i + 1), 1, PS) for i in range(10)]
    serve(cache, tree, a, 3)
    for x in xs[:9]:
        serve(cache, tree, x)
    assert on_device(tree, a)  # the device kept a (3 hits) while x1-x6 left it
    assert [node_of(tree, x) is None for x in xs[:3]] == [True, True, False]  # host: x1, x2 deleted
    # x10: the device gives a up (its age caught up), the host deletes it at once (least
    # recently used of the host-only leaves, 3 hits or not) and keeps x3 (1 hit)
    serve(cache, tree, xs[9])
    assert node_of(tree, a) is None and node_of(tree, xs[2]) is not None
    # what is left leaves the host oldest first
    tree.evict(4 * PS)
    assert host_order(tree, xs[2:]) == list(range(8))
    tree.check_integrity()


# ---- counts: every request, kept across eviction ---------------------------------------
@pytest.mark.parametrize("eviction", NAMES)
def test_a_miss_raises_the_count_and_counts_outlive_the_node(eviction):
    cache, tree = tree_of(eviction, ratio=1.0)
    a = seq(0, 2, PS)
    serve(cache, tree, a, 4)
    # the device drops a (the host keeps it), then the host deletes it
    tree.evict(8 * PS)
    tree.evict_host(8 * PS)
    assert node_of(tree, a) is None
    serve(cache, tree, a)  # a miss: the node comes back with its count, and this request
    assert node_of(tree, a).hit_count == 5  # 4 before it left, 1 now
    tree.check_integrity()


def test_the_default_keeps_counts_of_host_deletions():
    """tiered and adaptive with a host tier: a prefix deleted on the host (not the device)
    keeps its count (the device's order used to hear of no deletion there)."""
    for eviction in ("tiered", "adaptive"):
        cache, tree = tree_of(eviction, ratio=2.0)
        a, fill = seq(0, 1, PS), [seq(100 * (i + 1), 1, PS) for i in range(3)]
        serve(cache, tree, a, 3)
        tree.evict(8 * PS)  # every device copy dropped: a lives on the host only
        for f in fill:
            serve(cache, tree, f)
        tree.evict(8 * PS)
        assert tree.evict_host(16 * PS) and node_of(tree, a) is None  # deleted on the host
        serve(cache, tree, a)
        assert node_of(tree, a).hit_count == 4, eviction
        tree.check_integrity()


@pytest.mark.parametrize("eviction", ["lfu", "lfuda"])
def test_hit_counts_kept_under_write_back(eviction):
    cache, tree = tree_of(eviction, policy="write_back", ratio=2.0)
    a, b = seq(0, 1, PS), seq(100, 1, PS)
    serve(cache, tree, a, 3)
    serve(cache, tree, b)
    # write-back: the device eviction backs both up, the nodes keep their hit counts
    tree.evict(8 * PS)
    assert node_of(tree, a).host is not None and node_of(tree, a).hit_count == 3
    # the host evicts by them: b (1 hit, more recent) before a (3 hits)
    assert host_order(tree, [a, b]) == [1, 0]
    tree.check_integrity()


def test_an_unknown_policy_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--hicache-eviction-policy.*lru, lfu, lfuda, rf1, rf4, rf16, tiered, "
                                         "adaptive"):
        make_policy("fifo", {"device": 1, "host": 1})
    with pytest.raises(ValueError, match="chains"):
        make_policy("adaptive", {"device": 1, "host": 1})
