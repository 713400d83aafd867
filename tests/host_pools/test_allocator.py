"""`PageAllocator`: alloc/free, refusals that change nothing, invariants under random use, threads."""
from __future__ import annotations

import threading
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_pools import allocator as allocator_mod
from host_pools.allocator import PageAllocator


def _snapshot(a: PageAllocator) -> tuple[int, int]:
    a.check_integrity()
    return a.available(), a.used()


def _assert_whole_pages(slots: torch.Tensor, page_size: int) -> None:
    runs = slots.view(-1, page_size)
    assert bool((runs[:, 0] % page_size == 0).all()), f"{runs[:, 0]=}"
    assert torch.equal(runs, runs[:, :1] + torch.arange(page_size)), "pages must be consecutive runs"


# ---------------------------------------------------------------- basics


def test_construction_rejects_bad_sizes():
    with pytest.raises(ValueError, match="page_size"):
        PageAllocator(16, page_size=0)
    with pytest.raises(ValueError, match="num_slots"):
        PageAllocator(10, page_size=4)
    with pytest.raises(ValueError, match="num_slots"):
        PageAllocator(-4)


def test_alloc_free_basics():
    a = PageAllocator(10)
    # a fresh allocator hands out ascending, contiguous slots
    first = a.alloc(4)
    assert first.dtype == torch.int64 and first.tolist() == [0, 1, 2, 3]
    assert (a.available(), a.used()) == (6, 4)
    second = a.alloc(6)
    assert sorted(second.tolist()) == [4, 5, 6, 7, 8, 9] and a.available() == 0
    assert a.is_owned(first) and a.is_owned(second)
    # give the first block back: it is free again and can be re-allocated
    assert a.free(first) == 4
    assert a.available() == 4 and not a.is_owned(first)
    again = a.alloc(4)
    assert sorted(again.tolist()) == [0, 1, 2, 3]
    a.check_integrity()


def test_alloc_zero_returns_empty():
    a = PageAllocator(8, page_size=4)
    out = a.alloc(0)
    assert out.numel() == 0 and a.available() == 8
    assert a.free(out) == 0 and a.available() == 8


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_returns_none_when_short_and_changes_nothing(page_size):
    a = PageAllocator(8 * page_size, page_size)
    held = a.alloc(6 * page_size)
    before = _snapshot(a)
    # 2 pages are left; asking for 3 pages must fail without taking the 2
    assert a.alloc(3 * page_size) is None
    assert _snapshot(a) == before
    assert a.alloc(2 * page_size) is not None and a.available() == 0
    assert a.alloc(page_size) is None
    assert a.is_owned(held)


@pytest.mark.parametrize("page_size", [2, 64])
def test_page_aligned_slots(page_size):
    a = PageAllocator(8 * page_size, page_size)
    # scramble the free list: allocate everything and free every other page
    everything = a.alloc(8 * page_size)
    pages = everything.view(8, page_size)
    a.free(pages[1::2].reshape(-1))
    a.free(pages[0:1].reshape(-1))
    got = a.alloc(3 * page_size)
    assert got.numel() == 3 * page_size
    _assert_whole_pages(got, page_size)
    # slots of one call are ascending within each page and every page is distinct
    assert len(set(got.view(-1, page_size)[:, 0].tolist())) == 3
    a.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_is_ascending_within_a_call(page_size):
    a = PageAllocator(8 * page_size, page_size)
    everything = a.alloc(8 * page_size).view(8, page_size)
    # free page 5, then page 2, in one call; both come back in the next alloc
    a.free(torch.cat([everything[5], everything[2]]))
    got = a.alloc(2 * page_size)
    assert got.tolist() == sorted(got.tolist())


# ---------------------------------------------------------------- refusals change nothing


