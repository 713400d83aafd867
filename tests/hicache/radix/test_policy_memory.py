"""The tree's eviction policies keep what the tree holds, not what it saw (issue 37 item 3):
ghosts, aging checkpoints and the adaptive default's mini caches stay within their bounds
however many requests pass, and the default's memory is flat between two points of a run.
(The vLLM plugin's order: tests/integrations/vllm/test_order_memory.py.)"""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from hicache.radix.policies import NAMES
from hicache.radix.policies.ghosts import GHOST_SPAN
from hicache.radix.policies import scores
from hicache.radix.policies.scores import AgedFrequency
from tests.hicache.radix.test_policies import PS, serve, tree_of

HOT = np.arange(1, 1 + 2 * PS, dtype=np.int64) + 10**6  # a shared prefix of two pages


def requests(cache, tree, start: int, count: int) -> None:
    """``count`` requests: the hot prefix, then one of 16 returning tails or a fresh one."""
    for r in range(start, start + count):
        tail = r % 16 if r % 3 else 1000 + r  # two in three return, one in three never does
        serve(cache, tree, np.concatenate([HOT, np.arange(PS, dtype=np.int64) + 100 * tail + 10**7]))


POLICY_FILES = [tracemalloc.Filter(True, "*/hicache/radix/policies/*"),
                tracemalloc.Filter(True, "*/hicache/integrations/vllm/order.py")]


def policy_bytes() -> int:
    """Bytes allocated by the policies' code (and the plugin's order) still held, after a
    collection (torch's own allocations, which a Python trace cannot tell apart, left out)."""
    gc.collect()
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(POLICY_FILES).traces)


def within_bounds(tree) -> None:
    policy = tree._order
    capacity = tree.device_pool.num_tokens + tree.host_pool.num_tokens
    if policy.history is not None:
        assert policy.history.tokens <= GHOST_SPAN * capacity
        assert len(policy.history) <= GHOST_SPAN * capacity // PS
    for score in policy.all_scores():
        if isinstance(score, AgedFrequency):
            assert len(score.clocks) == len(score.values) <= scores.MAX_CHECKPOINTS
    shadows = getattr(policy, "shadows", None)
    if shadows is not None:
        held = shadows.capacity // PS  # chunks a mini cache can hold (a partial one: a page at least)
        assert all(m.tokens <= shadows.capacity and len(m.heap) == len(m.held) for m in shadows.minis)
        assert shadows.entries() <= (2 * len(shadows.minis) + 1) * held + shadows._max_idle  # held, their counts, ghosts
    assert tree.stats()["policy"]["memory_bytes"] >= 0


@pytest.mark.parametrize("eviction", NAMES)
def test_every_policy_of_the_tree_is_bounded_by_what_it_holds(eviction):
    cache, tree = tree_of(eviction, device_pages=8, ratio=2.0)
    for part in range(3):
        requests(cache, tree, part * 60, 60)
        within_bounds(tree)
    tree.check_integrity()


def test_the_default_trees_memory_is_flat(monkeypatch):
    """The aging checkpoints' bound lowered to 32 (of 65,536) so that a short run passes it."""
    monkeypatch.setattr(scores, "MAX_CHECKPOINTS", 32)
    cache, tree = tree_of("adaptive", device_pages=8, ratio=2.0)
    requests(cache, tree, 0, 200)  # warm: ghosts, checkpoints and mini caches at their bounds
    tracemalloc.start()  # (what was made before is not seen: compare two points after it)
    try:
        requests(cache, tree, 200, 200)
        half = policy_bytes()
        requests(cache, tree, 400, 200)
        end = policy_bytes()
    finally:
        tracemalloc.stop()
    within_bounds(tree)
    assert end - half < 4 << 10, f"{half=} {end=}"  # 200 requests more, 4 KiB of slack
    tree.check_integrity()
