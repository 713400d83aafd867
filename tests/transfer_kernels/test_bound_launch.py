"""The pre-bound triton launcher: the fast entry (a compiled kernel's low-level ``run``)
gets the same arguments as the ordinary launch, makes no ``torch.cuda`` call per launch,
and falls back to the ordinary launch for a variant it does not have.

On a machine without a GPU the "compiled" kernel is a stand-in whose ``run`` executes the
interpreter with exactly the arguments it was handed, so the bytes prove the packing.
"""
from __future__ import annotations

import pytest
import torch

from tests.transfer_kernels.pools import make_pool, random_map
from transfer_kernels import CopyJob, TritonBackend, make_plan
from transfer_kernels.backends.triton import kernel_module

CUDA_CALLS = ("current_stream", "current_device", "stream", "set_stream", "Event", "synchronize")


class FakeCompiled:
    """Mimics ``CompiledKernel``: ``run(gx, gy, gz, stream, function, packed, metadata,
    enter_hook, exit_hook, *args)`` runs the interpreted kernel on ``args``."""

    function, packed_metadata = "function", "packed"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args) -> None:
        assert (gy, gz, function, packed) == (1, 1, "function", "packed")
        self.calls.append((gx, stream, metadata, enter is not None))
        meta, prog_at, nf, vpt, align = args
        kernel_module()._interpreted[(gx,)](meta, prog_at, NF=nf, VPT=vpt, ALIGN=align)

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream)


def _prepared(gen):
    pools = [make_pool(gen, 3, 9, [((40,), torch.uint8), ((3,), torch.float32)], "page_first",
                       device="cpu"),
             make_pool(gen, 3, 6, [((24,), torch.uint8)], "layer_first", device="cpu")]
    jobs = [CopyJob(p.host_table, p.device_table, *random_map(gen, p.num_rows, p.num_rows, 4))
            for p in pools]
    groups = [[(0, 0), (1, 0)], [(0, 1)], [(1, 1), (0, 2), (1, 2)]]
    backend = TritonBackend(max_programs=3, tile_bytes=64)
    return pools, backend.prepare(make_plan(jobs), groups)


def _dst_bytes(pools) -> list[torch.Tensor]:
    return [v.view(torch.uint8).clone() for p in pools for views in p.device for v in views]


def _run_all(bound, launches: int) -> None:
    for g in range(launches):
        if bound.grids[g]:
            bound.launch(g)


@pytest.fixture
def no_cuda_calls(monkeypatch):
    """Every ``torch.cuda`` entry a launch could use raises."""
    def refuse(*_a, **_k):
        raise AssertionError("a torch.cuda call during a launch")
    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, refuse)


def test_fast_entry_copies_the_same_bytes_as_the_ordinary_launch(gen, monkeypatch):
    tk = kernel_module()
    pools, prepared = _prepared(gen)
    ls, lay, n = prepared.launcher, prepared.prepared.kernel.layout, prepared.num_groups
    start = [v.view(torch.uint8).clone() for p in pools for views in p.device for v in views]
    # 1. the ordinary launch (interpreter), group by group
    ordinary = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps)
    assert not ordinary.fast
    _run_all(ordinary, n)
    want = _dst_bytes(pools)
    assert any(not torch.equal(a, b) for a, b in zip(want, start))
    # 2. back to the start, then the fast entry with every variant "compiled"
    flat = [v.view(torch.uint8) for p in pools for views in p.device for v in views]
    for v, s in zip(flat, start):
        v.copy_(s)
    fake = FakeCompiled()
    kernels = {(None, ls.vpt, a, ls.num_warps): fake for a in set(lay.aligns)}
    def refuse(*_a, **_k):
        raise AssertionError("a torch.cuda call during a fast launch")
    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, refuse)
    fast = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps,
                            kernels=kernels, stream=1234)
    _run_all(fast, n)
    assert all(torch.equal(a, b) for a, b in zip(_dst_bytes(pools), want))
    live = [g for g in range(n) if lay.grids[g]]
    assert [c[:3] for c in fake.calls] == [(lay.grids[g], 1234, None) for g in live]


def test_a_variant_not_compiled_takes_the_ordinary_launch(gen, no_cuda_calls):
    tk = kernel_module()
    pools, prepared = _prepared(gen)
    ls, lay = prepared.launcher, prepared.prepared.kernel.layout
    fast = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps,
                            kernels={}, stream=5)
    start = _dst_bytes(pools)
    _run_all(fast, prepared.num_groups)  # no variant: the interpreter, same as ordinary
    assert any(not torch.equal(a, b) for a, b in zip(_dst_bytes(pools), start))


