"""Quantizing / dequantizing copies (int8 host rows) of every backend, byte-exact against
`quant_ref` on random data with zeros, NaN, inf, huge and tiny values mixed in.

Backends run on the CPU (``triton`` and ``dma`` under the Triton interpreter, tiny sizes),
and on the GPU when there is one (the same tests, device side on CUDA, pinned host)."""
from __future__ import annotations

import math

import pytest
import torch

from transfer_kernels import CopyJob, FaultyBackend, RowTable, copy_rows, copy_rows_batch, get_backend
from transfer_kernels.quant.codec import Int8Codec
from transfer_kernels.quant.reference import dequantize_int8_ref, quantize_int8_ref
from tests.transfer_kernels.pools import DEVICE, sync

BACKENDS = ("torch", "triton", "dma", "copy_engine", "auto")
# (row_shape, dtype) per device buffer: MHA k/v at several heads/head_dims, the MLA latent
GEOMETRIES = [
    ([(2, 2, 64), (2, 2, 64)], torch.bfloat16),
    ([(1, 3, 128), (1, 3, 128)], torch.bfloat16),
    ([(4, 1, 16), (4, 1, 16)], torch.float16),
    ([(1, 576)], torch.bfloat16),
    ([(2, 1, 8)], torch.bfloat16),  # a vector shorter than the kernel's block
]


