"""`Int8Codec`: a row table's rows are the int8 host format of device rows (`reference`).

A host `RowTable` built with ``codec=Int8Codec(...)`` says: its buffers ``2b`` and
``2b + 1`` are the int8 values and fp32 scales of device buffer ``b``::

    device row (buffer b)          [E_b values of dtype]                E_b * itemsize bytes
    host row (buffers 2b, 2b + 1)  [E_b int8] [E_b / D_b fp32 scales]   E_b + 4 E_b / D_b bytes

A job between a coded and an uncoded table converts (`job_mode`). Free of the backends,
so the table and the plan can import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from transfer_kernels.quant.reference import QUANTIZABLE


@dataclass(frozen=True)
class Int8Codec:
    """The int8 host format of a device table's buffers.

    Attributes:
        dtype: the device element type, ``torch.bfloat16`` or ``torch.float16``.
        elems: values per row of each device buffer.
        vecs: the quantized vector length (one scale each) of each device buffer; divides
            its ``elems``.
    Raises:
        ValueError: a dtype that cannot be quantized, or lengths that do not fit.
    """

    dtype: torch.dtype
    elems: tuple[int, ...]
    vecs: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "elems", tuple(int(e) for e in self.elems))
        object.__setattr__(self, "vecs", tuple(int(v) for v in self.vecs))
        if self.dtype not in QUANTIZABLE:
            raise ValueError(f"dtype: int8 host rows encode {QUANTIZABLE}, got {self.dtype}")
        if not self.elems or len(self.elems) != len(self.vecs):
            raise ValueError(f"elems / vecs: need one of each per device buffer, got {self.elems} / {self.vecs}")
        for e, v in zip(self.elems, self.vecs):
            if v < 1 or e < 1 or e % v:
                raise ValueError(f"vecs: vector length {v} must be >= 1 and divide the row's {e} values")

    @classmethod
    def of_shapes(cls, dtype: torch.dtype, row_shapes: Sequence[Sequence[int]]) -> Int8Codec:
        """The codec of device buffers with these row shapes (the last dim is the vector)."""
        return cls(dtype, tuple(math.prod(s) for s in row_shapes), tuple(s[-1] for s in row_shapes))

    @property
    def device_row_bytes(self) -> tuple[int, ...]:
        """Row bytes of each device buffer."""
        return tuple(e * self.dtype.itemsize for e in self.elems)

    @property
    def host_row_bytes(self) -> tuple[int, ...]:
        """Row bytes of each host buffer: int8 values, then fp32 scales, per device buffer."""
        return tuple(n for e, v in zip(self.elems, self.vecs) for n in (e, 4 * (e // v)))


def job_mode(src_codec: Int8Codec | None, dst_codec: Int8Codec | None) -> str | None:
    """``"quantize"`` (coded destination), ``"dequantize"`` (coded source) or ``None`` (exact)."""
    if dst_codec is not None and src_codec is None:
        return "quantize"
    if src_codec is not None and dst_codec is None:
        return "dequantize"
    return None
