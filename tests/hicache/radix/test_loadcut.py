"""The load gate in the tree (``--hicache-load-policy cost``): what it is offered, what it cuts.

A scripted gate picks the cut, so each step says which node the tree loads back (or how
many stored pages a prefetch reads); the bytes that come back are checked as a request
would use them.
"""
from __future__ import annotations

import numpy as np
import torch

from hicache import build
from hicache.cost import Cut, Footprint, LoadCost, LoadGate, PrefillModel, PrefillRates, Store, load_profile
from hicache.models import deepseek_v4, mha
from hicache.radix import HiRadixCache
from hicache.radix.prefetch import PrefetchOutcome
from hicache.replay.content import ContentModel, prefix_hashes, state_seed
from hicache.models.shape import dense_shape
from tests.hicache.radix.storage_env import config, store_pages
from tests.hicache.radix.test_cache import BIG, seq


class Scripted:
    """A gate that cuts where ``pick(start, host_end, storage_end, cuts)`` says; keeps its calls."""

    def __init__(self, pick) -> None:
        self.pick, self.calls = pick, []

    def choose(self, prompt, start, host_end, storage_end=None, cuts=None) -> Cut:
        self.calls.append((prompt, start, host_end, storage_end, None if cuts is None else sorted(cuts)))
        return Cut(self.pick(start, host_end, storage_end, cuts), 0.0, 0.0, 0.0)

    def end(self, *args) -> int:
        return self.choose(*args).end


def tree_on(stack, gate, device_pages=16, **kw):
    cache = build(stack, device_pages * stack.page_size, config("/nonexistent", storage_backend="none", **kw),
                  device="cpu", budget=BIG, backend="torch")
    return cache, HiRadixCache(cache, load_gate=gate)


def compute(cache, tree, content, tokens, snap_at=()):
    """Fill and insert ``tokens`` (snapshots at ``snap_at`` ends and at the end, hybrid)."""
    kv = cache.device_pools[tree.anchor]
    slots, hashes = kv.alloc(tokens.size), prefix_hashes(tokens, tree.page_size)
    content.fill(tree.anchor, slots, hashes)
    for end in [*snap_at, tokens.size] if tree.hybrid else [tokens.size]:
        extra = None
        if tree.hybrid:
            extra = {"swa": cache.device_pools["swa"].alloc(tree.state_sizes["swa"])}
            content.fill("swa", extra["swa"], [state_seed(hashes[end // tree.page_size - 1])])
        node = tree.insert(tokens[:end], slots[:end], extra=extra).last_node
        slots = torch.cat([tree.device_slots(node), slots[end:]])
    tree.wait()
    tree.evict(1 << 30)  # every page leaves the device: a host hit now


def load(tree, content, tokens, node) -> int:
    """Load back to ``node`` and check every byte the device then serves; returns the device hit."""
    assert tree.load_back(node) is not None
    tree.wait()
    m = tree.match_prefix(tokens)
    assert m.last_device_node is node
    content.verify(tree.anchor, m.device_slots, prefix_hashes(tokens, tree.page_size)[:node.end // tree.page_size],
                   "loaded")
    if tree.hybrid:
        seed = [state_seed(prefix_hashes(tokens, tree.page_size)[node.end // tree.page_size - 1])]
        content.verify("swa", node.state_device["swa"], seed, "snapshot")
    return m.device_hit_length


def test_a_dense_tree_loads_all_none_or_up_to_a_split_where_the_gate_cuts():
    stack = mha(2, 2, 16, page_size=4)
    for pick, expect in ((lambda s, h, st, c: h, 12), (lambda s, h, st, c: s, 0), (lambda s, h, st, c: 8, 8)):
        gate = Scripted(pick)
        cache, tree = tree_on(stack, gate)
        content, tokens = ContentModel(cache), seq(0, 3, 4)
        compute(cache, tree, content, tokens)
        m = tree.match_prefix(tokens)
        assert (m.device_hit_length, m.host_hit_length) == (0, 12)
        node = tree.load_target(tokens, m)
        assert node.end == expect and gate.calls == [(12, 0, 12, None, None)]
        if expect:
            assert load(tree, content, tokens, node) == expect
        else:
            assert node is m.last_device_node
        tree.check_integrity()


def test_deepseek_v4_cuts_land_on_snapshot_boundaries():
    # 4 pages with snapshots after pages 1 and 3 and at the end; a split after page 2 has none
    stack, ps = deepseek_v4([4, 128, 0, 4]), 256
    gate = Scripted(lambda s, h, st, cuts: sorted(cuts)[1])  # the middle snapshot boundary
    cache, tree = tree_on(stack, gate, swa_full_tokens_ratio=0.5)
    content, tokens = ContentModel(cache), seq(0, 4, ps)
    compute(cache, tree, content, tokens, snap_at=(ps, 3 * ps))
    other = np.concatenate([tokens[:2 * ps], seq(9000, 1, ps)])
    compute(cache, tree, content, other)  # the branch at page 2: a boundary without a snapshot
    m = tree.match_prefix(tokens)
    node = tree.load_target(tokens, m)
    (_, start, host_end, _, cuts), = gate.calls
    assert (start, host_end, cuts) == (0, 4 * ps, [ps, 3 * ps, 4 * ps])  # page 2 is not offered
    assert node.end == 3 * ps and node.state_host is not None
    assert load(tree, content, tokens, node) == 3 * ps
    tree.check_integrity()


def test_a_slow_store_is_not_read_a_fast_one_is(tmp_path):
    stack = mha(1, 1, 8, page_size=4)
    tokens = seq(0, 6, 4)
    store_pages(tmp_path, stack, tokens)
    shape = dense_shape("tiny", 1, 64, 1, 1, 8, 128, 100)
    h100 = load_profile("h100")
    for read_gbps, outcome in ((1e-9, PrefetchOutcome.RECOMPUTE), (100.0, PrefetchOutcome.COMPLETE)):
        store = Store(read_gbps, 1.0, 0.0, 0.0)
        slow_gpu = PrefillRates(1e-6, 1e-6, 1e-6, 1.0, 0.0)
        gate = LoadGate(LoadCost(PrefillModel(shape, slow_gpu), Footprint.of(stack), h100.h2d, store), 4)
        cache = build(stack, 32, config(tmp_path), device="cpu", budget=BIG, backend="torch")
        tree = HiRadixCache(cache, load_gate=gate)
        p = tree.prefetch(tokens)
        got = tree.wait_prefetch(p)
        assert got.outcome is outcome and got.found_tokens == 24
        assert got.read_tokens == (24 if outcome is PrefetchOutcome.COMPLETE else 0)
        assert tree.match_prefix(tokens).host_hit_length == got.read_tokens
        tree.check_integrity()
        tree.close()
        cache.close()
