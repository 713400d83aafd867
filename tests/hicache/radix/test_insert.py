"""`HiRadixCache.insert`: bad slots refused before the tree changes; only provable duplicates freed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.models import mha
from hicache.radix.read import child_nodes
from hicache.replay.content import ContentModel, prefix_hashes
from tests.hicache.radix.test_cache import make, seq

PS = 4


def tree_state(tree) -> list:
    """Every node's key, tiers, lock and transfer, plus the allocators' counts: what an insert may change."""
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(child_nodes(node))
        tiers = [None if t is None else t.tolist() for t in (node.device, node.host)]
        out.append((node.end, node.tokens.tobytes(), *tiers, node.lock_ref, node.pending, node.hit_count))
    pools = (tree.device_pool, tree.host_pool)
    return sorted(out, key=repr) + [p.available() for p in pools]


def setup_a():
    """A tree holding prefix A (2 pages, backed up), its content written and the slots it owns."""
    cache, tree = make(mha(1, 1, 8, page_size=PS))
    content = ContentModel(cache)
    a = seq(0, 2, PS)
    own = cache.device_pools["kv"].alloc(2 * PS)
    content.fill("kv", own, prefix_hashes(a, PS))
    tree.insert(a, own)
    tree.wait()
    return cache, tree, content, a, own


def bad_cases(kv, own: torch.Tensor, fresh: torch.Tensor, spare: torch.Tensor) -> dict:
    """(slots for A+B, error, message) per mistake; ``spare`` is free, ``fresh`` the caller's."""
    n = kv.num_tokens
    return {
        "unaligned": (torch.cat([own, fresh[2:], fresh[:2]]), ValueError, "whole pages"),
        "out_of_range": (torch.cat([own, torch.arange(n, n + 2 * PS)]), ValueError, rf"in \[0, {n}\)"),
        "not_allocated": (torch.cat([own, spare]), ValueError, "not allocated by the device allocator"),
        "repeated": (torch.cat([own, fresh[:PS], fresh[:PS]]), ValueError, "same page appears twice"),
        # A's first page handed over for a page of B: the tree would hold it twice
        "own_page_for_other_tokens": (torch.cat([fresh[:PS], own[PS:], own[:PS], fresh[PS:]]), ValueError,
                                      "tree's own slot for other tokens"),
        "count": (torch.cat([own, fresh[:PS]]), ValueError, "one per token"),
        "two_d": (torch.cat([own, fresh]).view(2, -1), ValueError, "one per token"),
        "float": (torch.cat([own, fresh]).double(), TypeError, "need integer slots"),
        "bool": (torch.ones(4 * PS, dtype=torch.bool), TypeError, "need integer slots"),
        "float_list": ([float(x) for x in torch.cat([own, fresh])], TypeError, "need integer slots"),
    }


@pytest.mark.parametrize("case", ["unaligned", "out_of_range", "not_allocated", "repeated",
                                  "own_page_for_other_tokens", "count", "two_d", "float", "bool", "float_list"])
def test_bad_device_slots_are_refused_and_the_tree_is_unchanged(case):
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    fresh = kv.alloc(2 * PS)
    spare = kv.alloc(2 * PS)
    kv.free(spare)
    ab = np.concatenate([a, seq(500, 2, PS)])
    slots, error, message = bad_cases(kv, own, fresh, spare)[case]
    before = tree_state(tree)
    # 1. the insert of A+B names the argument and changes nothing: no node, no slot moved
    with pytest.raises(error, match=f"device_slots: .*{message}"):
        tree.insert(ab, slots)
    assert tree_state(tree) == before
    # 2. the tree is not poisoned: the caller's slots are still the caller's, every
    #    invariant holds, and eviction works
    kv.free(fresh)
    tree.check_integrity()
    assert tree.evict(2 * PS) == 2 * PS
    tree.check_integrity()


@pytest.mark.parametrize("tokens", [[1.0] * 8, np.arange(8, dtype=np.float32), torch.arange(8).float(),
                                    np.ones(8, dtype=bool)])
def test_token_ids_that_are_not_integers_are_refused(tokens):
    # 1000.7 used to become key 1000: a float id is a caller's mistake, never truncated
    cache, tree, content, a, own = setup_a()
    before = tree_state(tree)
    fresh = cache.device_pools["kv"].alloc(2 * PS)
    with pytest.raises(TypeError, match="token_ids: need integer token ids"):
        tree.insert(tokens, fresh)
    with pytest.raises(TypeError, match="token_ids"):
        tree.match_prefix(tokens)
    assert tree_state(tree)[:-2] == before[:-2]
    cache.device_pools["kv"].free(fresh)
    tree.check_integrity()


def test_own_slots_in_another_order_are_kept_and_later_hits_are_exact():
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    used = kv.num_tokens - kv.available()
    # 1. A again, with the tree's own two pages swapped: nothing may be freed (it used to
    #    free both pages while the tree still served them)
    swapped = torch.cat([own[PS:], own[:PS]])
    assert tree.insert(a, swapped).cached_length == 2 * PS
    assert kv.num_tokens - kv.available() == used
    tree.check_integrity()
    # 2. the next allocation cannot reuse A's slots; B's content goes elsewhere
    b = seq(700, 2, PS)
    b_slots = kv.alloc(2 * PS)
    assert not set(b_slots.tolist()) & set(own.tolist())
    content.fill("kv", b_slots, prefix_hashes(b, PS))
    tree.insert(b, b_slots)
    # 3. a later device hit of A returns A's bytes
    m = tree.match_prefix(a)
    assert m.device_hit_length == 2 * PS and torch.equal(m.device_slots, own)
    content.verify("kv", m.device_slots, prefix_hashes(a, PS), "A after the reordered insert")
    tree.wait()
    tree.check_integrity()


