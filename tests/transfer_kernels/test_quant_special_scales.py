"""Dequantizing host rows whose fp32 scale is a special value (issue 28, item 8): a damaged
page may hold any bit pattern. Every backend gives `quant_ref`'s bytes on the device the rows
land on; the kernel's bf16 rounding on the bits used to carry a NaN into the sign bit (+-0)."""
from __future__ import annotations

import struct

import pytest
import torch

from transfer_kernels import copy_rows
from transfer_kernels.quant.reference import dequantize_int8_ref
from tests.transfer_kernels.pools import DEVICE, sync
from tests.transfer_kernels.test_quant_copy import BACKENDS, Side

# fp32 bit patterns: quiet/signalling NaNs of both signs and payloads, infinities, subnormals,
# signed zeros, the largest finite values (q * s overflows to inf)
SCALE_BITS = (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000,
              0x7F800000, 0xFF800000, 0x00000001, 0x007FFFFF, 0x80000001, 0x80000000, 0x00000000,
              0x7F7FFFFF, 0xFF7FFFFF)
SCALES = [struct.unpack("<f", struct.pack("<I", b))[0] for b in SCALE_BITS]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy: inf * q
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0 * inf
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_scale_bit_pattern_dequantizes_to_quant_refs_bytes(backend, dtype, gen):
    shape = (1, 4, 8)  # one row: 4 vectors (one scale each) of 8 int8 values
    rows = len(SCALES)
    side = Side([shape], dtype, rows=rows, layers=1, gen=gen)
    q = torch.randint(-127, 128, (rows, *shape), dtype=torch.int8, generator=gen)
    q[:, 0, 0] = 0  # 0 * inf and 0 * NaN are NaN
    s = torch.tensor(SCALES, dtype=torch.float32)[:, None, None].expand(rows, *shape[:-1]).clone()
    s[:, 0, 1] = 1.5  # a finite vector beside each special one
    side.host_views[0][0].copy_(q.view(rows, -1).view(torch.uint8))
    side.host_views[0][1].copy_(s.view(rows, -1).view(torch.uint8))
    host_before = side.host.clone()
    dst = torch.randperm(rows, generator=gen)
    copy_rows(side.host_table, side.dev_table, torch.arange(rows), dst, backend=backend)
    sync()
    want = dequantize_int8_ref(q.to(DEVICE), s.to(DEVICE), dtype)
    got = side.dev[0][0][dst]
    bad = [hex(SCALE_BITS[i]) for i in range(rows) if not torch.equal(got[i].view(torch.uint8).cpu(),
                                                                        want[i].view(torch.uint8).cpu())]
    assert bad == [], f"scale patterns whose rows differ from quant_ref: {bad}"
    assert torch.equal(side.host, host_before)
