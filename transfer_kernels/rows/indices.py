"""Row index tensors: normalization to int64 1-D and the value checks done before a launch.

Value checks (range, double writes) run only on CPU index tensors: reading a device
tensor's values would synchronize the device, which the hot path must never do.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

RowsLike = torch.Tensor | Sequence[int]


def as_rows(rows: RowsLike, arg: str) -> torch.Tensor:
    """Return ``rows`` as a 1-D int64 tensor on its own device (no copy when already so).

    Args:
        rows: an integer tensor (any integer dtype, CPU or device) or a sequence of ints.
        arg: argument name used in error messages (``"src_rows"``).

    Returns:
        A 1-D int64 tensor.

    Raises:
        ValueError: not 1-D, or not an integer dtype (bool and floats are rejected).
    """
    if not isinstance(rows, torch.Tensor):
        try:
            rows = torch.as_tensor(rows)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{arg}: must be a 1-D integer tensor, got {type(rows).__name__}"
                             ) from exc
        if rows.numel() == 0:
            rows = rows.to(torch.int64)
    if rows.dtype == torch.bool or rows.dtype.is_floating_point or rows.dtype.is_complex:
        raise ValueError(f"{arg}: dtype must be an integer type (int64 preferred), "
                         f"got {rows.dtype}")
    if rows.dim() != 1:
        raise ValueError(f"{arg}: must be 1-D, got shape {tuple(rows.shape)}")
    return rows if rows.dtype == torch.int64 else rows.to(torch.int64)


def check_range(rows: torch.Tensor, num_rows: int, arg: str) -> None:
    """Raise unless every value of the CPU tensor ``rows`` lies in ``[0, num_rows)``.

    Raises:
        ValueError: naming ``arg``, the allowed range and the offending extreme.
    """
    if rows.numel() == 0:
        return
    values = rows.numpy()  # numpy: ~1 us per op on small arrays, torch ~5 us
    lo, hi = int(values.min()), int(values.max())
    if hi >= num_rows:
        raise ValueError(f"{arg}: values must be in [0, {num_rows}), got max {hi}")
    if lo < 0:
        raise ValueError(f"{arg}: values must be in [0, {num_rows}), got min {lo}")


def first_duplicate(rows: torch.Tensor) -> int | None:
    """The smallest value occurring more than once in the CPU tensor ``rows``, or None."""
    if rows.numel() < 2:
        return None
    s = np.sort(rows.numpy())
    dup = np.flatnonzero(s[1:] == s[:-1])
    return int(s[dup[0]]) if dup.size else None


class Runs(NamedTuple):
    """Maximal runs of a row map where source and destination both advance by 1."""

    src_starts: list[int]
    dst_starts: list[int]
    lengths: list[int]


def runs(src_rows: torch.Tensor, dst_rows: torch.Tensor) -> Runs:
    """Split a row map into runs where source and destination both advance by 1.

    Example: src ``[4, 5, 6, 9]``, dst ``[0, 1, 2, 3]`` → starts ``[4, 9]``, ``[0, 3]``,
    lengths ``[3, 1]``.

    Args:
        src_rows: 1-D int64 CPU tensor.
        dst_rows: 1-D int64 CPU tensor, same length.

    Returns:
        The runs, as Python lists.
    """
    s, d = src_rows.numpy(), dst_rows.numpy()
    if s.size == 0:
        return Runs([], [], [])
    starts = np.concatenate(([0], np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1))
    lengths = np.diff(np.append(starts, s.size))
    return Runs(s[starts].tolist(), d[starts].tolist(), lengths.tolist())
