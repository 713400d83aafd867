"""A route's new size class takes the triton layout's static part from the newest class
of the route when it fits (the first load of a new class does not rebuild it): the layout
is the one built from scratch, field for field and byte for byte, and the copies are
exact. A class whose jobs with rows differ, whose pairs differ or whose tables differ
builds its own."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot
from transfer_kernels import FaultyBackend, StagedBackend, TritonBackend
from transfer_kernels.backends.triton import TritonKernel
from transfer_kernels.backends.triton_layout import Layout, Static, layout
from transfer_kernels.rows import Lane

MAX_PROGRAMS = 3
VPT = TritonBackend().vpt
# (rows per job, where the groups are cut in the flat pairs): one route's size classes
CLASSES = [((4, 3, 2), (2, 5)),
           ((5, 2, 3), (4,)),
           ((1, 1, 1), (1, 2, 3, 4, 5, 6, 7)),
           ((3, 0, 2), (2, 5)),  # job 1 without rows: a static of its own
           ((2, 0, 4), (3,)),  # the same jobs with rows: takes the previous one's
           ((4, 3, 2), (6,)),  # every job has rows again: its own once more
           ((3, 0, 0), (2,)),  # 16-byte rows alone: every launch at 16 bytes, for any cut
           ((2, 0, 0), (1, 4)),
           ((0, 0, 0), (2,)),  # no rows at all: nothing to launch
           ((0, 0, 0), (1, 3))]
SHARES = [False, True, True, False, True, False, False, True, False, True]  # the previous class's


def _pools(gen, layout_="page_first"):
    """16-byte aligned rows, 133-byte rows (1-byte vectors), 20 + 4-byte rows (4-byte)."""
    return [make_pool(gen, 3, 12, [((16,), torch.bfloat16)] * 2, layout_),
            make_pool(gen, 2, 9, [((133,), torch.uint8)], "layer_first"),
            make_pool(gen, 3, 10, [((20,), torch.uint8), ((1,), torch.float32)], layout_)]


def _lanes(pools, direction):
    return [Lane(p.host_table, p.device_table, tuple(range(p.host_table.num_layers))) if direction == "h2d"
            else Lane(p.device_table, p.host_table, tuple(range(p.host_table.num_layers))) for p in pools]


def _flat(lanes):
    """Every (job, layer) pair, layer by layer like a model's: the order every class shares."""
    return [(j, layer) for layer in range(3) for j, lane in enumerate(lanes) if layer < len(lane.layers)]


def _groups(lanes, cuts):
    flat, bounds = _flat(lanes), (0, *cuts, len(_flat(lanes)))
    return tuple(tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))


def _rows(gen, pools, counts):
    got = [random_map(gen, p.num_rows, p.num_rows, n) for p, n in zip(pools, counts)]
    return [s for s, _ in got], [d for _, d in got]


def _assert_same_layout(got: Layout, want: Layout):
    assert (got.head is None) == (want.head is None)
    assert got.head is None or torch.equal(got.head, want.head)
    for field in Layout._fields[1:]:
        assert getattr(got, field) == getattr(want, field), field


def _assert_same_static(got: Static, want: Static):
    for field in ("pairs", "has_rows", "wide"):
        assert getattr(got, field) == getattr(want, field), field
    assert [r() for r in got.tables] == [r() for r in want.tables]
    for field in ("seg", "seg_job", "used", "seg_at", "row_bytes", "seg_align"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), field


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_a_layout_from_a_shared_static_is_the_one_built_from_scratch(gen, direction):
    pools = _pools(gen)
    lanes = _lanes(pools, direction)
    route = TritonBackend().route(lanes, lanes[0].src.device if direction == "d2h" else lanes[0].dst.device)
    previous, wide = None, set()
    for (counts, cuts), shares in zip(CLASSES, SHARES):
        plan = route.plan(*_rows(gen, pools, counts))
        groups = _groups(lanes, cuts)
        static, got = layout(plan, groups, MAX_PROGRAMS, VPT, previous)
        scratch, want = layout(plan, groups, MAX_PROGRAMS, VPT)
        assert (static is previous) == shares, (counts, cuts)
        _assert_same_static(static, scratch)
        _assert_same_layout(got, want)
        previous = static
        wide.add(static.wide)
    assert wide == {True, False}  # both ways of filling the vectors per row


