"""FaultyBackend: the controller's fault-injection seam fails exactly one launch."""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import assert_copied, assert_unchanged, make_pool, snapshot
from transfer_kernels import CopyJob, FaultyBackend, TorchBackend, copy_rows, copy_rows_batch


@pytest.mark.parametrize("inner", ["torch", "copy_engine", "triton", "auto"])
def test_fails_only_on_the_chosen_launch(gen, inner):
    pool = make_pool(gen, 2, 6, [((24,), torch.uint8)])
    src, dst = pool.host_table, pool.device_table
    backend = FaultyBackend(inner, fail_on_launch=2)
    assert backend.name == f"faulty({inner})"
    # Launch 1 copies row 0 -> 1.
    before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, [0], [1], backend=backend)
    assert_copied(src, dst, *before, [0], [1])
    # Launch 2 raises before copying anything.
    before = snapshot(src), snapshot(dst)
    with pytest.raises(RuntimeError, match="injected fault on launch 2"):
        copy_rows(src, dst, [2, 3], [4, 5], backend=backend)
    assert_unchanged(dst, before[1])
    # two tried, one ran (a launch is counted once it ran)
    assert backend.attempts == 2 and backend.launches == 1 and backend.inner.launches >= 1
    # Launch 3 copies again.
    copy_rows(src, dst, [2, 3], [4, 5], backend=backend)
    assert_copied(src, dst, *before, [2, 3], [4, 5])
    assert backend.attempts == 3 and backend.launches == 2


def test_batch_fault_copies_no_pool(gen):
    # A faulty first launch of a 2-pool batch leaves both destinations untouched.
    pools = [make_pool(gen, 2, 4, [((8,), torch.float32)], name=n) for n in ("a", "b")]
    inner = TorchBackend()
    backend = FaultyBackend(inner, fail_on_launch=1)
    befores = [snapshot(p.device_table) for p in pools]
    with pytest.raises(RuntimeError, match="injected fault on launch 1"):
        copy_rows_batch([CopyJob(p.host_table, p.device_table, [0, 1], [2, 3]) for p in pools],
                        backend=backend)
    for p, before in zip(pools, befores):
        assert_unchanged(p.device_table, before)
    assert inner.launches == 0 and backend.inner is inner


def test_invalid_input_is_not_a_launch(gen):
    # Validation errors come before the launch counter moves.
    pool = make_pool(gen, 1, 4, [((8,), torch.uint8)])
    backend = FaultyBackend("torch", fail_on_launch=1)
    with pytest.raises(ValueError):
        copy_rows(pool.host_table, pool.device_table, [0], [9], backend=backend)
    assert backend.launches == backend.attempts == 0
