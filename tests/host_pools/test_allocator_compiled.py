"""The page allocator's compiled free stack (`host_pools._pages`) gives exactly what its
numpy code gives: the same pages, generations and state after every call, the same errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from host_pools import allocator as allocator_mod
from host_pools.allocator import PageAllocator

pytestmark = pytest.mark.skipif(allocator_mod._pages is None, reason="host_pools._pages is not built")


def _state(a: PageAllocator) -> tuple:
    return (a._top, a._fresh, a._stack[:a._top].tobytes(), a._owned.tobytes(), a._generation.tobytes())


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("seed", range(4))
def test_random_allocs_and_frees_match_the_numpy_code(monkeypatch, page_size, seed):
    rng = np.random.default_rng(seed)
    compiled, reference = PageAllocator(300 * page_size, page_size), PageAllocator(300 * page_size, page_size)
    held: list[np.ndarray] = []
    for step in range(400):
        if held and rng.random() < 0.45:
            pages = held.pop(int(rng.integers(len(held))))
            if rng.random() < 0.5 and pages.size > 1:  # a part of it, in another order
                cut = int(rng.integers(1, pages.size))
                held.append(pages[cut:])
                pages = rng.permutation(pages[:cut])
            got = compiled.free_pages(pages)
            monkeypatch.setattr(allocator_mod, "_pages", None)
            want = reference.free_pages(pages)
            monkeypatch.undo()
        else:
            n = int(rng.choice([0, 1, 2, 5, 64, 65, 90]))
            got = compiled.alloc_pages(n)
            monkeypatch.setattr(allocator_mod, "_pages", None)
            want = reference.alloc_pages(n)
            monkeypatch.undo()
            if want is not None:
                assert got is not None and got[0].dtype == want[0].dtype == np.int64
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), step
                held.append(got[0])
                got = want = None
        assert got == want, step
        assert _state(compiled) == _state(reference), step


@pytest.mark.parametrize("page_size", [1, 4])
def test_pages_with_their_slots_match_the_numpy_code(monkeypatch, page_size):
    rng = np.random.default_rng(page_size)
    compiled, reference = PageAllocator(100 * page_size, page_size), PageAllocator(100 * page_size, page_size)
    for step in range(200):
        if rng.random() < 0.4 and compiled.used():  # free a random owned page on both
            page = rng.choice(np.flatnonzero(compiled._owned))
            compiled.free_pages(np.array([page]))
            reference.free_pages(np.array([page]))
            continue
        n = int(rng.choice([0, 1, 3, 17, 101]))
        got = compiled.alloc_page_slots(n)
        monkeypatch.setattr(allocator_mod, "_pages", None)
        want = reference.alloc_page_slots(n)
        monkeypatch.undo()
        assert (got is None) == (want is None), step
        if want is not None:
            for g, w in zip(got, want):
                assert g.dtype == np.int64 and g.tobytes() == w.tobytes(), step
            assert want[2].tobytes() == reference.page_slots(want[0]).tobytes()
        assert _state(compiled) == _state(reference), step


def test_take_refuses_an_output_of_the_wrong_size_and_changes_nothing():
    a = PageAllocator(8 * 4, 4)
    before = _state(a)
    with pytest.raises(ValueError, match=r"take: out of 13 items is not 2 pages of 6 items"):
        allocator_mod._pages.take(a._stack, a._top, a._owned, a._generation, np.empty(13, np.int64), 4)
    with pytest.raises(ValueError, match=r"page_size: must be in \[1, "):
        allocator_mod._pages.take(a._stack, a._top, a._owned, a._generation, np.empty(12, np.int64), 0)
    assert _state(a) == before


def test_a_double_free_names_the_slots_and_changes_nothing():
    a = PageAllocator(8 * 4, 4)
    pages, _ = a.alloc_pages(3)
    a.free_pages(pages[1:2])
    before = _state(a)
    with pytest.raises(ValueError, match=r"double free \(or never allocated\) of slots starting at \[4\]"):
        a.free_pages(pages)
    assert _state(a) == before
    with pytest.raises(ValueError, match=r"slots: double free"):
        a.free(torch.arange(4, 8))
    assert _state(a) == before


def test_pages_outside_the_pool_or_a_strided_array_are_never_written_through():
    a = PageAllocator(8, 1)
    pages, _ = a.alloc_pages(4)
    before = _state(a)
    with pytest.raises(ValueError, match=r"pages: page 8 is outside \[0, 8\)"):
        allocator_mod._pages.give(a._stack, a._top, a._owned, np.array([1, 8], np.int64))
    assert _state(a) == before
    a.free_pages(np.arange(8, dtype=np.int64)[0:4:2])  # strided: the numpy code frees it
    assert a.available() == 6 and not a._owned[[0, 2]].any() and a._owned[[1, 3]].all()
