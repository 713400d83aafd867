"""Hybrid stacks: a boundary whose history the tree still holds but whose snapshot only
storage has (the host dropped the snapshot and kept the history) is a match again after a
prefetch reads that snapshot alone. Before, the prefetch only read past the tree's
coverage, so a larger host (more history kept) served fewer hits than a smaller one.
Every byte used on the device is checked (`storage_env.serve`)."""
from __future__ import annotations

import numpy as np

from hicache.models import deepseek_v4
from hicache.radix.prefetch import PrefetchOutcome
from hicache.replay.content import ContentModel
from hicache.storage import FileBackend
from tests.hicache.radix.storage_env import make, serve
from tests.hicache.radix.test_cache import seq

PS = 256


class _ReadsFail(FileBackend):
    """Objects are written and found, but every read fails (a store fault)."""

    def _get(self, keys, pages):
        raise OSError("injected read fault")


def _tree_without_snapshots(tmp_path, pages: int = 2, snap: bool = True, backend_cls=None):
    """A DeepSeek-V4 tree that served ``pages`` pages (their end snapshot written through
    to storage when ``snap``), then dropped every snapshot on device and host; the history
    stays on both."""
    cache, tree = make(deepseek_v4([4, 128, 0, 4]), tmp_path, device_pages=16, backend_cls=backend_cls)
    content = ContentModel(cache)
    a = seq(0, pages, PS)
    serve(cache, tree, content, a, snap=snap)
    tree.drain_storage()
    tree.evict_states(1 << 30)
    tree.evict_host_states(1 << 30)
    assert tree.match_prefix(a).last_host_node is tree.root  # history alone is no match
    return cache, tree, content, a


def test_a_stored_snapshot_makes_the_held_history_a_match(tmp_path):
    cache, tree, content, a = _tree_without_snapshots(tmp_path)
    q = np.concatenate([a, seq(9000, 1, PS)])  # the next turn: nothing past A is stored
    got = serve(cache, tree, content, q)
    assert got.prefetch.outcome is PrefetchOutcome.SNAPSHOT
    assert (got.prefetch.found_tokens, got.prefetch.read_tokens, got.prefetch.added_tokens) == (0, 0, 0)
    # A's history came from the tree, its snapshot from storage: 2 pages not recomputed
    assert (got.device, got.host, got.storage) == (0, 0, 2 * PS)
    assert tree.counters["prefetch_snapshot"] == 1
    tree.check_integrity()
    tree.close()


def test_a_prompt_the_tree_covers_whole_gets_its_snapshot_too(tmp_path):
    cache, tree, content, a = _tree_without_snapshots(tmp_path)
    got = serve(cache, tree, content, a)
    assert got.prefetch.outcome is PrefetchOutcome.SNAPSHOT and got.storage == 2 * PS
    tree.check_integrity()
    tree.close()


def test_no_stored_snapshot_is_still_no_match(tmp_path):
    cache, tree, content, a = _tree_without_snapshots(tmp_path, snap=False)
    got = serve(cache, tree, content, np.concatenate([a, seq(9000, 1, PS)]))
    assert got.prefetch.outcome is PrefetchOutcome.NOT_FOUND
    assert (got.device, got.host, got.storage) == (0, 0, 0)
    tree.check_integrity()
    tree.close()


def test_the_deepest_stored_snapshot_in_the_gap_is_read(tmp_path):
    cache, tree, content, a = _tree_without_snapshots(tmp_path, pages=1)
    ab = np.concatenate([a, seq(5000, 2, PS)])
    serve(cache, tree, content, ab)  # snapshots at 256 (read back) and 768 (new) both stored
    tree.drain_storage()
    tree.evict_states(1 << 30)
    tree.evict_host_states(1 << 30)
    got = serve(cache, tree, content, np.concatenate([ab, seq(9000, 1, PS)]))
    assert got.prefetch.outcome is PrefetchOutcome.SNAPSHOT and got.storage == 3 * PS
    tree.check_integrity()
    tree.close()


def test_a_snapshot_read_that_fails_leaves_no_slot_behind(tmp_path):
    cache, tree, content, a = _tree_without_snapshots(tmp_path, backend_cls=_ReadsFail)
    swa = cache.host_group.pools["swa"]
    free = swa.available()
    got = serve(cache, tree, content, np.concatenate([a, seq(9000, 1, PS)]), snap=False)
    assert got.prefetch.outcome is PrefetchOutcome.READ_FAILED
    assert (got.device, got.host, got.storage) == (0, 0, 0)
    assert swa.available() == free  # the snapshot's host slots went back
    tree.check_integrity()
    tree.close()
