"""The dma backend's and auto's per-shape caches (issue 21 item 2): a load of a seen shape
reuses the layout and fills in only its rows; a new table, row count or table at a reused
id is laid out again, never served stale addresses. CPU, byte-exact."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot
from transfer_kernels import AutoBackend, CopyJob, StagedBackend, TorchBackend, TritonBackend, \
    make_plan
from transfer_kernels.backends.auto_table import AutoTable, Rule
from transfer_kernels.backends.base import route_key

MIXED = [((8,), torch.bfloat16), ((3, 4), torch.float32), ((5,), torch.uint8)]
GROUPS = ((((0, 0),), ((0, 1), (0, 2))))  # two launch groups over the 3 layers


def _pool(gen):
    return make_pool(gen, 3, 16, MIXED, "page_first", device="cpu", pin=False)


def _sides(pool, direction):
    return ((pool.host_table, pool.device_table) if direction == "h2d"
            else (pool.device_table, pool.host_table))


def _load(backend, src, dst, src_rows, dst_rows) -> None:
    """Prepare one plan over both launch groups, launch them, check the bytes."""
    before = snapshot(src), snapshot(dst)
    prepared = backend.prepare(make_plan([CopyJob(src, dst, src_rows, dst_rows)]), GROUPS)
    for g in range(prepared.num_groups):
        prepared.launch(g)
    assert_copied(src, dst, *before, src_rows, dst_rows)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_a_seen_shape_reuses_its_layout_with_this_loads_rows(gen, kernel, direction):
    pool = _pool(gen)
    staged = StagedBackend(TorchBackend() if kernel == "torch" else TritonBackend())
    src, dst = _sides(pool, direction)
    for _ in range(3):  # other rows each time, same count: one layout
        _load(staged, src, dst, *random_map(gen, 16, 16, 5))
    assert staged.built == 1 and staged.copies == 3


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_new_tables_or_row_counts_are_laid_out_again(gen, direction):
    staged = StagedBackend(TorchBackend())
    first, second = _pool(gen), _pool(gen)  # same geometry, other memory
    _load(staged, *_sides(first, direction), *random_map(gen, 16, 16, 5))
    _load(staged, *_sides(second, direction), *random_map(gen, 16, 16, 5))
    _load(staged, *_sides(second, direction), *random_map(gen, 16, 16, 7))
    assert staged.built == 3


def test_a_new_table_at_a_reused_id_is_not_served_the_old_layout(gen):
    # Ids are reused once an object dies: the route cache verifies a hit against the
    # route's weak references. Stand the old route in under the new plan's key, as a
    # reused id would.
    staged = StagedBackend(TorchBackend())
    old, new = _pool(gen), _pool(gen)
    rows = random_map(gen, 16, 16, 5)
    _load(staged, old.host_table, old.device_table, *rows)
    stale = next(iter(staged.route_cache.values()))
    staged.route_cache.clear()
    staged.route_cache[route_key(make_plan([CopyJob(new.host_table, new.device_table, *rows)]))] = stale
    _load(staged, new.host_table, new.device_table, *rows)
    assert staged.built == 2  # the stale route was refused: a new one laid out its class
    (route,) = staged.route_cache.values()
    assert route is not stale and route.holds(make_plan([CopyJob(new.host_table, new.device_table,
                                                                  *rows)]).jobs)


def test_auto_routes_a_seen_shape_once_and_checks_tables_on_a_hit(gen):
    table = AutoTable(rules=(Rule("cpu", "dma", path="stage"),))
    auto = AutoBackend(triton=TritonBackend(), table=table)
    auto.inner["dma"].kernel = TorchBackend()
    first, second = _pool(gen), _pool(gen)
    for pool in (first, first, second):
        _load(auto, pool.host_table, pool.device_table, *random_map(gen, 16, 16, 5))
    assert len(auto.route_cache) == 2 and auto.inner["dma"].built == 2
    # a stale route under the new tables' key is refused: routed (and checked) again
    key_first, key_second = list(auto.route_cache)
    auto.route_cache[key_second] = auto.route_cache[key_first]
    _load(auto, second.host_table, second.device_table, *random_map(gen, 16, 16, 5))
    assert auto.route_cache[key_second].lanes[0].src is second.host_table
