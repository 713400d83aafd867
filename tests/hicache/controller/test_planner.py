"""A batch's pool set (`BatchPlanner`, fixed at construction) and its rows (`BatchPlanner.rows`)
make exactly the plan of the oracles ``plan_jobs`` + ``trusted_plan`` (issue 21).

The rows come from the allocator's pages where a page is one row; whatever path they take,
the jobs (order, tables, layers), their rows and the load groups' pools must be those of
the general path, for one op, ops queued one by one, ``load_many``'s merged ops, ops of a
server allocator (no pages kept) and backups.
"""
from __future__ import annotations

import pytest
import torch

from tests.hicache.controller.oracles import plan_jobs
from tests.hicache.controller.test_controller import STACKS, alloc_device, backup, fill_random, make
from tests.transfer_kernels.oracles import trusted_plan
from hicache.controller.batch import merge
from transfer_kernels import CopyPlan, PlannedJob


def _queued_loads(cache, how: str, gen) -> list:
    """Queued load ops of backed-up pages: ``how`` = one | each | many."""
    ctrl = cache.controller
    count = 1 if how == "one" else 3
    hosts = [backup(cache, *alloc_device(cache, pages=1)) for _ in range(count)]
    reqs = [(h[cache.stack.anchor.name], {n: s for n, s in h.items() if n != cache.stack.anchor.name} or None)
            for h in hosts]
    if how == "many":
        assert ctrl.load_many(reqs) is not None
    else:
        for anchor, extra in reqs:
            assert ctrl.load(anchor, extra) is not None
    ops = ctrl._queue.take("h2d")
    return ops


def _plan(ctrl, ops, direction: str):
    """The batch's plan as the controller launches it: its pool set's lanes with its rows."""
    planner = ctrl._planners[direction]
    pool_set, src_rows, dst_rows, rows = planner.rows(ops)
    assert pool_set is planner.pool_sets[frozenset(merge(ops, "src"))]
    jobs = tuple(PlannedJob(lane.src, lane.dst, s, d, lane.layers)
                 for lane, s, d in zip(pool_set.lanes, src_rows, dst_rows))
    return CopyPlan(jobs, planner.device), pool_set.pools, rows


def _assert_same_plan(ctrl, ops, direction: str) -> None:
    planner = ctrl._planners[direction]
    jobs = plan_jobs(ctrl.stack, ops, planner.tables.__getitem__, planner.dst_pages)
    want = trusted_plan(jobs.values(), planner.device)
    plan, pools, rows = _plan(ctrl, ops, direction)
    assert pools == tuple(name for name, _ in jobs)
    assert rows == tuple(job.num_rows for job in want.jobs)
    assert plan.device == want.device and len(plan.jobs) == len(want.jobs)
    for got, exp in zip(plan.jobs, want.jobs):
        assert got.src is exp.src and got.dst is exp.dst and got.layers == exp.layers
        assert got.src_rows.dtype == got.dst_rows.dtype == torch.int64
        assert torch.equal(got.src_rows, exp.src_rows) and torch.equal(got.dst_rows, exp.dst_rows)


@pytest.mark.parametrize("how", ["one", "each", "many"])
@pytest.mark.parametrize("stack_name", ["dsv4", "mha_int8", "mla"])
def test_load_plan_equals_the_general_path(stack_name, how, gen):
    cache = make(stack_name)
    fill_random(cache, gen)
    _assert_same_plan(cache.controller, _queued_loads(cache, how, gen), "h2d")


@pytest.mark.parametrize("stack_name", ["dsv4", "mla"])
def test_backup_plan_equals_the_general_path(stack_name, gen):
    cache = make(stack_name)
    ctrl = cache.controller
    for _ in range(2):
        assert ctrl.write(*alloc_device(cache, pages=1)) is not None
    ops = ctrl._queue.take("d2h")
    _assert_same_plan(ctrl, ops, "d2h")


def test_ops_without_pages_take_the_slots_and_refuse_a_shared_page(gen):
    # a server allocator's ops keep no pages: rows from the slots; a page handed to two
    # ops of the batch is refused, named by its first slot
    cache = make("dsv4")
    fill_random(cache, gen)
    ops = _queued_loads(cache, "each", gen)
    for op in ops:
        op.stamps = None
    _assert_same_plan(cache.controller, ops, "h2d")
    ops[1].dst = dict(ops[0].dst)
    first = int(ops[0].dst["kv"][0])
    with pytest.raises(ValueError, match=rf"pool 'kv': page {first} belongs to two ops"):
        _plan(cache.controller, ops, "h2d")


def test_a_shared_page_is_named_alike_on_the_pages_path(gen):
    cache = make("dsv4")
    fill_random(cache, gen)
    ops = _queued_loads(cache, "each", gen)
    ops[2].stamps = dict(ops[2].stamps, kv=ops[0].stamps["kv"])
    first = int(ops[0].dst["kv"][0])
    with pytest.raises(ValueError, match=rf"pool 'kv': page {first} belongs to two ops"):
        _plan(cache.controller, ops, "h2d")
