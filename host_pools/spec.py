"""Pool specifications: what a pool holds, how its rows are indexed, and a validated stack.

A *pool* is a named family of per-layer buffers that move together. A *row* is the
transfer unit of one pool (``tokens_per_row`` token slots); every per-layer buffer is
``[num_rows, *row_shape]``. A *stack* is the ordered set of pools of one model, with
exactly one anchor whose token slots the radix tree stores.

Index derivation (DESIGN §1): the row of an aligned run of token slots is
``slots.view(-1, tokens_per_row)[:, 0] // tokens_per_row``. A sidecar (``indices_from``
set) has no allocator: its rows come from its *source* pool's token slots.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch


class PoolKind(enum.Enum):
    """What a pool is for; the hit policy follows from it."""

    ANCHOR = "anchor"  # the token-slot space the radix tree stores (data or none)
    HISTORY = "history"  # every page of a prefix is needed (KV, compressed KV, indexer)
    STATE = "state"  # only the state at the match end: a trailing window (SWA, compressor rings)
    # or a recurrent state (a linear-attention layer's conv and recurrent state: `PoolSpec.recurrent`)


class HitPolicy(enum.Enum):
    """Which pages of a matched prefix a pool must hold for the match to be usable."""

    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class BufferSpec:
    """One per-layer tensor of a pool: data (``"k"``, ``"kv"``...) or scales (``"k_scale"``).

    Attributes:
        role: the buffer's name inside its pool; unique per pool.
        row_shape: shape of one row (all ``tokens_per_row`` tokens of it).
        dtype: element type on the device; host rows are opaque bytes.
    """

    role: str
    row_shape: tuple[int, ...]
    dtype: torch.dtype = torch.uint8

    def __post_init__(self) -> None:
        _require(bool(self.role), "BufferSpec.role: must be a non-empty string")
        shape = tuple(int(s) for s in self.row_shape)
        object.__setattr__(self, "row_shape", shape)
        _require(len(shape) >= 1 and all(s > 0 for s in shape),
                 f"BufferSpec.row_shape: every dimension must be > 0, got {shape}")
        _require(isinstance(self.dtype, torch.dtype),
                 f"BufferSpec.dtype: must be a torch.dtype, got {self.dtype!r}")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of this buffer for one layer."""
        return math.prod(self.row_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class PoolSpec:
    """A named family of per-layer buffers that move together.

    Attributes:
        name: unique pool name within a stack (``"kv"``, ``"swa"``, ``"c4_kv"``).
        kind: ANCHOR, HISTORY or STATE.
        num_layers: layers this pool has (0 only for a data-less anchor).
        buffers: the per-layer buffers, data first and each scale after its data.
        tokens_per_row: token slots per row (the transfer unit), >= 1.
        indices_from: ``None`` (own allocator) or the source pool's name (sidecar).
        window_tokens: STATE pools only: tokens of trailing window needed at a match end
            (a recurrent pool: 1, the state at the boundary's last token).
        layer_ids: model layer of each pool-local layer; defaults to ``range(num_layers)``.
        recurrent: STATE pools only: a row holds a whole fixed-size state (a linear-attention
            layer's conv window or recurrent matrix at one position), not tokens of a ring;
            ``tokens_per_row`` and ``window_tokens`` are 1, so a snapshot is one row. Servers
            take such snapshots every ``--hicache-state-interval`` tokens (`hicache.sizing`).
    """

    name: str
    kind: PoolKind
    num_layers: int
    buffers: tuple[BufferSpec, ...]
    tokens_per_row: int
    indices_from: str | None = None
    window_tokens: int = 0
    layer_ids: tuple[int, ...] | None = field(default=None)
    recurrent: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "buffers", tuple(self.buffers))
        _require(bool(self.name), "PoolSpec.name: must be a non-empty string")
        _require(isinstance(self.kind, PoolKind),
                 f"PoolSpec.kind: must be a PoolKind, got {self.kind!r}")
        _require(self.tokens_per_row >= 1,
                 f"PoolSpec.tokens_per_row: must be >= 1, got {self.tokens_per_row}")
        _require(self.indices_from != self.name,
                 f"PoolSpec.indices_from: pool {self.name!r} cannot be its own source")
        self._check_data()
        self._check_kind()
        ids = tuple(range(self.num_layers)) if self.layer_ids is None else tuple(self.layer_ids)
        _require(len(ids) == self.num_layers and len(set(ids)) == len(ids) and min(ids, default=0) >= 0,
                 f"PoolSpec.layer_ids: need {self.num_layers} distinct non-negative ids, got {ids}")
        object.__setattr__(self, "layer_ids", ids)

    def _check_data(self) -> None:
        roles = [b.role for b in self.buffers]
        _require(len(set(roles)) == len(roles), f"PoolSpec.buffers: duplicate roles in {roles}")
        if self.kind is PoolKind.ANCHOR and not self.buffers:
            _require(self.num_layers == 0,
                     f"PoolSpec.num_layers: a data-less anchor has 0 layers, got {self.num_layers}")
            return
        _require(len(self.buffers) > 0, f"PoolSpec.buffers: pool {self.name!r} needs at least one buffer")
        _require(self.num_layers > 0, f"PoolSpec.num_layers: must be > 0, got {self.num_layers}")

    def _check_kind(self) -> None:
        if self.kind is PoolKind.STATE:
            _require(self.window_tokens > 0,
                     f"PoolSpec.window_tokens: STATE pool {self.name!r} needs window_tokens > 0")
        else:
            _require(self.window_tokens == 0,
                     f"PoolSpec.window_tokens: only STATE pools have a window, {self.name!r} is {self.kind.value}")
        if self.kind is PoolKind.ANCHOR:
            _require(self.indices_from is None,
                     f"PoolSpec.indices_from: the anchor {self.name!r} owns its indices")
        if self.recurrent:
            _require(self.kind is PoolKind.STATE,
                     f"PoolSpec.recurrent: only STATE pools hold a recurrent state, {self.name!r} is {self.kind.value}")
            _require(self.tokens_per_row == 1 and self.window_tokens == 1,
                     f"PoolSpec.recurrent: a recurrent pool's row is one whole state: tokens_per_row and "
                     f"window_tokens must be 1, {self.name!r} has {self.tokens_per_row} and {self.window_tokens}")

    @property
    def hit_policy(self) -> HitPolicy:
        return HitPolicy.TRAILING_PAGES if self.kind is PoolKind.STATE else HitPolicy.ALL_PAGES

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of one layer, all buffers together."""
        return sum(b.row_bytes for b in self.buffers)

    @property
    def has_data(self) -> bool:
        return bool(self.buffers)

    @property
    def is_sidecar(self) -> bool:
        return self.indices_from is not None

    def buffer_offsets(self) -> tuple[int, ...]:
        """Byte offset of each buffer inside a host row (buffers concatenated in spec order)."""
        offs, acc = [], 0
        for b in self.buffers:
            offs.append(acc)
            acc += b.row_bytes
        return tuple(offs)

    def rows_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Row index of each aligned run of ``tokens_per_row`` token slots.

        Raises:
            ValueError: if ``slots`` is not a whole number of aligned, consecutive runs.
        """
        return slots_to_rows(slots, self.tokens_per_row, what=f"slots of pool {self.name!r}")


