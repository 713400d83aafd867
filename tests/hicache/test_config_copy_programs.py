"""``max_copy_programs`` (--hicache-max-copy-programs): the tuned default, the bound, and
that the default ``auto`` backend honours it (issue 18 item 14, review A.4)."""
from __future__ import annotations

import argparse

import pytest

from hicache import HiCacheConfig, build
from hicache.config import MAX_COPY_PROGRAMS, add_hicache_args
from hicache.controller.launcher import make_backend
from hicache.models import mha
from transfer_kernels import AutoBackend, TritonBackend, tuning


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_hicache_args(argparse.ArgumentParser()).parse_args(argv)


def test_bound_is_the_transfer_layers():
    assert MAX_COPY_PROGRAMS == tuning.MAX_COPY_PROGRAMS


@pytest.mark.parametrize("value", [0, -1, MAX_COPY_PROGRAMS + 1, 2 ** 63, 2 ** 64])
def test_out_of_range_is_refused_naming_the_flag(value):
    # 2**63 used to be accepted, and then every triton launch failed and rolled back.
    with pytest.raises(ValueError, match="--hicache-max-copy-programs"):
        HiCacheConfig.from_args(_parse(["--hicache-max-copy-programs", str(value)]))


@pytest.mark.parametrize("value", [True, 8.0, "8"])
def test_wrong_type_is_refused_naming_the_flag(value):
    with pytest.raises(TypeError, match="--hicache-max-copy-programs"):
        HiCacheConfig(max_copy_programs=value)


@pytest.mark.parametrize("value", [None, 1, 16, MAX_COPY_PROGRAMS])
def test_default_and_bounds_are_accepted(value):
    argv = [] if value is None else ["--hicache-max-copy-programs", str(value)]
    assert HiCacheConfig.from_args(_parse(argv)).max_copy_programs == value


@pytest.mark.parametrize("io_backend", ["auto", "triton"])
@pytest.mark.parametrize("value", [None, 8])
def test_auto_and_triton_honour_it(io_backend, value):
    backend = make_backend(HiCacheConfig(io_backend=io_backend, max_copy_programs=value))
    triton = backend.inner["triton"] if io_backend == "auto" else backend
    assert isinstance(triton, TritonBackend) and triton.max_programs == value
    if io_backend == "auto":
        assert isinstance(backend, AutoBackend)
        assert backend.inner["dma"].kernel is triton  # the staged path's kernel too
    if value is None:
        assert triton.grid_cap(__import__("torch").device("cuda")) == tuning.TRITON_MAX_PROGRAMS


def test_built_controller_honours_it():
    from host_pools.memory import HostBudget

    stack = mha(2, 1, 16, page_size=4, model="tiny")
    cache = build(stack, 64, HiCacheConfig(max_copy_programs=3), device="cpu",
                  budget=HostBudget(1 << 40, None, 0, 1, 1 << 40))
    assert cache.controller.backend.inner["triton"].max_programs == 3
    cache.close()
