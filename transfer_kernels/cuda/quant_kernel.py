"""The Triton quantize / dequantize kernel (imports triton): the vectors of a launch's
segments, compiled (CUDA) and interpreted (CPU) from one function. Its ``meta`` layout
(`abi.QUANT_SEG_FIELDS` fields per segment) and the bytes it must give are described in
`transfer_kernels.backends.quant_triton`, which builds its launches.

Like the copy kernel: ``while`` loops and no nested ``@triton.jit`` call, so both variants
run on every supported Triton.
"""
from __future__ import annotations

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from transfer_kernels.cuda import runtime
from transfer_kernels.quant.reference import dequantize_int8_ref

# no FMA contraction: f * inv is rounded once before the rounding add (as torch rounds it)
COMPILE_OPTIONS = {"enable_fp_fusion": False, "num_warps": 4}
ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + ROUND) - ROUND rounds |y| < 2**22 half to even
CUDA_NAN_BF16 = 0x7FFF  # cvt.rn.bf16.f32's canonical NaN: torch's CUDA cast (sm_80+, and its fallback)


def _quant_rows(meta_ptr, seg_at, TINY: tl.constexpr, QUANTIZE: tl.constexpr, BF16: tl.constexpr,
                VEC: tl.constexpr, BLOCK_D: tl.constexpr, BV: tl.constexpr, INTERP: tl.constexpr,
                NAN_BF16: tl.constexpr):
    """Blocks of ``BV`` vectors of segment ``program_id(0)`` (10 = ``abi.QUANT_SEG_FIELDS``)."""
    seg = meta_ptr + seg_at + tl.program_id(0) * 10
    if BF16:
        dev_base = tl.load(seg).to(tl.pointer_type(tl.bfloat16))
    else:
        dev_base = tl.load(seg).to(tl.pointer_type(tl.float16))
    dev_stride = tl.load(seg + 1)
    q_base = tl.load(seg + 2).to(tl.pointer_type(tl.int8))
    q_stride = tl.load(seg + 3)
    s_base = tl.load(seg + 4).to(tl.pointer_type(tl.float32))
    s_stride = tl.load(seg + 5)
    dev_idx = meta_ptr + tl.load(seg + 6)
    host_idx = meta_ptr + tl.load(seg + 7)
    vpr = tl.load(seg + 8)
    n_vec = tl.load(seg + 9)
    lanes = tl.arange(0, BV).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    blk = tl.program_id(1).to(tl.int64)
    while blk * BV < n_vec:
        v = blk * BV + lanes
        live = v < n_vec
        row = v // vpr
        col = (v - row * vpr) * VEC
        dev_row = tl.load(dev_idx + row, mask=live, other=0)
        host_row = tl.load(host_idx + row, mask=live, other=0)
        m = live[:, None] & (d < VEC)
        dp = dev_base + (dev_row * dev_stride + col)[:, None] + d
        qp = q_base + (host_row * q_stride + col)[:, None] + d
        sp = s_base + host_row * s_stride + col // VEC
        if QUANTIZE:
            x = tl.load(dp, mask=m, other=0.0).to(tl.float32)
            f = tl.where(m & (tl.abs(x) < float("inf")), x, 0.0)  # NaN and +-inf -> 0
            # tl.reduce with the standard max combiner: the interpreter maps it to numpy
            # (tl.max is a nested jit function, which an interpreted kernel cannot call)
            a = tl.reduce(tl.abs(f), 1, tl.standard._elementwise_max)
            a = tl.where(a >= TINY, a, 0.0)
            one = tl.where(a > 0, a, 1.0)
            if INTERP:  # numpy's fp32 division is IEEE
                s = a / 127.0
                inv = 127.0 / one
            else:  # the compiled '/' is approximate
                s = tl.math.div_rn(a, tl.full(a.shape, 127.0, tl.float32))
                inv = tl.math.div_rn(tl.full(a.shape, 127.0, tl.float32), one)
            inv = tl.where(a > 0, inv, 0.0)
            y = f * inv[:, None]
            r = (y + ROUND) - ROUND
            q = tl.minimum(tl.maximum(r, -127.0), 127.0)
            tl.store(qp, q.to(tl.int8), mask=m)
            tl.store(sp, s, mask=live)
        else:
            q = tl.load(qp, mask=m, other=0).to(tl.float32)
            s = tl.load(sp, mask=live, other=0.0)
            y = q * s[:, None]
            if BF16:  # round to nearest even on the bits (the interpreter's cast truncates)
                bits = y.to(tl.uint32, bitcast=True)
                bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
                # a NaN (a damaged scale, or 0 * inf) would carry into the sign bit: torch's NaN
                bits = tl.where(y != y, tl.full(bits.shape, NAN_BF16, tl.uint32), bits)
                tl.store(dp, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=m)
            else:
                tl.store(dp, y.to(tl.float16), mask=m)
        blk += tl.num_programs(1)