class ChangedSignature(FakeCompiled):
    """A compiled kernel whose launcher takes other arguments (a newer triton): ``run``
    refuses the call with a ``TypeError`` before launching anything."""

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit_, meta, prog_at):
        raise AssertionError("never reached: the call does not fit this signature")

    def __getattribute__(self, name):
        if name == "run":
            object.__getattribute__(self, "calls").append("run")
        return object.__getattribute__(self, name)


def test_a_fast_entry_with_changed_arguments_falls_back_per_variant(gen, no_cuda_calls):
    # Issue 26 item 6: the first fast call of each variant raises TypeError; that launch and
    # every later one of the variant (in this launcher and the next) take the ordinary
    # launch, byte-exact; the fast entry is not tried again.
    tk = kernel_module()
    if tk.knobs is None:
        pytest.skip("this triton has no knobs (the fast entry is never taken)")
    pools, prepared = _prepared(gen)
    ls, lay = prepared.launcher, prepared.prepared.kernel.layout
    start = [v.view(torch.uint8).clone() for p in pools for views in p.device for v in views]
    ordinary = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps)
    _run_all(ordinary, prepared.num_groups)
    want = _dst_bytes(pools)
    for v, s in zip([v.view(torch.uint8) for p in pools for views in p.device for v in views], start):
        v.copy_(s)
    changed = ChangedSignature()
    variants = set(lay.aligns[g] for g in range(prepared.num_groups) if lay.grids[g])
    kernels = {(None, ls.vpt, a, ls.num_warps): changed for a in variants}
    fast = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps,
                            kernels=kernels, stream=7)
    _run_all(fast, prepared.num_groups)
    assert all(torch.equal(a, b) for a, b in zip(_dst_bytes(pools), want))
    assert changed.calls == ["run"] * len(variants)  # tried once per variant, then ordinary
    assert set(kernels.values()) == {tk.ORDINARY}
    again = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps,
                             kernels=kernels, stream=7)
    _run_all(again, prepared.num_groups)  # a later launcher: ordinary from its first launch
    assert changed.calls == ["run"] * len(variants)
    assert all(torch.equal(a, b) for a, b in zip(_dst_bytes(pools), want))


def test_a_launch_hook_gets_its_metadata(gen, monkeypatch):
    tk = kernel_module()
    if tk.knobs is None:
        pytest.skip("this triton has no knobs (the fast entry is never taken)")
    pools, prepared = _prepared(gen)
    ls, lay = prepared.launcher, prepared.prepared.kernel.layout
    fake = FakeCompiled()
    kernels = {(None, ls.vpt, a, ls.num_warps): fake for a in set(lay.aligns)}
    monkeypatch.setattr(tk.knobs.runtime, "launch_enter_hook", lambda *_: None)
    fast = tk.BoundLaunches(ls.meta, lay.prog_at, lay.grids, lay.aligns, ls.vpt, ls.num_warps,
                            kernels=kernels, stream=9)
    g = next(g for g in range(prepared.num_groups) if lay.grids[g])
    fast.launch(g)
    assert fake.calls == [(lay.grids[g], 9, ("metadata", (lay.grids[g], 1, 1), 9), True)]


@pytest.mark.gpu
def test_cuda_loads_take_the_fast_entry_and_copy_exactly(gen):
    # On a GPU: the first launch of a variant compiles it (ordinary launch); a plan bound
    # afterwards takes the compiled kernel's run for every group, byte-exact.
    from tests.transfer_kernels.pools import assert_copied, snapshot
    pools = [make_pool(gen, 3, 9, [((40,), torch.uint8), ((3,), torch.float32)], "page_first"),
             make_pool(gen, 3, 6, [((24,), torch.uint8)], "layer_first")]
    jobs = [CopyJob(p.host_table, p.device_table, *random_map(gen, p.num_rows, p.num_rows, 4))
            for p in pools]
    groups = [[(0, 0), (1, 0)], [(0, 1)], [(1, 1), (0, 2), (1, 2)]]
    backend = TritonBackend()
    plan = make_plan(jobs)
    for g in range(3):  # warm-up: every variant compiled
        backend.prepare(plan, groups).launch(g)
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    prepared = backend.prepare(plan, groups)
    for g in range(prepared.num_groups):
        prepared.launch(g)
    assert prepared._bound.fast and prepared._bound._bound  # the fast entry was taken
    for job, (src, dst) in zip(jobs, befores):
        assert_copied(job.src, job.dst, src, dst, job.src_rows, job.dst_rows)