def _refusal_cases(page_size: int):
    """(id, slots to free) pairs, against an allocator holding pages 0..3 of 8."""
    ps = page_size
    page = lambda p: torch.arange(p * ps, (p + 1) * ps)  # noqa: E731
    cases = [
        ("double_free", page(5)),  # page 5 was never allocated
        ("out_of_range_high", torch.arange(8 * ps, 9 * ps)),
        ("out_of_range_negative", torch.arange(-ps, 0)),
        ("repeated_page", torch.cat([page(1), page(1)])),
        ("mixed_owned_and_free", torch.cat([page(0), page(6)])),
        ("float", page(0).to(torch.float32)),
        ("bool", torch.ones(ps, dtype=torch.bool)),  # never cast to slots 0/1
        ("complex", page(0).to(torch.complex64)),
        ("list", page(0).tolist()),
        ("two_d", page(0).view(1, -1)),
    ]
    if ps > 1:
        cases += [
            ("unaligned", torch.arange(ps // 2, ps // 2 + ps)),
            ("partial_page", page(2)[:-1]),
            ("non_consecutive", torch.cat([page(2)[:-1], page(2)[:1]])),
        ]
    return cases


@pytest.mark.parametrize("page_size", [1, 4])
def test_free_refusals_change_nothing(page_size):
    for case, bad in _refusal_cases(page_size):
        a = PageAllocator(8 * page_size, page_size)
        held = a.alloc(4 * page_size)
        before = _snapshot(a)
        with pytest.raises(ValueError, match="slots"):
            a.free(bad)
        assert _snapshot(a) == before, case
        assert a.is_owned(held), case


def test_second_free_of_the_same_slots_is_rejected():
    a = PageAllocator(16, page_size=4)
    slots = a.alloc(8)
    # the first free succeeds, the second is a double free and changes nothing
    a.free(slots)
    before = _snapshot(a)
    with pytest.raises(ValueError, match="double free"):
        a.free(slots)
    assert _snapshot(a) == before


def test_free_pages_of_the_holders_own_records():
    # the trusted free (pages from pages_of): slots go back; a page already free is
    # still refused and nothing changes
    a = PageAllocator(16, page_size=4)
    slots = a.alloc(12)
    pages = a.pages_of(slots)
    assert a.free_pages(pages[:2]) == 8 and a.available() == 12
    before = _snapshot(a)
    with pytest.raises(ValueError, match=r"double free .* starting at \[0, 4\]"):
        a.free_pages(pages)
    assert _snapshot(a) == before and a.is_owned(slots[8:])
    a.check_integrity()


# a 0-d tensor (or a float, a bool) used to pass the checks and hand out slots
@pytest.mark.parametrize("n,error", [(3, ValueError), (6, ValueError), (-4, ValueError),
                                     (torch.tensor(4), TypeError), (4.0, TypeError), (True, TypeError),
                                     ("4", TypeError), (None, TypeError)])
def test_alloc_rejects_a_bad_count_and_changes_nothing(n, error):
    a = PageAllocator(16, page_size=4)
    before = _snapshot(a)
    with pytest.raises(error, match="num_slots"):
        a.alloc(n)
    assert _snapshot(a) == before


def test_non_integer_slot_dtypes_are_named_in_the_error():
    a = PageAllocator(8, page_size=1)
    a.alloc(2)
    with pytest.raises(ValueError, match=r"slots: need a 1-D integer tensor, got a torch.bool tensor"):
        a.free(torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"host_indices: need a 1-D integer tensor"):
        a.pages_of(torch.tensor([0.0, 1.0]), what="host_indices")
    assert a.is_owned(torch.tensor([0, 1], dtype=torch.uint8)) and a.available() == 6


def test_construction_rejects_sizes_that_are_not_ints():
    with pytest.raises(TypeError, match="num_slots"):
        PageAllocator(torch.tensor(16))
    with pytest.raises(TypeError, match="page_size"):
        PageAllocator(16, page_size=2.0)


def test_free_accepts_int32():
    a = PageAllocator(8, page_size=2)
    slots = a.alloc(4)
    assert a.free(slots.to(torch.int32)) == 4 and a.available() == 8


# ---------------------------------------------------------------- property test

_OPS = st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=12)), min_size=1, max_size=60)


@settings(max_examples=80, deadline=None)
@given(page_size=st.sampled_from([1, 2, 8]), num_pages=st.integers(1, 24), ops=_OPS)
def test_random_alloc_free_keeps_invariants(page_size, num_pages, ops):
    a = PageAllocator(num_pages * page_size, page_size)
    owned: list[torch.Tensor] = []  # blocks we hold, in allocation order
    owned_slots: set[int] = set()
    for is_alloc, k in ops:
        if is_alloc:
            got = a.alloc(k * page_size)
            if k > num_pages - len(owned_slots) // page_size:
                assert got is None
                continue
            assert got is not None and got.numel() == k * page_size
            _assert_whole_pages(got, page_size)
            new = set(got.tolist())
            assert not new & owned_slots, "a slot was handed out twice"
            assert len(new) == got.numel()
            owned_slots |= new
            owned.append(got)
        elif owned:
            block = owned.pop(k % len(owned))
            assert a.free(block) == block.numel()
            owned_slots -= set(block.tolist())
        # free + used = total, and our view of ownership matches the allocator's
        assert a.available() + len(owned_slots) == a.num_slots
        assert a.used() == len(owned_slots)
        a.check_integrity()
    for block in owned:
        assert a.is_owned(block)


# ---------------------------------------------------------------- threads


