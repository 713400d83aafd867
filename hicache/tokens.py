"""Token ids as the tree's keys and the storage tier's page hashes see them: int64.

A key is the bytes of int64 token ids, so every id must fit int64. Ids outside it are
refused, never wrapped: a ``uint64`` id of 2**63 or more would otherwise take the bits of
a negative id and share its key and page hash.

    ids given                         taken as
    any integer dtype within int64    int64 (negative ids too: they are keys of their own)
    uint64 >= 2**63, Python ints      ValueError naming the argument
    outside [-2**63, 2**63)
    floats, bools, other objects      the caller's error type (TypeError in the tree,
                                      ValueError in `page_hashes`)

Negative ids are accepted (a vocabulary never has them, but placeholders sometimes do);
they are ordinary int64 values and collide with nothing.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from host_pools.allocator import is_integer_dtype

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def int64_token_ids(token_ids: Any, what: str = "token_ids", *,
                    not_integer: type[Exception] = TypeError) -> np.ndarray:
    """``token_ids`` (a tensor, numpy array or sequence of ints) as a contiguous int64 array.

    The shape is kept (callers check it). Never mutates its input; the result may share
    memory with an int64 numpy input.

    Raises:
        ValueError: an id outside int64 (naming ``what`` and the range).
        not_integer: ids that are not integers (floats and bools are refused, never cast).
    """
    if isinstance(token_ids, torch.Tensor):
        if token_ids.numel() and not is_integer_dtype(token_ids.dtype):
            raise not_integer(f"{what}: need integer token ids, got dtype {token_ids.dtype}")
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.asarray(token_ids)
    if arr.size and arr.dtype.kind not in "iu":  # an empty list is float64 to numpy: fine
        if _python_ints(token_ids):  # numpy chose float64 / object for ints beyond int64
            raise ValueError(_outside(what))
        raise not_integer(f"{what}: need integer token ids, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > INT64_MAX:
        raise ValueError(_outside(what))
    return np.ascontiguousarray(arr, dtype=np.int64)


def _python_ints(token_ids: Any) -> bool:
    """Whether ``token_ids`` is a flat sequence of Python ints (no bools)."""
    return isinstance(token_ids, (list, tuple)) and all(type(x) is int for x in token_ids)


def _outside(what: str) -> str:
    return f"{what}: every token id must fit int64 [{INT64_MIN}, {INT64_MAX}]; ids of 2**63 or more are refused"