def slots_to_rows(slots: torch.Tensor, tokens_per_row: int, what: str = "slots") -> torch.Tensor:
    """``slots.view(-1, tokens_per_row)[:, 0] // tokens_per_row`` with the alignment checked.

    Checks run in numpy on a CPU copy (no torch dispatch or thread-pool cost on small
    index tensors); the rows come back as an int64 CPU tensor.

    Raises:
        ValueError: not a 1-D integer tensor, or not whole aligned runs of consecutive slots.
    """
    if slots.dim() != 1 or slots.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: need a 1-D int64 tensor, got shape {tuple(slots.shape)} {slots.dtype}")
    if slots.numel() % tokens_per_row:
        raise ValueError(f"{what}: length {slots.numel()} is not a multiple of tokens_per_row={tokens_per_row}")
    arr = slots.detach().to("cpu", torch.int64).numpy()
    first = arr[::tokens_per_row]
    if tokens_per_row > 1 and arr.size:
        runs = arr.reshape(-1, tokens_per_row)
        consecutive = bool((runs[:, -1] - first == tokens_per_row - 1).all()) and \
            bool((np.diff(runs, axis=1) == 1).all())
        if not (consecutive and bool((first % tokens_per_row == 0).all())):
            raise ValueError(f"{what}: must come in aligned runs of {tokens_per_row} consecutive slots")
    return torch.from_numpy(first // tokens_per_row)


@dataclass(frozen=True)
class Stack:
    """An ordered, validated set of pools with exactly one anchor.

    Attributes:
        pools: the pools, anchor first is not required; order is kept for display.
        page_size: anchor tokens per page; a multiple of every pool's tokens_per_row.
        model: a label (preset name) for tables and results.
    """

    pools: tuple[PoolSpec, ...]
    page_size: int
    model: str = "custom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "pools", tuple(self.pools))
        names = [p.name for p in self.pools]
        _require(len(set(names)) == len(names), f"Stack.pools: duplicate pool names in {names}")
        anchors = [p.name for p in self.pools if p.kind is PoolKind.ANCHOR]
        _require(len(anchors) == 1, f"Stack.pools: need exactly one ANCHOR pool, got {anchors}")
        _require(self.page_size >= 1, f"Stack.page_size: must be >= 1, got {self.page_size}")
        for p in self.pools:
            _require(self.page_size % p.tokens_per_row == 0,
                     f"Stack.page_size: {self.page_size} is not a multiple of pool {p.name!r} "
                     f"tokens_per_row={p.tokens_per_row}")
        self._check_sources()

    def _check_sources(self) -> None:
        by_name = {p.name: p for p in self.pools}
        for p in self.pools:
            if p.indices_from is not None and p.indices_from not in by_name:
                raise ValueError(f"PoolSpec.indices_from: pool {p.name!r} names source "
                                 f"{p.indices_from!r}, which is not in the stack {sorted(by_name)}")
        for p in self.pools:
            seen, cur = [p.name], p
            while cur.indices_from is not None:
                cur = by_name[cur.indices_from]
                if cur.name in seen:
                    raise ValueError(f"PoolSpec.indices_from: sources form a cycle {' -> '.join(seen + [cur.name])}")
                seen.append(cur.name)
        for p in self.pools:
            root = by_name[p.name]
            while root.indices_from is not None:
                root = by_name[root.indices_from]
            if p.recurrent != root.recurrent:  # one snapshot shape per state root
                raise ValueError(f"PoolSpec.recurrent: pool {p.name!r} (recurrent={p.recurrent}) derives from "
                                 f"{root.name!r} (recurrent={root.recurrent}); a state root and its sidecars "
                                 "must be both recurrent or both windowed")

    def __iter__(self) -> Iterator[PoolSpec]:
        return iter(self.pools)

    @functools.cached_property
    def _by_name(self) -> dict[str, PoolSpec]:
        return {p.name: p for p in self.pools}

    @functools.cached_property
    def _roots(self) -> dict[str, PoolSpec]:
        roots = {}
        for p in self.pools:
            cur = p
            while cur.indices_from is not None:
                cur = self._by_name[cur.indices_from]
            roots[p.name] = cur
        return roots

    @functools.cached_property
    def _row_groups(self) -> dict[str, dict[int, tuple[str, ...]]]:
        """root name -> tokens_per_row -> data pools with that root and row size."""
        groups: dict[str, dict[int, list[str]]] = {}
        for p in self.data_pools():
            groups.setdefault(self._roots[p.name].name, {}).setdefault(p.tokens_per_row, []).append(p.name)
        return {r: {t: tuple(names) for t, names in g.items()} for r, g in groups.items()}

    @functools.cached_property
    def anchor(self) -> PoolSpec:
        return next(p for p in self.pools if p.kind is PoolKind.ANCHOR)

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name``; ``ValueError`` listing the known names otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"pool: unknown pool {name!r}; this stack has {[p.name for p in self.pools]}") from None

    @functools.cached_property
    def own_indexed(self) -> tuple[PoolSpec, ...]:
        """Pools with their own allocator (the anchor and e.g. ``swa``)."""
        return tuple(p for p in self.pools if p.indices_from is None)

    @functools.cached_property
    def own_names(self) -> frozenset[str]:
        """Names of the own-indexed pools."""
        return frozenset(p.name for p in self.own_indexed)

    def root_of(self, name: str) -> PoolSpec:
        """The own-indexed pool whose slots ``name``'s rows ultimately derive from."""
        self.pool(name)
        return self._roots[name]

    @functools.cached_property
    def snapshot_slots(self) -> dict[str, int]:
        """Slots one state snapshot takes in each state root (own-indexed STATE pool): the
        largest ``window_tokens`` of the pools rooted there, in whole rows of the root (one
        row for DeepSeek-V4's ``swa`` and for a recurrent ``conv``)."""
        out = {}
        for root in self.own_indexed:
            if root.kind is PoolKind.STATE:
                window = max(p.window_tokens for p in self.pools if self._roots[p.name] is root)
                out[root.name] = -(-window // root.tokens_per_row) * root.tokens_per_row
        return out

    def snapshot_bytes(self) -> dict[str, int]:
        """Bytes (all layers) of one snapshot per state root: its pools' rows of the snapshot."""
        slots = self.snapshot_slots
        return {root: sum(p.row_bytes * p.num_layers * n // p.tokens_per_row
                          for p in self.pools if self._roots[p.name].name == root)
                for root, n in slots.items()}

    def data_pools(self) -> tuple[PoolSpec, ...]:
        return tuple(p for p in self.pools if p.has_data)

    @property
    def num_model_layers(self) -> int:
        return max((max(p.layer_ids) + 1 for p in self.pools if p.num_layers), default=0)

    def derive_rows(self, own_slots: "dict[str, torch.Tensor]", check: bool = True) -> dict[str, torch.Tensor]:
        """Rows of every data pool whose root's token slots are in ``own_slots``.

        Args:
            own_slots: token slots keyed by own-indexed pool name (``{"kv": ..., "swa": ...}``).
            check: validate alignment; ``False`` only for slots already validated for
                their root's page (the controller checks at ``write``/``load`` time).
        Returns:
            ``{pool_name: rows}`` for each data pool rooted at one of the given pools;
            pools with the same root and row size share one rows tensor.
        Raises:
            ValueError: slots not in aligned runs of a pool's ``tokens_per_row``.
        """
        out = {}
        for root, by_rows in self._row_groups.items():
            if root not in own_slots:
                continue
            slots = own_slots[root]
            for tpr, names in by_rows.items():
                if check:
                    rows = slots_to_rows(slots, tpr, what=f"slots of {root!r} (for pool {', '.join(map(repr, names))})")
                else:
                    rows = torch.from_numpy(slots.numpy()[::tpr] // tpr)
                out.update(dict.fromkeys(names, rows))
        return out

    def row_bytes_per_anchor_page(self, names: Sequence[str] | None = None) -> int:
        """Bytes (all layers) one anchor page costs in the pools rooted at the anchor."""
        total = 0
        for p in self.pools:
            if (names is None or p.name in names) and self.root_of(p.name).name == self.anchor.name:
                total += p.row_bytes * p.num_layers * (self.page_size // p.tokens_per_row)
        return total
