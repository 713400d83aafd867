"""`hicache.radix.read`: the tree's read path in its two forms. The Python form is the
reference; the compiled one (when built) must give the same answers on random trees, also
after evictions, re-inserts, host loads and storage landings: two trees driven by the same
operations, one per form, stay equal node for node, and on one tree both forms' walks
(with and without hints, stale ones too), gathers and touches agree."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hicache.models import mha
from hicache.radix import read
from hicache.radix.node import TreeNode
from hicache.radix.read import COMPILED, PYTHON, child_nodes
from tests.hicache.radix import storage_env
from tests.hicache.radix.test_cache import make, seq

needs_compiled = pytest.mark.skipif(COMPILED is None, reason="hicache.radix._read is not built (or HICACHE_NO_C=1)")
FORMS = [PYTHON] + ([COMPILED] if COMPILED is not None else [])


def _path():
    nodes, end = [], 0
    for i, n in enumerate((3, 0, 5, 2)):
        end += n
        nodes.append(TreeNode(key=b"", end=end, hit_count=i, last_access=1,
                              _device=torch.arange(100 * i, 100 * i + n) if i < 3 else None))
    return nodes


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_touch_and_gather(form):
    a = _path()
    assert form.touch(a, 7, True) == 3
    assert [(n.last_access, n.hit_count) for n in a] == [(7, 1), (7, 2), (7, 3), (7, 4)]
    assert form.touch(a, 9, False) == 3 and [n.hit_count for n in a] == [1, 2, 3, 4]
    out = np.full(8, -1, np.int64)
    form.gather(a, 3, out)
    assert out.tolist() == [0, 1, 2, 200, 201, 202, 203, 204]
    short = np.full(7, -1, np.int64)  # a buffer of another length: nothing written
    with pytest.raises(ValueError, match="out: 8 slots into a buffer of 7"):
        form.gather(a, 3, short)
    assert (short == -1).all()


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_children_sharing_a_first_token_are_filed_apart(form):
    """Pages of 4 tokens that begin alike (the same first token, as a chat template's
    turns do) are distinct children: walked, split, evicted and walked again exactly."""
    cache, tree = make(mha(1, 1, 8, page_size=4), device_pages=64)
    tree._index.read = form
    kv = cache.device_pools["kv"]
    rng = np.random.default_rng(7)
    keys = []
    for i in range(6):  # first page: token 5, then distinct tails; then 2 pages of its own
        tail = rng.integers(0, 1 << 62, 11)
        tail[0] = i  # first pages differ at their second token only
        keys.append(np.concatenate([[5], tail]).astype(np.int64))
    for key in keys:
        m = tree.match_prefix(key)
        tree.insert(key, torch.cat([m.device_slots, kv.alloc(key.size - m.device_hit_length)]))
    tree.wait()
    assert len(tree.root.children) == 1 and len(child_nodes(tree.root)) == 6
    for key in keys:
        assert tree.match_prefix(key).device_hit_length == 12
        assert tree.match_prefix(key[:8]).device_hit_length == 8  # splits the node
    tree.check_integrity()
    assert tree.evict(4 * 12) >= 4 * 12  # some of the six go (and their filing with them)
    tree.check_integrity()
    for key in keys:
        m = tree.match_prefix(key)
        tree.insert(key, torch.cat([m.device_slots, kv.alloc(key.size - m.device_hit_length)]))
    tree.wait()
    tree.check_integrity()
    assert [tree.match_prefix(k).device_hit_length for k in keys] == [12] * 6
    shared = tree.root.children[keys[0][:1].tobytes()]
    one = next(iter(shared.values()))
    tree.root.children[keys[0][:1].tobytes()] = {one.key[:32]: one}  # a filing the layout never makes
    with pytest.raises(RuntimeError, match="a dict of 1 children under one first token"):
        tree.check_integrity()


# ---- the differential test --------------------------------------------------------------
def _key(conv: int, pages: int, ps: int) -> np.ndarray:
    """Conversation ``conv``'s first ``pages`` pages; conversations 0-2 share their first
    token (and, at one token a page, their first page), so pages of 4 file under one dict."""
    key = seq(conv * 1000, pages, ps)
    key[0] = 7
    return key


def _serve(tree, key: np.ndarray) -> tuple:
    """match, a storage prefetch, a host load, an insert of the rest: what the caller saw."""
    m = tree.match_prefix(key)
    seen = [m.device_hit_length, m.host_hit_length]
    p = tree.prefetch(key)
    if p is not None:
        seen.append(tuple(tree.wait_prefetch(p)))
        m = tree.match_prefix(key)
    held = m.last_host_node
    tree.inc_lock_ref(held)  # the matched prefix stays while the rest is made room for
    if held is not m.last_device_node:
        seen.append(tree.load_back(held) is not None)
        tree.wait()
        m = tree.match_prefix(key)
    need = key.size - m.device_hit_length
    new = tree.device_pool.alloc(need)
    if new is None:
        tree.evict(need)
        new = tree.device_pool.alloc(need)
    if new is not None:
        seen.append(tree.insert(key, torch.cat([m.device_slots, new])).cached_length)
        tree.wait()
    tree.dec_lock_ref(held)
    return tuple(seen)


def _shape(tree) -> list:
    """The tree node by node (depth first, children in key order): keys, ends, slots, clocks."""
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append((node.key, node.end, node.hit_count, node.last_access, node.lock_ref,
                    None if node._device is None else node._device.tolist(),
                    None if node._host is None else node._host.tolist()))
        stack.extend(sorted(child_nodes(node), key=lambda c: c.key, reverse=True))
    return out


def _same_reads(tree, keys: list[np.ndarray], stale: list[list]) -> None:
    """Both forms' walks (no hint, a fresh one, stale ones), gathers and touches agree."""
    pb, root = tree._index.page_bytes, tree.root
    for key in keys:
        path, partial = PYTHON.walk(root, key, pb, None)
        for hint in (None, path, path[:1], [root], *stale):
            for k in (key, key.tobytes()):
                assert COMPILED.walk(root, k, pb, hint) == PYTHON.walk(root, k, pb, hint)
        assert COMPILED.walk(root, key, pb, None) == (path, partial)
        d = sum(n._device is not None for n in path)
        outs = [np.full(path[d - 1].end if d else 0, -1, np.int64) for _ in range(2)]
        PYTHON.gather(path, d, outs[0])
        COMPILED.gather(path, d, outs[1])
        assert outs[0].tobytes() == outs[1].tobytes()
        kept = [(n.last_access, n.hit_count) for n in path]
        seen = []
        for form in (PYTHON, COMPILED):
            seen.append((form.touch(path, 10 ** 6, True), [(n.last_access, n.hit_count) for n in path]))
            for n, (clock, hits) in zip(path, kept):
                n.last_access, n.hit_count = clock, hits
        assert seen[0] == seen[1]
        stale.append(path)
        del stale[:-3]


