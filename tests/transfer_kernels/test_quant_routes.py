"""Where converting jobs (int8 host rows) go: ``auto``'s decision in its table's terms,
cached per shape, and the ``dma`` backend's staging ring (int8 pages DMA'd per launch
group into the job's own ring region, converted by the fused kernel from there)."""
from __future__ import annotations

import pytest
import torch

from transfer_kernels import AutoBackend, StagedBackend, copy_rows, tuning
from transfer_kernels.backends.auto import converting
from transfer_kernels.backends.auto_table import JobTraits
from transfer_kernels.rows.plan import make_plan
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref
from tests.transfer_kernels.pools import sync
from tests.transfer_kernels.test_quant_copy import Side


def _stage(device: str, side: str | None) -> JobTraits:
    return JobTraits(device, "h2d", "stage" if side else "dense", 4096, 1 << 20, 1 << 22, side)


def test_converting_decision_follows_the_table():
    assert converting("dma", _stage("cuda", "src")) == ("dma", "src")  # staged where the table stages
    assert converting("dma", _stage("cuda", None)) == ("triton", None)  # nothing to stage: the kernel
    assert converting("triton", _stage("cuda", "src")) == ("triton", None)
    assert converting("copy_engine", _stage("cuda", None)) == ("triton", None)  # engines cannot convert
    assert converting("copy_engine", _stage("cpu", None)) == ("torch", None)
    assert converting("dma", _stage("cpu", "src")) == ("torch", None)


def test_auto_converts_on_torch_on_cpu_decided_once_per_shape(gen):
    side = Side([(2, 2, 16)], torch.bfloat16, rows=8, layers=2, gen=gen, device="cpu")
    auto = AutoBackend()
    src, dst = torch.tensor([5, 1, 2]), torch.tensor([0, 6, 3])
    plan = make_plan([(side.dev_table, side.host_table, src, dst)])
    assert auto.decide(plan.jobs[0], plan) == ("torch", None)
    before = auto.analyses
    copy_rows(side.dev_table, side.host_table, src, dst, backend=auto)
    copy_rows(side.dev_table, side.host_table, dst, src, backend=auto)  # the same shape again
    assert auto.analyses - before == 1  # decided once, for the route of these tables
    assert auto.inner["torch"].quant_backend(plan.device).launches == 2
    for layer in range(2):
        q_ref, s_ref = quantize_int8_ref(side.dev[layer][0][dst])
        q, s = side.host_qs(layer, 0, src, (2, 2, 16))
        assert torch.equal(q, q_ref) and torch.equal(s.view(torch.int32), s_ref.view(torch.int32))


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_dma_ring_stages_int8_chunks_per_group(direction, gen, monkeypatch):
    """Two launch groups, one layer each, chunks of one layer: each group DMAs its own
    layer's int8 pages (H2D before its dequantize, D2H after its quantize); untouched
    rows and the source stay as they were."""
    monkeypatch.setattr(tuning, "DMA_PIECE_BYTES", 1)  # a chunk per layer
    side = Side([(2, 2, 16), (2, 2, 16)], torch.bfloat16, rows=6, layers=2, gen=gen)
    dev_rows, host_rows = torch.tensor([4, 0, 3]), torch.tensor([1, 2, 5])
    if direction == "h2d":
        copy_rows(side.dev_table, side.host_table, torch.arange(6), torch.arange(6), backend="torch")
        job = (side.host_table, side.dev_table, host_rows, dev_rows)
    else:
        job = (side.dev_table, side.host_table, dev_rows, host_rows)
    dev_before = [[t.clone() for t in ts] for ts in side.dev]
    host_before = side.host.clone()
    dma = StagedBackend()
    prepared = dma.prepare(make_plan([job]), (((0, 0),), ((0, 1),)))
    assert dma.copies == 0  # nothing moves before a launch
    for g in range(2):
        prepared.launch(g)
        assert dma.copies == g + 1  # one DMA call per group
    sync()
    for layer in range(2):
        for b in range(2):
            q, s = side.host_qs(layer, b, host_rows, (2, 2, 16))
            if direction == "d2h":
                q_ref, s_ref = quantize_int8_ref(dev_before[layer][b][dev_rows].cpu())
                assert torch.equal(q, q_ref) and torch.equal(s.view(torch.int32), s_ref.view(torch.int32))
            else:
                got = side.dev[layer][b][dev_rows].cpu().view(torch.int16)
                assert torch.equal(got, dequantize_int8_ref(q, s, torch.bfloat16).view(torch.int16))
    untouched_dev = [r for r in range(6) if r not in dev_rows.tolist()]
    untouched_host = [r for r in range(6) if r not in host_rows.tolist()]
    for layer in range(2):
        for b in range(2):
            assert torch.equal(side.dev[layer][b][untouched_dev].view(torch.int16),
                               dev_before[layer][b][untouched_dev].view(torch.int16))
    assert torch.equal(side.host[untouched_host], host_before[untouched_host])
    if direction == "h2d":
        assert torch.equal(side.host, host_before)  # the source is unchanged
    else:
        assert all(torch.equal(t.view(torch.int16), u.view(torch.int16))
                   for ts, us in zip(side.dev, dev_before) for t, u in zip(ts, us))


def test_quant_layout_is_built_once_per_shape(gen, monkeypatch):
    """Two loads of one shape (other rows, same counts, hashable groups): the segment
    tables are built once; the second load's bytes come from its own rows."""
    from transfer_kernels.backends import quant_triton as quant_kernel
    built = []
    real = quant_kernel.build_layout
    monkeypatch.setattr(quant_kernel, "build_layout", lambda *a: built.append(1) or real(*a))
    side = Side([(2, 2, 16)], torch.bfloat16, rows=6, layers=2, gen=gen)
    copy_rows(side.dev_table, side.host_table, torch.arange(6), torch.arange(6), backend="torch")
    kernel = quant_kernel.TritonQuantBackend()
    dev_rows = torch.tensor([5, 1, 0])
    for host_rows in (torch.tensor([0, 1, 2]), torch.tensor([4, 3, 2])):
        prepared = kernel.prepare(make_plan([(side.host_table, side.dev_table, host_rows, dev_rows)]),
                                  (((0, 0),), ((0, 1),)))
        for g in range(2):
            prepared.launch(g)
        sync()
        for layer in range(2):
            q, s = side.host_qs(layer, 0, host_rows, (2, 2, 16))
            assert torch.equal(side.dev[layer][0][dev_rows].cpu().view(torch.int16),
                               dequantize_int8_ref(q, s, torch.bfloat16).view(torch.int16))
    assert len(built) == 1
