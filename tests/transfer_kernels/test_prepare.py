"""Prepared launch groups on every backend, and the unchecked internal plan path."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import (assert_copied, make_pool, random_map, snapshot,
                                          sync)
from transfer_kernels import CopyJob, FaultyBackend, get_backend, make_plan
from tests.transfer_kernels.oracles import trusted_plan
from transfer_kernels.rows import exec_device


def _jobs(gen):
    """Three pools (2, 2 and 3 layers) with random row maps, one with no rows at all."""
    pools = [make_pool(gen, 2, 9, [((16,), torch.bfloat16)] * 2, "page_first"),
             make_pool(gen, 2, 5, [((133,), torch.uint8)], "layer_first"),
             make_pool(gen, 3, 7, [((20,), torch.uint8), ((1,), torch.float32)], "page_first")]
    jobs = [CopyJob(p.host_table, p.device_table, *random_map(gen, p.num_rows, p.num_rows, 4))
            for p in pools]
    empty = torch.empty(0, dtype=torch.int64)
    jobs.append(CopyJob(pools[0].host_table, pools[0].device_table, empty, empty))
    return jobs


@pytest.mark.parametrize("backend", ["torch", "copy_engine", "triton", "auto"])
def test_each_group_copies_exactly_its_pairs(gen, backend):
    # Four launch groups like four model layers; group 1 has only the empty job (job 3):
    # it launches nothing. After each launch exactly the listed (job, layer) pairs moved.
    jobs = _jobs(gen)
    plan = make_plan(jobs)
    groups = [[(0, 0), (2, 0)], [(3, 0)], [(1, 1), (0, 1), (2, 2)], [(1, 0), (2, 1)]]
    impl = get_backend(backend)
    prepared = impl.prepare(plan, groups)
    assert prepared.num_groups == 4
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs[:3]]
    done: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for g, group in enumerate(groups):
        prepared.launch(g)
        sync()
        for j, layer in group:
            if j < 3:
                done[j].append(layer)
        for j, job in enumerate(jobs[:3]):
            assert_copied(job.src, job.dst, *befores[j], job.src_rows, job.dst_rows,
                          layers=done[j])
    if backend != "auto":  # auto counts one launch per group it is asked for
        assert impl.launches == 3


def test_faulty_backend_fails_the_chosen_group_only(gen):
    # The generic preparation counts one launch per non-empty group once it ran; the
    # second one tried raises.
    jobs = _jobs(gen)
    impl = FaultyBackend("torch", fail_on_launch=2)
    prepared = impl.prepare(make_plan(jobs), [[(0, 0)], [(0, 1)], [(1, 0)]])
    prepared.launch(0)
    with pytest.raises(RuntimeError, match="injected fault on launch 2"):
        prepared.launch(1)
    prepared.launch(2)
    assert impl.attempts == 3 and impl.launches == 2


def test_trusted_plan_matches_make_plan(gen):
    # The internal path builds the plan make_plan would, without checking: every layer.
    jobs = _jobs(gen)[:3]
    checked = make_plan(jobs)
    trusted = trusted_plan(jobs, exec_device(jobs[0].src, jobs[0].dst))
    assert trusted.device == checked.device
    for a, b in zip(trusted.jobs, checked.jobs):
        assert (a.src, a.dst, a.layers) == (b.src, b.dst, b.layers)
        assert torch.equal(a.src_rows, b.src_rows) and torch.equal(a.dst_rows, b.dst_rows)


def test_make_plan_still_refuses_double_writes(gen):
    # The public API keeps every check (the controller's trusted path does not weaken it).
    p = make_plan(_jobs(gen)[:1]).jobs[0]
    with pytest.raises(ValueError, match="written twice"):
        make_plan([CopyJob(p.src, p.dst, torch.tensor([0, 1]), torch.tensor([2, 2]))])


def test_triton_reuses_a_layout_only_for_the_same_shape(gen):
    # A second batch of the same size class (tables, row counts, groups) reuses the prepared
    # layout of its route and copies its own rows byte for byte; a batch with other row
    # counts builds its own; the route holds its tables weakly: a dead table's route never
    # serves a new table, and no pool is kept alive by the cache.
    groups = (((0, 0), (1, 0)), ((0, 1), (1, 1)))
    impl = get_backend("triton")
    pools = [make_pool(gen, 2, 9, [((16,), torch.bfloat16)] * 2, "page_first"),
             make_pool(gen, 2, 5, [((133,), torch.uint8)], "layer_first")]

    def run(count):
        jobs = [CopyJob(p.host_table, p.device_table, *random_map(gen, p.num_rows, p.num_rows, count))
                for p in pools]
        befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
        prepared = impl.prepare(make_plan(jobs), groups)
        for g in range(len(groups)):
            prepared.launch(g)
        sync()
        for j, job in enumerate(jobs):
            assert_copied(job.src, job.dst, *befores[j], job.src_rows, job.dst_rows, layers=[0, 1])

    run(4)
    (route,) = impl.route_cache.values()
    assert route.built == 1
    run(4)  # same size class, other rows: the whole layout reused, exact bytes
    assert list(impl.route_cache.values()) == [route] and route.built == 1
    run(3)  # other row counts: its own layout, on the same route
    assert list(impl.route_cache.values()) == [route] and route.built == 2
    assert route.alive
    pools.clear()  # the tables die: the route stays unmatched (weak references)
    import gc
    gc.collect()
    assert not route.alive
