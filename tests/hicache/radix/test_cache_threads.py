"""One `HiRadixCache` driven by 2-8 threads at once (docs/DESIGN.md §12): each thread
serves requests that share prefixes with the other threads' (match and lock under
``tree.mutex``, load back, compute the rest, insert, back up, retain or release by a hint,
evict), and checks every
byte of the device rows its locked match covers against the content of its tokens. No
timing: a race shows as wrong bytes, an error or a broken invariant."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.models import mha
from tests.concurrent import run_threads
from tests.hicache.radix.test_cache import make

PS, FAMILIES, FAMILY_PAGES, ROUNDS = 4, 3, 4, 12
TAIL_BASE = 1 + FAMILIES * FAMILY_PAGES * PS  # ids of the tails start here


class Content:
    """The KV bytes of every token id (the same id always means the same prefix), per layer
    and buffer of the anchor pool: random, never zeros. A row holds ``tpr`` tokens."""

    def __init__(self, cache, ids: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.pool, self.stack = cache.device_pools["kv"], cache.stack
        self.tpr = self.stack.pool("kv").tokens_per_row
        self.table = [[torch.randint(1, 256, (ids, v.shape[1] // self.tpr), dtype=torch.uint8, generator=g)
                       for v in views] for views in self.pool.row_views()]

    def _rows(self, slots: torch.Tensor, tokens: np.ndarray):
        rows = self.stack.derive_rows({"kv": slots})["kv"]
        ids = torch.from_numpy(tokens)
        return rows, [[t[ids].reshape(rows.numel(), v.shape[1]) for t, v in zip(table, views)]
                      for table, views in zip(self.table, self.pool.row_views())]

    def write(self, slots: torch.Tensor, tokens: np.ndarray) -> None:
        rows, want = self._rows(slots, tokens)
        for views, rows_want in zip(self.pool.row_views(), want):
            for v, w in zip(views, rows_want):
                v[rows] = w

    def wrong(self, slots: torch.Tensor, tokens: np.ndarray) -> int:
        """Layer-buffer views whose rows at ``slots`` are not the tokens' content."""
        rows, want = self._rows(slots, tokens)
        return sum(not torch.equal(v[rows], w) for views, rows_want in zip(self.pool.row_views(), want)
                   for v, w in zip(views, rows_want))


def _prompt(rng: np.random.Generator, thread: int, step: int) -> np.ndarray:
    """A family's first 1-4 pages (shared with the other threads), then 1-2 pages of this
    thread's own."""
    f, pages = int(rng.integers(FAMILIES)), int(rng.integers(1, FAMILY_PAGES + 1))
    shared = 1 + f * FAMILY_PAGES * PS + np.arange(pages * PS, dtype=np.int64)
    own = TAIL_BASE + ((thread * ROUNDS + step) * 2) * PS + np.arange(int(rng.integers(1, 3)) * PS)
    return np.concatenate([shared, own])


def _serve(tree, content: Content, thread: int, wrong: list, seed: int = 0) -> None:
    kv, rng = tree.cache.device_pools["kv"], np.random.default_rng(seed * 100 + thread)
    for step in range(ROUNDS):
        tokens = _prompt(rng, thread, step)
        with tree.mutex:  # the match and its lock: one state of the tree
            m = tree.match_prefix(tokens)
            node = m.last_host_node
            tree.inc_lock_ref(node)
        done = m.last_device_node
        if m.host_hit_length and tree.load_back(node) is not None:
            tree.wait()  # launched and acked (this call or another thread's poll published it)
            done = node
        have = tree.device_slots(done)  # locked: no thread evicts these rows meanwhile
        wrong[0] += content.wrong(have, tokens[:done.end])
        rest = len(tokens) - done.end
        slots = kv.alloc(rest)
        if slots is None:
            tree.evict(rest)
            slots = kv.alloc(rest)
        if slots is not None:
            content.write(slots, tokens[done.end:])  # this thread's own slots: "computed"
            tree.insert(tokens, torch.cat([have, slots]))
            tree.ctrl.start_writing()
            tree.poll()
        tree.dec_lock_ref(node)
        if step % 3:  # a client's hints on its prefix, beside the other threads' requests
            ticket = (tree.hint(tokens, "retain", ttl_s=600.0) if step % 3 == 1
                      else tree.hint(tokens, "release"))
            assert ticket.state.value != "refused" or "budget" in ticket.reason, ticket.reason
        if step % 4 == 3:
            tree.evict(2 * PS)


@pytest.mark.parametrize("threads", [2, 8])
def test_one_tree_many_threads_keeps_every_byte(threads):
    cache, tree = make(mha(1, 1, 8, page_size=PS), "write_through", device_pages=24)
    content = Content(cache, TAIL_BASE + 2 * PS * ROUNDS * threads)
    wrong = [0]
    run_threads(threads, lambda t: _serve(tree, content, t, wrong))
    assert wrong[0] == 0
    tree.wait()
    tree.check_integrity()
    # every family's longest cached prefix, loaded back, is its content byte for byte
    for f in range(FAMILIES):
        tokens = 1 + f * FAMILY_PAGES * PS + np.arange(FAMILY_PAGES * PS, dtype=np.int64)
        m = tree.match_prefix(tokens)
        if m.host_hit_length and tree.load_back(m.last_host_node) is not None:
            tree.wait()
        m = tree.match_prefix(tokens)
        assert content.wrong(m.device_slots, tokens[:m.device_slots.numel()]) == 0
    tree.check_integrity()