def test_concurrent_alloc_free_stays_consistent():
    a = PageAllocator(64 * 16, page_size=16)
    num_threads, rounds = 6, 300
    kept: list[list[torch.Tensor]] = [[] for _ in range(num_threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(num_threads)

    def worker(tid: int) -> None:
        try:
            g = torch.Generator().manual_seed(100 + tid)
            start.wait()
            mine: list[torch.Tensor] = []
            for _ in range(rounds):
                n = int(torch.randint(1, 5, (1,), generator=g)) * 16
                got = a.alloc(n)
                if got is not None:
                    mine.append(got)
                if mine and (got is None or int(torch.randint(0, 2, (1,), generator=g))):
                    a.free(mine.pop(0))
            kept[tid] = mine
        except BaseException as exc:  # surfaced below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # every kept slot is owned by exactly one thread, and the counts add up
    all_kept = [s for mine in kept for block in mine for s in block.tolist()]
    assert len(all_kept) == len(set(all_kept))
    assert a.used() == len(all_kept) and a.available() + a.used() == a.num_slots
    a.check_integrity()
    for mine in kept:
        for block in mine:
            a.free(block)
    assert a.available() == a.num_slots
    a.check_integrity()


@pytest.mark.parametrize("pages", [3, 100])  # the Python path (few pages) and numpy's
def test_pages_of_refuses_repeats_and_range_at_any_size(pages):
    a = PageAllocator(256 * 4, 4)
    slots = torch.arange(pages * 4)
    assert a.pages_of(slots).tolist() == list(range(pages))
    with pytest.raises(ValueError, match="twice"):
        a.pages_of(torch.cat([slots, slots[:4]]))
    with pytest.raises(ValueError, match=r"in \[0, 1024\)"):
        a.pages_of(torch.cat([slots, torch.arange(1024, 1028)]))
    with pytest.raises(ValueError, match=r"in \[0, 1024\)"):
        a.pages_of(torch.cat([torch.arange(-4, 0), slots]))
    with pytest.raises(ValueError, match="aligned, consecutive"):
        a.pages_of(slots + 1)


def test_alloc_pages_ascend_and_bump_generations_for_0_1_and_many_pages():
    # one page, a fresh run (slices) and a scattered set (freed in random order) alike
    a = PageAllocator(64, page_size=4)
    assert [p.tolist() for p in a.alloc_pages(0)] == [[], []]
    pages, gens = a.alloc_pages(1)
    assert pages.tolist() == [0] and gens.tolist() == [1]
    pages, gens = a.alloc_pages(3)
    assert pages.tolist() == [1, 2, 3] and gens.tolist() == [1, 1, 1]
    a.free_pages(pages[[2, 0]])  # pages 3 and 1 back, pushed out of order
    pages, gens = a.alloc_pages(2)
    assert pages.tolist() == [1, 3] and gens.tolist() == [2, 2]
    pages, gens = a.alloc_pages(1)
    assert pages.tolist() == [4] and gens.tolist() == [1]
    gens[0] = 99  # the generations handed out are a copy
    assert a.generations(pages).tolist() == [1]
    assert a.alloc_pages(12) is None and a.available() == 11 * 4
    a.check_integrity()


@settings(max_examples=60, deadline=None)
@given(page_size=st.sampled_from([1, 4]), num_pages=st.integers(1, 40),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 70)), max_size=60))
def test_pages_never_handed_out_come_as_the_general_path_gives_them(page_size, num_pages, ops):
    """A run of pages still in the stack's first order is handed out without reading the
    stack (``_fresh``): pages, generations and records equal the general path's. Both
    run the numpy code (the shortcut is its own; the compiled one reads the stack)."""
    with mock.patch.object(allocator_mod, "_pages", None):
        _fresh_run_matches(page_size, num_pages, ops)


def _fresh_run_matches(page_size: int, num_pages: int, ops: list) -> None:
    fast, ref = PageAllocator(num_pages * page_size, page_size), PageAllocator(num_pages * page_size, page_size)
    ref._fresh = -1  # the reference never takes the shortcut
    held: list = []
    for free, k in ops:
        if free and held:
            pages_fast, pages_ref = held.pop(k % len(held))
            assert fast.free_pages(pages_fast) == ref.free_pages(pages_ref)
            continue
        got, want = fast.alloc_pages(k % 7), ref.alloc_pages(k % 7)
        assert (got is None) == (want is None)
        if got is not None:
            assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
            assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
            held.append((got[0], want[0]))
        fast.check_integrity()
        assert (fast.generations(np.arange(num_pages)) == ref.generations(np.arange(num_pages))).all()