OPS = st.lists(st.one_of(st.tuples(st.just("serve"), st.integers(0, 3), st.integers(1, 5)),
                         st.tuples(st.just("evict"), st.sampled_from([0, 1, 2])),
                         st.tuples(st.just("evict_host"), st.sampled_from([0, 1, 2]))), min_size=4, max_size=10)


@needs_compiled
@pytest.mark.parametrize("page_size", [1, 4])  # 1: one dict level; 4: first pages filed under a shared first token
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
@example(ops=[("serve", 0, 5), ("serve", 1, 4), ("evict", 2), ("evict_host", 2), ("serve", 0, 5),
              ("serve", 2, 3), ("evict", 1), ("serve", 1, 5)])  # landings, host loads, re-inserts
def test_both_forms_keep_trees_equal_through_evictions_loads_and_landings(tmp_path_factory, page_size, ops):
    stack = mha(1, 1, 8, page_size=page_size)
    trees = []
    for form in (COMPILED, PYTHON):
        cache, tree = storage_env.make(stack, tmp_path_factory.mktemp("store"), device_pages=20 // page_size * 2)
        tree._index.read = form
        trees.append((cache, tree))
    keys, stale = [], []
    for op in ops:
        if op[0] == "serve":
            key = _key(op[1], op[2] * 2, page_size)  # 2-10 pages: 20 or 40 fill the device
            keys.append(key)
            seen = [_serve(tree, key) for _, tree in trees]
        else:
            share = [0, 8, 1 << 20][op[1]]  # nothing, a few pages, everything
            seen = [getattr(tree, op[0])(share) for _, tree in trees]
        for _, tree in trees:  # the storage writes done (the same on both; a later serve lands them)
            tree.drain_storage()
        assert seen[0] == seen[1], op
        assert _shape(trees[0][1]) == _shape(trees[1][1]), op
        _same_reads(trees[0][1], keys[-3:] + [keys[-1][:-page_size], keys[-1][:-1]] if keys else [], stale)
    for cache, tree in trees:
        tree.check_integrity()
        tree.close()
        cache.close()


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.name)
def test_a_read_refuses_a_key_of_other_items_and_a_negative_end(form):
    node = TreeNode(key=b"", end=0)
    with pytest.raises(TypeError, match="key: need bytes or a C-contiguous int64 array"):
        form.walk(node, np.arange(4, dtype=np.int32), 8, None)
    with pytest.raises(ValueError, match="page_bytes"):
        form.walk(node, np.arange(4), 12, None)
    with pytest.raises(ValueError, match="end"):
        form.walk(TreeNode(key=b"", end=-1), np.arange(4), 8, None)
    assert form.walk(TreeNode(key=b"", end=1 << 70), np.arange(4), 8, None) == ([], None)  # beyond the key


def test_the_compiled_form_is_the_default_when_built():
    assert read.READ is (COMPILED or PYTHON)