_compiled = JITFunction(_quant_rows, do_not_specialize=["seg_at"])
SIGNATURE = {"meta_ptr": "*i64", "seg_at": "i64", **{c: "constexpr" for c in (
    "TINY", "QUANTIZE", "BF16", "VEC", "BLOCK_D", "BV", "INTERP", "NAN_BF16")}}
_interpreted = InterpretedFunction(_quant_rows)


def compile_ptx(quantize: bool, bf16: bool, vec: int = 128, arch: int = 90) -> str:
    """The PTX of one compiled variant for ``sm_<arch>``, built without a GPU (tests check its
    arithmetic: IEEE division, no fused multiply-add)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from transfer_kernels.quant.reference import TINY
    block_d = 1 << max(0, (vec - 1).bit_length())
    src = ASTSource(fn=_compiled, signature=SIGNATURE, constexprs=dict(
        TINY=TINY, QUANTIZE=quantize, BF16=bf16, VEC=vec, BLOCK_D=block_d, BV=max(1, 4096 // block_d),
        INTERP=False, NAN_BF16=CUDA_NAN_BF16))
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=COMPILE_OPTIONS).asm["ptx"]


def run(meta: torch.Tensor, seg_at: int, grid: tuple[int, int], *, device: torch.device | None,
        quantize: bool, bf16: bool, vec: int, block_d: int, bv: int, tiny: float) -> None:
    """Launch over ``grid`` = (segments, programs per segment); ``meta`` on the plan's
    device; ``device``: the CUDA device to make current first (``None``: it is)."""
    consts = dict(TINY=tiny, QUANTIZE=quantize, BF16=bf16, VEC=vec, BLOCK_D=block_d, BV=bv)
    if meta.device.type == "cpu":
        with runtime.INTERPRETER:  # the interpreter is not thread-safe
            _interpreted[grid](meta, seg_at, INTERP=True, NAN_BF16=cpu_nan_bf16(), **consts)
    elif device is None:
        _compiled[grid](meta, seg_at, INTERP=False, NAN_BF16=CUDA_NAN_BF16, **COMPILE_OPTIONS, **consts)
    else:
        with torch.cuda.device(device):
            _compiled[grid](meta, seg_at, INTERP=False, NAN_BF16=CUDA_NAN_BF16, **COMPILE_OPTIONS, **consts)


def cpu_nan_bf16() -> int:
    """The bits `quant_ref` gives a NaN in bf16 on the CPU, asked of it: torch's CPU cast
    has one pattern for every NaN, but which one depends on its path (ATen's vectorized
    cast of a contiguous tensor: 0xFFFF; the scalar one: 0x7FC0)."""
    y = dequantize_int8_ref(torch.zeros(1, 8, dtype=torch.int8), torch.full((1,), float("nan")), torch.bfloat16)
    return y.view(torch.int16)[0, 0].item() & 0xFFFF