def test_a_static_of_other_tables_or_other_pairs_does_not_fit(gen):
    # Twin pools of the same geometry: the same pairs and row counts, other addresses.
    mine, twin = _pools(gen), _pools(gen)
    counts, cuts = CLASSES[0]
    lanes, twin_lanes = _lanes(mine, "h2d"), _lanes(twin, "h2d")
    plan = TritonBackend().route(lanes, lanes[0].dst.device).plan(*_rows(gen, mine, counts))
    twin_plan = TritonBackend().route(twin_lanes, lanes[0].dst.device).plan(*_rows(gen, twin, counts))
    static, _ = layout(plan, _groups(lanes, cuts), MAX_PROGRAMS, VPT)
    got_static, got = layout(twin_plan, _groups(twin_lanes, cuts), MAX_PROGRAMS, VPT, static)
    assert got_static is not static
    _assert_same_layout(got, layout(twin_plan, _groups(twin_lanes, cuts), MAX_PROGRAMS, VPT)[1])
    reordered = tuple(reversed(_groups(lanes, cuts)))  # the same pairs in another launch order
    assert layout(plan, reordered, MAX_PROGRAMS, VPT, static)[0] is not static


def _kernel_prepared(prepared):
    """The triton kernel step inside a backend's prepared object."""
    kernel = prepared.kernel
    while not isinstance(kernel, TritonKernel):
        kernel = kernel.inner
    return kernel


@pytest.mark.parametrize("backend", ["triton", "faulty", "dma"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_a_route_shares_the_static_across_size_classes_and_copies_exactly(gen, backend, direction):
    # layer_first host pools: the dma backend stages none of them (its kernel takes the
    # lanes' own tables, so its preparation shares the static like the triton backend's).
    impl = {"triton": TritonBackend(max_programs=MAX_PROGRAMS),
            "faulty": FaultyBackend(TritonBackend(max_programs=MAX_PROGRAMS), fail_on_launch=1 << 30),
            "dma": StagedBackend(TritonBackend(max_programs=MAX_PROGRAMS))}[backend]
    pools = _pools(gen, "layer_first")
    lanes = _lanes(pools, direction)
    device = lanes[0].src.device if direction == "d2h" else lanes[0].dst.device
    route = impl.route(lanes, device)
    previous = None
    for key, ((counts, cuts), shares) in enumerate(zip(CLASSES, SHARES)):
        src_rows, dst_rows = _rows(gen, pools, counts)
        groups = _groups(lanes, cuts)
        prepared = route.prepare(key, route.plan(src_rows, dst_rows), groups)
        kernel = _kernel_prepared(prepared)
        assert (previous is not None and kernel.static is previous) == shares, (counts, cuts)
        _assert_same_layout(kernel.layout, layout(route.plan(src_rows, dst_rows), groups,
                                                  MAX_PROGRAMS, VPT)[1])
        befores = [(snapshot(lane.src), snapshot(lane.dst)) for lane in lanes]
        launches = prepared.start(route.lanes, src_rows, dst_rows)
        for g in range(len(groups)):
            launches.launch(g)
        for lane, (sb, db), s, d in zip(lanes, befores, src_rows, dst_rows):
            assert_copied(lane.src, lane.dst, sb, db, s, d)
        previous = kernel.static


def test_staged_jobs_build_their_own_static_and_copy_exactly(gen):
    # page_first host pools are staged: the kernel's side is each class's own staging
    # table, so no static fits (the tables differ) and each class builds its own.
    impl = StagedBackend(TritonBackend(max_programs=MAX_PROGRAMS))
    pools = _pools(gen, "page_first")
    lanes = _lanes(pools, "h2d")
    route = impl.route(lanes, lanes[0].dst.device)
    statics = []
    for key, (counts, cuts) in enumerate(CLASSES[:3]):
        src_rows, dst_rows = _rows(gen, pools, counts)
        prepared = route.prepare(key, route.plan(src_rows, dst_rows), _groups(lanes, cuts))
        assert prepared.swaps  # staged
        statics.append(_kernel_prepared(prepared).static)
        befores = [(snapshot(lane.src), snapshot(lane.dst)) for lane in lanes]
        launches = prepared.start(route.lanes, src_rows, dst_rows)
        for g in range(len(cuts) + 1):
            launches.launch(g)
        for lane, (sb, db), s, d in zip(lanes, befores, src_rows, dst_rows):
            assert_copied(lane.src, lane.dst, sb, db, s, d)
    assert len({id(s) for s in statics}) == 3