def special_values(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x`` (float32, [..., D]) with whole zero vectors, NaN, +-inf, huge and tiny values."""
    flat = x.view(-1, x.shape[-1])
    n = flat.shape[0]
    flat[0] = 0.0
    flat[1 % n, 0] = float("nan")
    flat[2 % n, -1] = float("inf")
    flat[3 % n, 1 % flat.shape[1]] = -float("inf")
    flat[4 % n] *= 1e30  # near the top of bf16's range
    flat[5 % n] *= 1e-38  # subnormal territory: stored as zeros when absmax < 2**-121
    flat[6 % n] *= 1e-36
    flat[7 % n, 0] = 3.0e38
    return x


class Side:
    """A device table of random rows and a page_first int8 host table, with their views."""

    def __init__(self, shapes, dtype, rows: int, layers: int, gen: torch.Generator,
                 device: str = DEVICE) -> None:
        self.codec = Int8Codec.of_shapes(dtype, shapes)
        self.dev = [[special_values(torch.randn((rows, *s), generator=gen) * 3, gen).to(dtype).to(device)
                     for s in shapes] for _ in range(layers)]
        host_bytes = self.codec.host_row_bytes
        host = torch.randint(0, 256, (rows, layers, sum(host_bytes)), dtype=torch.uint8, generator=gen)
        self.host = host.pin_memory() if device == "cuda" else host
        offs = [sum(host_bytes[:i]) for i in range(len(host_bytes))]
        self.host_views = [[self.host[:, l, o:o + n] for o, n in zip(offs, host_bytes)] for l in range(layers)]
        dev_views = [[t.view(rows, -1).view(torch.uint8) for t in ts] for ts in self.dev]
        self.dev_table = RowTable.from_views(dev_views, "dev")
        self.host_table = RowTable.from_views(self.host_views, "host", codec=self.codec)

    def host_qs(self, layer: int, b: int, rows: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.host_views[layer][2 * b][rows].view(torch.int8).view(len(rows), *shape)
        s = self.host_views[layer][2 * b + 1][rows].view(torch.float32).view(len(rows), *shape[:-1])
        return q, s


def _rows(n: int, total: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randperm(total, generator=gen)[:n], torch.randperm(total, generator=gen)[:n])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geom", range(len(GEOMETRIES)))
def test_quantize_then_dequantize_matches_ref(backend, geom, gen):
    shapes, dtype = GEOMETRIES[geom]
    side = Side(shapes, dtype, rows=9, layers=2, gen=gen)
    for n in (1, 5):  # boundary row counts: one row, several
        src, dst = _rows(n, 9, gen)
        dev_before = [[t.clone() for t in ts] for ts in side.dev]
        host_before = side.host.clone()
        copy_rows(side.dev_table, side.host_table, src, dst, backend=backend)
        sync()
        for l in range(2):
            for b, shape in enumerate(shapes):
                q_ref, s_ref = quantize_int8_ref(side.dev[l][b][src].cpu())
                q, s = side.host_qs(l, b, dst, shape)
                assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), (l, b)
                assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8)), (l, b)
                assert torch.equal(side.dev[l][b].view(torch.uint8), dev_before[l][b].view(torch.uint8))
        untouched = torch.ones(9, dtype=torch.bool)
        untouched[dst] = False
        assert torch.equal(side.host[untouched], host_before[untouched])
        # back: dequantize host rows into other device rows
        back_dst = torch.randperm(9, generator=gen)[:n]
        host_before = side.host.clone()
        dev_before = [[t.clone() for t in ts] for ts in side.dev]
        copy_rows(side.host_table, side.dev_table, dst, back_dst, backend=backend)
        sync()
        keep = torch.ones(9, dtype=torch.bool)
        keep[back_dst] = False
        for l in range(2):
            for b, shape in enumerate(shapes):
                q, s = side.host_qs(l, b, dst, shape)
                want = dequantize_int8_ref(q, s, dtype)
                got = side.dev[l][b][back_dst].cpu()
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (l, b)
                assert torch.equal(side.dev[l][b][keep].cpu().view(torch.uint8),
                                   dev_before[l][b][keep].cpu().view(torch.uint8))
        assert torch.equal(side.host, host_before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_mixes_exact_and_quantized_jobs_in_one_call(backend, gen):
    shapes = [(2, 2, 32), (2, 2, 32)]
    side = Side(shapes, torch.bfloat16, rows=6, layers=2, gen=gen)
    plain_dev = torch.randint(0, 256, (6, 2, 40), dtype=torch.uint8, generator=gen).to(DEVICE)
    plain_host = torch.randint(0, 256, (6, 2, 40), dtype=torch.uint8, generator=gen)
    plain_host = plain_host.pin_memory() if DEVICE == "cuda" else plain_host
    dev_t = RowTable.from_views([[plain_dev[:, l]] for l in range(2)], "plain.dev")
    host_t = RowTable.from_views([[plain_host[:, l]] for l in range(2)], "plain.host")
    src, dst = torch.tensor([0, 3, 4]), torch.tensor([5, 1, 2])
    copy_rows_batch([CopyJob(side.dev_table, side.host_table, src, dst),
                     CopyJob(dev_t, host_t, src, dst)], backend=backend)
    sync()
    assert torch.equal(plain_host[dst], plain_dev[src].cpu())
    q_ref, s_ref = quantize_int8_ref(side.dev[1][0][src].cpu())
    q, s = side.host_qs(1, 0, dst, shapes[0])
    assert torch.equal(q, q_ref) and torch.equal(s.view(torch.int32), s_ref.view(torch.int32))


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_prepared_groups_convert_per_layer_group(backend, gen):
    """A load prepared as launch groups (the controller's path) dequantizes each group."""
    from transfer_kernels.rows.plan import make_plan
    shapes = [(2, 1, 16)]
    side = Side(shapes, torch.bfloat16, rows=5, layers=3, gen=gen)
    src, dst = torch.tensor([4, 0]), torch.tensor([1, 2])
    copy_rows(side.dev_table, side.host_table, src, src, backend="torch")  # real int8 rows to load
    plan = make_plan([CopyJob(side.host_table, side.dev_table, src, dst)])
    prepared = get_backend(backend).prepare(plan, [[(0, 0), (0, 2)], [(0, 1)]])
    assert prepared.num_groups == 2
    prepared.launch(1)
    sync()
    q, s = side.host_qs(1, 0, src, shapes[0])
    assert torch.equal(side.dev[1][0][dst].cpu().view(torch.int16),
                       dequantize_int8_ref(q, s, torch.bfloat16).view(torch.int16))
    q0, s0 = side.host_qs(0, 0, src, shapes[0])
    assert not torch.equal(side.dev[0][0][dst].cpu().view(torch.int16),
                           dequantize_int8_ref(q0, s0, torch.bfloat16).view(torch.int16))


def test_faulty_backend_counts_quantized_launches(gen):
    side = Side([(2, 1, 16)], torch.bfloat16, rows=4, layers=1, gen=gen)
    before = side.host.clone()
    faulty = FaultyBackend("torch", fail_on_launch=1)
    with pytest.raises(RuntimeError, match="injected fault"):
        copy_rows(side.dev_table, side.host_table, [0, 1], [2, 3], backend=faulty)
    assert torch.equal(side.host, before)


def test_layout_checks_name_the_codec(gen):
    side = Side([(2, 1, 16)], torch.bfloat16, rows=4, layers=1, gen=gen)
    plain = RowTable.from_views(side.host_views, "plain")  # the same bytes, no codec
    with pytest.raises(ValueError, match="decoded from int8 host rows"):
        copy_rows(plain, side.host_table, [0], [1], backend="torch")
    with pytest.raises(ValueError, match="int8 host rows"):
        RowTable.from_views(side.host_views, "bad", codec=Int8Codec(torch.bfloat16, (64,), (16,)))
    with pytest.raises(ValueError, match="dtype"):
        Int8Codec(torch.float32, (32,), (16,))
    with pytest.raises(ValueError, match="vecs"):
        Int8Codec(torch.bfloat16, (32,), (5,))
    # two coded tables of one codec copy bytes exactly (host to host)
    other = Side([(2, 1, 16)], torch.bfloat16, rows=4, layers=1, gen=gen)
    copy_rows(side.host_table, other.host_table, [0, 1], [3, 2], backend="torch")
    assert torch.equal(other.host[[3, 2]], side.host[[0, 1]])


def test_codec_sizes():
    codec = Int8Codec.of_shapes(torch.bfloat16, [(64, 8, 128), (64, 8, 128)])
    assert codec.device_row_bytes == (131072, 131072)
    assert codec.host_row_bytes == (65536, 2048, 65536, 2048)
    assert math.isclose(sum(codec.device_row_bytes) / sum(codec.host_row_bytes), 1.9393939, rel_tol=1e-6)


@pytest.mark.parametrize("bf16", [True, False])
def test_compiled_kernel_uses_ieee_division_and_no_fma(bf16):
    """What the GPU runs (compiled for sm_90 here, no GPU needed): the quantize divides with
    div.rn (not the approximate '/'), no multiply-add is fused (it would round f * inv
    differently), the fp16 cast rounds to nearest."""
    pytest.importorskip("triton")
    from transfer_kernels.cuda.quant_kernel import compile_ptx
    quant = compile_ptx(quantize=True, bf16=bf16)
    assert "div.rn.f32" in quant and "div.full" not in quant and "div.approx" not in quant
    assert "fma." not in quant
    deq = compile_ptx(quantize=False, bf16=bf16)
    assert "fma." not in deq and "mul.rn.f32" in deq
    if not bf16:
        assert "cvt.rn.f16.f32" in deq


def test_dma_stages_int8_pages_then_converts_on_the_device(gen):
    """The dma backend DMAs whole int8 host pages into its staging table and dequantizes
    from there (quantizes into it, then DMAs, for D2H): one DMA call per direction."""
    from transfer_kernels import StagedBackend
    side = Side([(2, 2, 16), (2, 2, 16)], torch.bfloat16, rows=6, layers=2, gen=gen)
    dma = StagedBackend()
    src, dst = torch.tensor([0, 1, 4]), torch.tensor([3, 4, 5])
    copy_rows(side.dev_table, side.host_table, src, dst, backend=dma)
    assert dma.copies == 1 and dma.pieces == 3  # one DMA call, a piece per host row
    q_ref, s_ref = quantize_int8_ref(side.dev[1][1][src].cpu())
    q, s = side.host_qs(1, 1, dst, (2, 2, 16))
    assert torch.equal(q, q_ref) and torch.equal(s.view(torch.int32), s_ref.view(torch.int32))
    back = torch.tensor([2, 0, 1])
    copy_rows(side.host_table, side.dev_table, dst, back, backend=dma)
    assert dma.copies == 2
    want = dequantize_int8_ref(q, s, torch.bfloat16)
    assert torch.equal(side.dev[1][1][back].cpu().view(torch.int16), want.view(torch.int16))


def test_which_backend_converts_for_each_backend():
    """torch: the reference; triton: the fused kernel (interpreted on CPU); copy_engine cannot
    convert by copying: torch on a CPU plan, the fused kernel on CUDA. dma and auto convert
    themselves (dma: int8 pages staged in its ring, then its kernel's quant backend; auto:
    decided per shape, `test_auto_decides_converting_jobs_in_table_terms`)."""
    from transfer_kernels.backends.quant_triton import TritonQuantBackend
    from transfer_kernels.backends.quant_torch import TorchQuantBackend
    cpu = torch.device("cpu")
    kinds = {name: type(get_backend(name).quant_backend(cpu))
             for name in ("torch", "triton", "copy_engine")}
    assert kinds == {"torch": TorchQuantBackend, "triton": TritonQuantBackend, "copy_engine": TorchQuantBackend}
    assert get_backend("dma").converts and get_backend("auto").converts
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        assert isinstance(get_backend("copy_engine").quant_backend(cuda), TritonQuantBackend)


@pytest.mark.parametrize("max_programs", [1, 3, 64])
def test_kernel_programs_stride_over_many_blocks(max_programs, gen):
    """More vectors than one block per program (a grid-stride loop with a masked tail)."""
    from transfer_kernels.backends.quant_triton import TritonQuantBackend
    shapes = [(16, 2, 16)]
    side = Side(shapes, torch.bfloat16, rows=20, layers=2, gen=gen)
    src, dst = _rows(17, 20, gen)  # 17 rows x 32 vectors: 3 blocks of 256, the last one masked
    orig = [side.dev[layer][0][src].cpu() for layer in range(2)]
    kernel = TritonQuantBackend(max_programs=max_programs)
    copy_rows(side.dev_table, side.host_table, src, dst, backend=kernel)
    back = torch.randperm(20, generator=gen)[:17]
    copy_rows(side.host_table, side.dev_table, dst, back, backend=kernel)
    sync()
    for layer in range(2):
        q_ref, s_ref = quantize_int8_ref(orig[layer])
        q, s = side.host_qs(layer, 0, dst, shapes[0])
        assert torch.equal(q, q_ref) and torch.equal(s.view(torch.int32), s_ref.view(torch.int32))
        assert torch.equal(side.dev[layer][0][back].cpu().view(torch.int16),
                           dequantize_int8_ref(q, s, torch.bfloat16).view(torch.int16))


def test_quant_ref_pinned_values():
    """The definition on hand-checked vectors: half-even rounding, IEEE quotients, non-finite
    values as 0, vectors below 2**-121 as zeros with scale 0."""
    import numpy as np
    x = torch.tensor([[2.0, 1.0, -0.5, 0.0], [float("nan"), 4.0, float("-inf"), -1.0],
                      [1e-37, -5e-38, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    q, s = quantize_int8_ref(x)
    assert q.tolist() == [[127, 64, -32, 0], [0, 127, 0, -32], [0, 0, 0, 0], [0, 0, 0, 0]]
    want_s = [np.float32(2) / np.float32(127), np.float32(4) / np.float32(127), 0.0, 0.0]
    assert s.numpy().tolist() == [float(v) for v in want_s]
    assert torch.equal(dequantize_int8_ref(q, s, torch.bfloat16)[0],
                       (q[0].float() * s[0]).to(torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_prepared_groups_with_exact_and_quantized_jobs(backend, gen):
    """A load of an int8 pool and an exact pool, prepared as two launch groups: each group
    converts its layers of the one and copies its layers of the other."""
    from transfer_kernels.rows.plan import make_plan
    side = Side([(2, 1, 16)], torch.bfloat16, rows=4, layers=2, gen=gen)
    plain_dev = torch.randint(0, 256, (4, 2, 24), dtype=torch.uint8, generator=gen).to(DEVICE)
    plain_host = torch.randint(0, 256, (4, 2, 24), dtype=torch.uint8, generator=gen)
    plain_host = plain_host.pin_memory() if DEVICE == "cuda" else plain_host
    dev_t = RowTable.from_views([[plain_dev[:, l]] for l in range(2)], "plain.dev")
    host_t = RowTable.from_views([[plain_host[:, l]] for l in range(2)], "plain.host")
    src, dst = torch.tensor([3, 0]), torch.tensor([1, 2])
    copy_rows(side.dev_table, side.host_table, src, src, backend="torch")  # real int8 rows to load
    plan = make_plan([CopyJob(side.host_table, side.dev_table, src, dst), CopyJob(host_t, dev_t, src, dst)])
    prepared = get_backend(backend).prepare(plan, [[(0, 0), (1, 0)], [(0, 1), (1, 1)]])
    for g in range(prepared.num_groups):
        prepared.launch(g)
    sync()
    assert torch.equal(plain_dev[dst].cpu(), plain_host[src])
    for layer in range(2):
        q, s = side.host_qs(layer, 0, src, (2, 1, 16))
        assert torch.equal(side.dev[layer][0][dst].cpu().view(torch.int16),
                           dequantize_int8_ref(q, s, torch.bfloat16).view(torch.int16))
