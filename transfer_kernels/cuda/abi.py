"""What the host side knows about the kernels without importing triton: the layout of
the int64 ``meta`` buffers they read, the copy kernel's division by magic numbers, and
whether the kernels can run at all (``import triton`` costs about a second: it is
imported only by the kernel modules, on first use).

    copy kernel (`copy_kernel`)   SEG_FIELDS fields per segment, then program tables
    quant kernel (`quant_kernel`) QUANT_SEG_FIELDS fields per segment
"""
from __future__ import annotations

import importlib.util

import numpy as np

SEG_FIELDS = 12  # copy kernel: fields per segment (`copy_kernel`'s module docstring)
QUANT_SEG_FIELDS = 10  # quant kernel: fields per segment (`quant_kernel`'s module docstring)
MAGIC_BITS = 31  # the copy kernel's dividends stay below 2**MAGIC_BITS


def magic(divisors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(m, s)`` with ``t // d == (t * m) >> s`` for every ``0 <= t < 2**31`` (d >= 1).

    Granlund-Montgomery: with ``l = ceil(log2 d)``, ``m = floor(2**(31 + l) / d) + 1`` and
    ``s = 31 + l``, ``m * d`` lies in ``(2**s, 2**s + 2**l]``, which makes the quotient
    exact; ``m <= 2**32``, so ``t * m < 2**63`` never overflows int64.
    """
    d = np.asarray(divisors, dtype=np.int64)
    l = np.ceil(np.log2(d)).astype(np.int64)  # exact in float64 for d < 2**31
    s = MAGIC_BITS + l  # <= 62: 2**s fits int64
    m = np.left_shift(np.int64(1), s) // d + 1
    return m, s


def triton_importable() -> bool:
    """True when the ``triton`` package can be imported (the kernels can run)."""
    return importlib.util.find_spec("triton") is not None
