"""`hicache.fastpath`: the compiled checks and their numpy fallbacks agree, and the
tree works with either."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.models import mha
from hicache import fastpath
from hicache.radix.node import child_nodes
from tests.hicache.radix.test_cache import make, seq

needs_compiled = pytest.mark.skipif(not fastpath.COMPILED, reason="hicache._fastpath is not built")


def _case(draw, page_size):
    num_pages = 16
    pages = draw(st.lists(st.integers(-2, num_pages + 1), max_size=6))
    slots = [p * page_size + o for p in pages for o in range(page_size)]
    if slots and draw(st.booleans()):  # break one slot of the run
        i = draw(st.integers(0, len(slots) - 1))
        slots[i] += draw(st.sampled_from([-1, 1, page_size]))
    prefix = draw(st.integers(0, 2)) * page_size
    slots = np.array(list(range(prefix)) + slots, np.int64)
    owned = np.array(draw(st.lists(st.booleans(), min_size=num_pages, max_size=num_pages)), np.bool_)
    held = np.array(draw(st.lists(st.integers(0, 1), min_size=num_pages, max_size=num_pages)), np.int32)
    if draw(st.booleans()):
        held = None  # the controller's edge asks no held question
    free_from = draw(st.integers(prefix, slots.size))
    return slots, prefix, free_from, owned, held


@needs_compiled
@pytest.mark.parametrize("page_size", [1, 3, 4])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_compiled_fresh_pages_agrees_with_numpy(page_size, data):
    slots, start, free_from, owned, held = _case(data.draw, page_size)
    compiled = fastpath.fresh_pages(slots, start, free_from, page_size, owned, held)
    numpy = fastpath._fresh_pages(slots, start, free_from, page_size, owned, held)
    assert (compiled is None) == (numpy is None)
    assert fastpath.are_fresh(slots, start, free_from, page_size, owned, held) == (numpy is not None)
    if compiled is not None:
        assert compiled.tolist() == numpy.tolist()


@needs_compiled
def test_compiled_hold_and_same_bytes():
    held = np.zeros(8, np.int32)
    slots = np.arange(8, 16, dtype=np.int64)  # pages 2 and 3 of 4 slots
    fastpath.hold(slots, 4, held, 1)
    assert held.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    before = held.copy()
    with pytest.raises(ValueError, match="outside the held counts"):  # nothing changes
        fastpath.hold(np.array([4, 5, 6, 7, 64, 65, 66, 67], np.int64), 4, held, 1)
    assert held.tolist() == before.tolist()
    with pytest.raises(TypeError, match="held: need items of 4 bytes"):
        fastpath.hold(slots, 4, held.astype(np.int64), 1)
    a = np.arange(5, dtype=np.int64)
    assert fastpath.same_bytes(a, a.copy()) and not fastpath.same_bytes(a, a[:4])
    assert fastpath.same_bytes(a[:0], np.empty(0, np.int64))


@pytest.mark.parametrize("put", [fastpath.put, fastpath._put], ids=["compiled_or_fallback", "numpy"])
def test_put_scatters_and_refuses_an_index_out_of_range_changing_nothing(put):
    rng = np.random.default_rng(3)
    dst = rng.integers(-2**62, 2**62, 32, dtype=np.int64)
    want = dst.copy()
    index, values = rng.permutation(32)[:9].astype(np.int64), rng.integers(-2**62, 2**62, 9, dtype=np.int64)
    want[index] = values
    put(dst, index, values)
    assert dst.tobytes() == want.tobytes()
    for bad_index, bad_values in (([3, 32], [1, 2]), ([-1], [1]), ([1, 2], [1])):
        with pytest.raises(ValueError, match=r"put: \d+ indices \(each in \[0, 32\)\)"):
            put(dst, np.array(bad_index, np.int64), np.array(bad_values, np.int64))
        assert dst.tobytes() == want.tobytes()
    put(dst, np.empty(0, np.int64), np.empty(0, np.int64))
    assert dst.tobytes() == want.tobytes()


@needs_compiled
def test_compiled_touch_gather_and_rows_agree_with_numpy():
    from hicache.radix.node import TreeNode

    def path():
        nodes, end = [], 0
        for i, n in enumerate((3, 0, 5, 2)):
            end += n
            nodes.append(TreeNode(key=b"", end=end, hit_count=i, last_access=1,
                                  _device=torch.arange(100 * i, 100 * i + n) if i < 3 else None))
        return nodes

    a, b = path(), path()
    assert fastpath.touch(a, 7, True) == fastpath._touch(b, 7, True) == 3
    assert [(n.last_access, n.hit_count) for n in a] == [(n.last_access, n.hit_count) for n in b] \
        == [(7, 1), (7, 2), (7, 3), (7, 4)]
    assert fastpath.touch(a, 9, False) == 3 and [n.hit_count for n in a] == [1, 2, 3, 4]
    out, ref = np.full(8, -1, np.int64), np.full(8, -1, np.int64)
    fastpath.gather(a, 3, out)
    fastpath._gather(b, 3, ref)
    assert out.tolist() == ref.tolist() == [0, 1, 2, 200, 201, 202, 203, 204]
    for gather in (fastpath.gather, fastpath._gather):  # a buffer of another length: nothing written
        short = np.full(7, -1, np.int64)
        with pytest.raises(ValueError, match="gather: 8 slots into a buffer of 7"):
            gather(a, 3, short)
        assert (short == -1).all()
    slots = torch.arange(64, 64 + 4 * 16)[16:]  # a view with an offset: rows 20..31 of 4 tokens
    for rows in (fastpath.rows, fastpath._rows):
        out = np.empty(12, np.int64)
        rows(slots, 4, out)
        assert out.tolist() == list(range(20, 32))
        rows(slots[:0], 4, out[:0])
        with pytest.raises(ValueError, match="not 2 rows of 4"):
            rows(slots[:6], 4, np.empty(2, np.int64))


def test_the_tree_is_the_same_with_the_numpy_fallbacks(monkeypatch):
    def run():
        cache, tree = make(mha(1, 1, 8, page_size=4), device_pages=32)
        kv = cache.device_pools["kv"]
        out = []
        for turn in range(1, 4):
            for conv in range(3):
                tokens = seq(conv * 1000, 2 * turn, 4)
                m = tree.match_prefix(tokens)
                slots = torch.cat([m.device_slots, kv.alloc(tokens.size - m.device_hit_length)])
                out.append((tree.insert(tokens, slots).cached_length, m.device_hit_length))
                tree.wait()
        fresh = kv.alloc(4)
        bad = torch.cat([tree.match_prefix(seq(0, 2, 4)).device_slots, fresh[[1, 0, 2, 3]]])
        with pytest.raises(ValueError, match="whole pages"):
            tree.insert(seq(0, 3, 4), bad)
        kv.free(fresh)
        tree.check_integrity()
        for key in (seq(0, 1, 4), seq(0, 6, 4), seq(1000, 3, 4), np.concatenate([seq(0, 2, 4), seq(5, 1, 4)]),
                    seq(0, 8, 4)[:-2], seq(7000, 2, 4)):
            path, partial = tree._index.walk(key)  # whichever walk runs: same nodes either way
            out.append(([n.end for n in path], partial and partial[1]))
            for hint in (None, path, tree._index.walk(seq(0, 8, 4))[0], [tree.root]):  # a hint changes nothing
                for walk in (fastpath.walk, fastpath._walk):
                    other = walk(tree.root, key, tree._index.page_bytes, hint)
                    assert other[0] == path and other[1] is (partial and partial[0])
                    assert walk(tree.root, key.tobytes(), tree._index.page_bytes, hint)[0] == path
        return out

    compiled = run()
    monkeypatch.setattr(fastpath, "_c", None)
    monkeypatch.setattr(fastpath, "same_bytes", fastpath._same_bytes)
    monkeypatch.setattr(fastpath, "hold", fastpath._hold)
    monkeypatch.setattr(fastpath, "walk", fastpath._walk)
    monkeypatch.setattr(fastpath, "touch", fastpath._touch)
    monkeypatch.setattr(fastpath, "gather", fastpath._gather)
    assert run() == compiled


@pytest.mark.parametrize("compiled", [True, False])
def test_children_sharing_a_first_token_are_filed_apart(monkeypatch, compiled):
    """Pages of 4 tokens that begin alike (the same first token, as a chat template's
    turns do) are distinct children: walked, split, evicted and walked again exactly."""
    if not compiled:
        monkeypatch.setattr(fastpath, "walk", fastpath._walk)
    cache, tree = make(mha(1, 1, 8, page_size=4), device_pages=64)
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