def test_a_fresh_duplicate_is_freed_and_an_own_page_at_another_position_is_kept():
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    fresh = kv.alloc(PS)
    avail = kv.available()
    # 1. page 0 recomputed into a fresh page; page 1 given as A's page 0 (the caller mixed them up)
    tree.insert(a, torch.cat([fresh, own[:PS]]))
    # 2. only the fresh page was a provable duplicate: it went back; A keeps both its pages
    assert kv.available() == avail + PS and not kv.allocator.is_owned(fresh)
    assert torch.equal(tree.match_prefix(a).device_slots, own)
    content.verify("kv", own, prefix_hashes(a, PS), "A")
    tree.check_integrity()


def test_slots_of_another_prefix_passed_as_duplicates_are_not_freed():
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    c = seq(300, 2, PS)
    c_slots = kv.alloc(2 * PS)
    content.fill("kv", c_slots, prefix_hashes(c, PS))
    tree.insert(c, c_slots)
    avail = kv.available()
    # 1. A "recomputed" into C's slots (a caller's mistake): the tree serves them for C
    tree.insert(a, c_slots)
    # 2. nothing freed: every free slot filled with other bytes leaves A and C exact
    assert kv.available() == avail
    other = kv.alloc(kv.available())
    content.fill("kv", other, list(range(1, other.numel() // PS + 1)))
    content.verify("kv", tree.match_prefix(c).device_slots, prefix_hashes(c, PS), "C")
    content.verify("kv", tree.match_prefix(a).device_slots, prefix_hashes(a, PS), "A")
    kv.free(other)
    tree.wait()
    tree.check_integrity()


def test_slots_past_a_load_in_flight_are_freed_unless_the_load_holds_them():
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    # 1. A leaves the device (host copy only), then its load back is queued, not acked
    assert tree.evict(2 * PS) == 2 * PS
    node = tree.match_prefix(a).last_host_node
    dst = tree.load_back(node)["kv"]
    # 2. A+B arrives meanwhile: A's pages given as the load's own slots (mistake), B fresh
    ab = np.concatenate([a, seq(900, 2, PS)])
    fresh_b = kv.alloc(2 * PS)
    res = tree.insert(ab, torch.cat([dst, fresh_b]))
    # 3. nothing hangs below a load in flight: B's slots went back, the load's were kept
    assert res.last_node is node and not kv.allocator.is_owned(fresh_b) and kv.allocator.is_owned(dst)
    cache.controller.start_loading()
    tree.wait()
    tree.check_integrity()
    # 4. the load lands: A's bytes on the device again
    m = tree.match_prefix(a)
    assert torch.equal(m.device_slots, dst)
    content.verify("kv", dst, prefix_hashes(a, PS), "A loaded back")


def test_slots_as_a_list_or_numpy_array_are_accepted():
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    b, c = seq(100, 1, PS), seq(200, 1, PS)
    tree.insert(b, kv.alloc(PS).tolist())
    tree.insert(c, kv.alloc(PS).numpy().astype(np.int32))
    assert tree.match_prefix(b).device_hit_length == tree.match_prefix(c).device_hit_length == PS
    tree.wait()
    tree.check_integrity()


@pytest.mark.gpu
def test_cuda_slots_are_kept_on_the_host():
    # the tree stores CPU slots, so a backup of them never waits on the device
    cache, tree = make(mha(1, 1, 8, page_size=PS))
    kv = cache.device_pools["kv"]
    slots = kv.alloc(2 * PS)
    node = tree.insert(seq(0, 2, PS), slots.cuda()).last_node
    assert node.device.device.type == "cpu" and torch.equal(node.device, slots)
    tree.wait()
    tree.check_integrity()


def test_an_insert_after_its_match_sees_what_changed_in_between():
    # insert continues the walk of the match before it; an eviction, a split or a load
    # between the two must not make it trust what the match saw
    cache, tree, content, a, own = setup_a()
    kv = cache.device_pools["kv"]
    ab = np.concatenate([a, seq(600, 2, PS)])
    # 1. match A+B (A on the device), then A leaves the device: the insert revives A
    assert tree.match_prefix(ab).device_hit_length == 2 * PS
    assert tree.evict(2 * PS) == 2 * PS
    slots = kv.alloc(4 * PS)
    content.fill("kv", slots, prefix_hashes(ab, PS))
    res = tree.insert(ab, slots)
    assert res.cached_length == 0 and torch.equal(tree.match_prefix(ab).device_slots, slots)
    tree.wait()
    tree.check_integrity()
    # 2. match A+B+C, then an insert of A's first page + D splits A: the next insert of
    #    A+B+C walks again and keeps the tree's slots
    abc = np.concatenate([ab, seq(800, 1, PS)])
    m = tree.match_prefix(abc)
    epoch = tree._index.epoch
    ad = np.concatenate([a[:PS], seq(900, 1, PS)])
    tree.insert(ad, torch.cat([slots[:PS], kv.alloc(PS)]))
    assert tree._index.epoch > epoch  # the split made the match's walk stale
    c_slots = kv.alloc(PS)
    res = tree.insert(abc, torch.cat([m.device_slots, c_slots]))
    assert res.cached_length == 4 * PS
    assert torch.equal(tree.match_prefix(abc).device_slots, torch.cat([slots, c_slots]))
    tree.wait()
    tree.check_integrity()
