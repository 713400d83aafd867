"""Storage keys: a chained SHA-256 per page of token ids, and the namespace of a pool's bytes.

A page's key says *which tokens* (and everything before them); the namespace says *how
those tokens were turned into bytes*. An object lives under both, so two namespaces can
never read each other's pages:

    page hash  h_i = sha256(h_{i-1} || int64-le token ids of page i)
               h_-1 = sha256("hicache/page-chain/v1" || 0 || cache_salt)  (or a caller's prior hash)
    namespace  sha256(canonical JSON of: schema version, model id, pool name and kind,
               every buffer's role / row shape / dtype (scales included), tokens per row,
               page size, rows per object, model layer ids, TP rank and size, extra,
               and the host format when it is not the device's: "host_dtype": "int8")
    object key "<first 32 hex of namespace>_<64 hex of page hash>"
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from hicache.config import model_id_too_long
from hicache.tokens import int64_token_ids
from host_pools.spec import PoolKind, PoolSpec, Stack

SCHEMA_VERSION = 1  # bump when the page format or the key derivation changes
_CHAIN_SEED = b"hicache/page-chain/v1\x00"
KEY_HEX_CHARS = 64  # a page hash as hex


@dataclass(frozen=True)
class StorageNamespace:
    """Everything that changes the bytes of one pool's storage object.

    Build it with `StorageNamespace.for_pool`; two namespaces are equal exactly when their
    ``digest`` is.

    Attributes:
        model: model id (preset name, or a server's model path plus weight revision).
        pool: pool name (``"kv"``, ``"c4_kv"``...).
        kind: the pool's kind value (``"history"``, ``"state"``, ``"anchor"``).
        buffers: ``(role, row_shape, dtype)`` of every per-layer buffer, scales included.
        tokens_per_row: token slots per row.
        page_size: anchor tokens per page (the unit a page hash covers).
        rows_per_object: rows of one storage object (a page, or a state snapshot).
        layer_ids: model layers this pool holds on this rank, in pool order.
        row_bytes: bytes of one row of one layer (all buffers).
        tp_rank: tensor-parallel rank, 0 <= tp_rank < tp_size.
        tp_size: tensor-parallel size, >= 1.
        extra: anything else that changes the bytes (e.g. a kernel version), free text.
        host_dtype: the host format (``--hicache-host-dtype``): ``"auto"`` (the device's
            bytes; left out of the digest, so namespaces from before the flag stay valid)
            or ``"int8"`` (int8 pages are never read as bf16, nor the reverse).
        schema_version: page format and key derivation version.
    """

    model: str
    pool: str
    kind: str
    buffers: tuple[tuple[str, tuple[int, ...], str], ...]
    tokens_per_row: int
    page_size: int
    rows_per_object: int
    layer_ids: tuple[int, ...]
    row_bytes: int
    tp_rank: int = 0
    tp_size: int = 1
    extra: str = ""
    schema_version: int = SCHEMA_VERSION
    host_dtype: str = "auto"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must be a non-empty model id")
        if model_id_too_long(self.model):
            raise ValueError(f"model (--hicache-storage-model-id): {model_id_too_long(self.model)}")
        for name in ("tokens_per_row", "page_size", "rows_per_object", "row_bytes", "tp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank: must be in [0, tp_size={self.tp_size}), got {self.tp_rank}")
        if not self.layer_ids:
            raise ValueError(f"layer_ids: pool {self.pool!r} holds no layers; only data pools go to storage")
        if self.host_dtype not in ("auto", "int8"):
            raise ValueError(f"host_dtype: must be 'auto' or 'int8', got {self.host_dtype!r}")

    @classmethod
    def for_pool(cls, stack: Stack, pool: str, *, model: str | None = None, tp_rank: int = 0,
                 tp_size: int = 1, rows_per_object: int | None = None,
                 layer_ids: Sequence[int] | None = None, extra: str = "",
                 host_dtype: str = "auto") -> "StorageNamespace":
        """The namespace of one data pool of ``stack``.

        Args:
            stack: the model's validated stack.
            pool: a data pool's name.
            model: model id; defaults to ``stack.model``.
            tp_rank, tp_size: this rank's tensor-parallel position.
            rows_per_object: rows per object; default: a whole page for history/anchor
                pools, the trailing window (``ceil(window_tokens / tokens_per_row)``) for
                state pools.
            layer_ids: model layers held here (pipeline stages); default: the spec's.
            extra: free text folded into the digest.
            host_dtype: the host format; ``stack`` must then be the host stack (its int8
                pools' buffers and row bytes are what a page object holds).

        Raises:
            ValueError: unknown or data-less pool, or bad rank/size/rows.
        """
        spec = stack.pool(pool)
        if not spec.has_data:
            raise ValueError(f"pool: {pool!r} holds no data; only data pools go to storage")
        return cls(
            model=stack.model if model is None else model, pool=spec.name, kind=spec.kind.value,
            buffers=tuple((b.role, b.row_shape, str(b.dtype).removeprefix("torch.")) for b in spec.buffers),
            tokens_per_row=spec.tokens_per_row, page_size=stack.page_size,
            rows_per_object=_default_rows(spec, stack.page_size) if rows_per_object is None else rows_per_object,
            layer_ids=tuple(spec.layer_ids if layer_ids is None else layer_ids), row_bytes=spec.row_bytes,
            tp_rank=tp_rank, tp_size=tp_size, extra=extra, host_dtype=host_dtype)

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 of the canonical JSON of every field (32 bytes)."""
        return describe_digest(self.describe())

    @property
    def digest_hex(self) -> str:
        return self.digest.hex()

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    @property
    def object_bytes(self) -> int:
        """Payload bytes of one object: ``rows_per_object x num_layers x row_bytes``."""
        return self.rows_per_object * self.num_layers * self.row_bytes

    def describe(self) -> dict:
        """The fields as plain JSON types (what the digest covers)."""
        doc = {"schema_version": self.schema_version, "model": self.model, "pool": self.pool,
               "kind": self.kind, "buffers": [[r, list(s), d] for r, s, d in self.buffers],
               "tokens_per_row": self.tokens_per_row, "page_size": self.page_size,
               "rows_per_object": self.rows_per_object, "layer_ids": list(self.layer_ids),
               "row_bytes": self.row_bytes, "tp_rank": self.tp_rank, "tp_size": self.tp_size,
               "extra": self.extra}
        if self.host_dtype != "auto":  # the default's digest is the one from before the flag
            doc["host_dtype"] = self.host_dtype
        return doc

    def object_key(self, page_hash: str) -> str:
        """The store-wide name of one page's object in this namespace."""
        return f"{self.digest_hex[:32]}_{page_hash}"


def describe_digest(doc: dict) -> bytes:
    """SHA-256 of the canonical JSON of a `StorageNamespace.describe` document (what
    ``digest`` is; a store checks a namespace directory's ``namespace.json`` with it)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()


def _default_rows(spec: PoolSpec, page_size: int) -> int:
    if spec.kind is PoolKind.STATE:
        return math.ceil(spec.window_tokens / spec.tokens_per_row)
    return page_size // spec.tokens_per_row


def chain_seed(cache_salt: str | bytes | None = None) -> bytes:
    """The hash before the first page: a fixed tag plus the tenant's salt (if any)."""
    salt = cache_salt.encode() if isinstance(cache_salt, str) else (cache_salt or b"")
    return hashlib.sha256(_CHAIN_SEED + salt).digest()


def page_hashes(token_ids: Sequence[int] | np.ndarray | torch.Tensor, page_size: int, *,
                cache_salt: str | bytes | None = None, prior_hash: str | None = None) -> list[str]:
    """Chained SHA-256 of every whole page of ``token_ids`` (a trailing partial page has none).

    Args:
        token_ids: the prefix's token ids (1-D integers).
        page_size: tokens per page, >= 1.
        cache_salt: per-tenant salt; different salts give disjoint key spaces.
        prior_hash: hex hash of the page before ``token_ids[0]`` (continuing a chain);
            ``cache_salt`` is then already folded into it and must be ``None``.

    Returns:
        One 64-char hex hash per whole page, in order.

    Raises:
        ValueError: bad page size, non-integer or non-1-D ids, ids outside int64 (uint64
            ids of 2**63 or more would share the bytes of negative ones; `hicache.tokens`),
            a malformed prior hash, or both ``prior_hash`` and ``cache_salt``.
    """
    if page_size < 1:
        raise ValueError(f"page_size: must be >= 1, got {page_size}")
    ids = int64_token_ids(token_ids, not_integer=ValueError)  # the tree's keys: ids beyond int64 refused
    if ids.ndim != 1:
        raise ValueError(f"token_ids: need a 1-D integer sequence, got shape {ids.shape}")
    if prior_hash is not None:
        if cache_salt is not None:
            raise ValueError("cache_salt: already folded into prior_hash; pass one or the other")
        check_keys([prior_hash], what="prior_hash")
        prev = bytes.fromhex(prior_hash)
    else:
        prev = chain_seed(cache_salt)
    raw = ids[: ids.size - ids.size % page_size].astype("<i8", copy=False).tobytes()
    step, out = page_size * 8, []
    for off in range(0, len(raw), step):
        prev = hashlib.sha256(prev + raw[off:off + step]).digest()
        out.append(prev.hex())
    return out


_HEX = frozenset("0123456789abcdef")


def check_keys(keys: Sequence[str], what: str = "keys") -> None:
    """Every key is a 64-char lowercase hex page hash, else ``ValueError`` naming ``what``."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{what}: need a sequence of page hashes, got a single {type(keys).__name__}")
    for i, k in enumerate(keys):
        if not (isinstance(k, str) and len(k) == KEY_HEX_CHARS and _HEX.issuperset(k)):
            raise ValueError(f"{what}[{i}]: need a {KEY_HEX_CHARS}-char lowercase hex page hash "
                             f"(from page_hashes), got {k!r}")
