"""`hicache.slot_arrays`: the compiled passes and their numpy forms agree (the tree's read
path: tests/hicache/radix/test_read.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache import slot_arrays

needs_compiled = pytest.mark.skipif(not slot_arrays.COMPILED, reason="hicache._slot_arrays is not built")


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
@settings(max_examples=40, deadline=None)  # x3 page sizes: ample for cases of a few pages
@given(data=st.data())
def test_compiled_fresh_pages_agrees_with_numpy(page_size, data):
    slots, start, free_from, owned, held = _case(data.draw, page_size)
    compiled = slot_arrays.fresh_pages(slots, start, free_from, page_size, owned, held)
    numpy = slot_arrays._fresh_pages(slots, start, free_from, page_size, owned, held)
    assert (compiled is None) == (numpy is None)
    assert slot_arrays.are_fresh(slots, start, free_from, page_size, owned, held) == (numpy is not None)
    if compiled is not None:
        assert compiled.tolist() == numpy.tolist()


@needs_compiled
def test_compiled_hold_and_same_bytes():
    held = np.zeros(8, np.int32)
    slots = np.arange(8, 16, dtype=np.int64)  # pages 2 and 3 of 4 slots
    slot_arrays.hold(slots, 4, held, 1)
    assert held.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    before = held.copy()
    with pytest.raises(ValueError, match="outside the held counts"):  # nothing changes
        slot_arrays.hold(np.array([4, 5, 6, 7, 64, 65, 66, 67], np.int64), 4, held, 1)
    assert held.tolist() == before.tolist()
    with pytest.raises(TypeError, match="held: need items of 4 bytes"):
        slot_arrays.hold(slots, 4, held.astype(np.int64), 1)
    a = np.arange(5, dtype=np.int64)
    assert slot_arrays.same_bytes(a, a.copy()) and not slot_arrays.same_bytes(a, a[:4])
    assert slot_arrays.same_bytes(a[:0], np.empty(0, np.int64))


@pytest.mark.parametrize("put", [slot_arrays.put, slot_arrays._put], ids=["compiled_or_fallback", "numpy"])
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


@pytest.mark.parametrize("rows", [slot_arrays.rows, slot_arrays._rows], ids=["compiled_or_fallback", "numpy"])
def test_rows_of_whole_rows_and_a_refused_length(rows):
    slots = torch.arange(64, 64 + 4 * 16)[16:]  # a view with an offset: rows 20..31 of 4 tokens
    out = np.empty(12, np.int64)
    rows(slots, 4, out)
    assert out.tolist() == list(range(20, 32))
    rows(slots[:0], 4, out[:0])
    with pytest.raises(ValueError, match="not 2 rows of 4"):
        rows(slots[:6], 4, np.empty(2, np.int64))
