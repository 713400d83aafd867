"""`PagedSeq`: one running request's view of hicache's device pools, addressed as a server does.

Every tensor the reference models read or write is a row of a `DevicePool`
(``pools[name].tensors[layer][buffer]``), found from the request's slots through
``stack.derive_rows`` — nothing is copied out and back:

    anchor slots (whole pages)  --derive_rows-->  kv rows      (MHA: k, v of a page)
                                                  c4_kv rows   (DSV4: page // 4 entries)
                                                  c4_indexer rows, c128_kv rows
    working swa slots (1 row)   --derive_rows-->  swa row      (ring: token p at p % window)
                                                  c4_state, c4_indexer_state rows (same index;
                                                  ring: token p at p % (2 * c4 ratio))
    working conv slot (1 row)   --derive_rows-->  conv, recurrent rows (a linear-attention
                                                  hybrid: the whole state of every linear layer)

History entries of a compressed pool: entry ``e`` (tokens ``[e*r, (e+1)*r)``) lives in the
row of the page holding those tokens, at ``e % (page_size // r)``.

Entries are read and written through the pool's codec (``codecs[name]``): none for typed
rows (``[rows, entries, dim]``, indexed as they are), `hicache.reference.fp8_ds_mla.Fp8Rows`
for DeepSeek-V4's fp8 byte rows (quantized on write, dequantized on read).

The working row of the state root (`state_root`: ``swa``, or ``conv``) is the request's own
state; a *snapshot* at a boundary is a copy of it (every pool rooted there, every layer)
into a fresh row (`copy_state`), which the tree takes with ``insert(..., extra={root:
slots})``; resuming from a node's snapshot copies the other way. The HCA compressor's partial window is request-local scratch (``scratch``):
it is empty at every page boundary (the page is a multiple of the HCA ratio), so no
snapshot needs it.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol

import torch

from host_pools.spec import Stack
from hicache.device_pool import DevicePool


class RowCodec(Protocol):
    """How a pool's rows hold entries (``t`` is one layer's ``[rows, *row_shape]`` tensor)."""

    def entries(self, t: torch.Tensor) -> int: ...

    def read(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor: ...

    def write(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None: ...

    # read(write(values)); for typed rows `PagedSeq.round_trip` casts instead
    def round_trip(self, values: torch.Tensor) -> torch.Tensor: ...


class TypedRows:
    """Typed rows ``[rows, entries, dim]``: entries stored as they are."""

    def entries(self, t: torch.Tensor) -> int:
        return t.shape[1]

    def read(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return t[rows, slots]

    def write(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
        t[rows, slots] = values.to(t.dtype)


TYPED = TypedRows()


@dataclass(slots=True)
class PagedSeq:
    """A request's slots and progress (a server's per-request state; mutable).

    Attributes:
        stack / pools: the model's stack and its device pools (keyed by name).
        slots: anchor device slots of whole pages covering every position computed.
        work: slots of the working row of the state root (`state_root`), or ``None`` (a
            stack without state pools).
        length: tokens computed so far (the next token's position); at 0 the working row is
            zeroed (the state before the first token).
        scratch: request-local state the pools do not hold (partial HCA windows).
        codecs: the codec of each pool whose rows are not typed entries (the model's
            ``codecs``); a byte-row pool without one is refused.
    """

    stack: Stack
    pools: Mapping[str, DevicePool]
    slots: torch.Tensor
    work: torch.Tensor | None = None
    length: int = 0
    scratch: dict = field(default_factory=dict)
    codecs: Mapping[str, RowCodec] = field(default_factory=dict)
    _rows: dict = field(default_factory=dict)
    _work_row: int = -1

    def __post_init__(self) -> None:
        raw = [p.name for p in self.stack.data_pools()
               if p.buffers[0].dtype == torch.uint8 and p.name not in self.codecs]
        if raw:
            raise ValueError(f"codecs: pools {raw} hold byte rows; pass the model's codecs")
        device = next(p.device for p in self.pools.values())
        own = {self.stack.anchor.name: self.slots}
        root = state_root(self.stack)
        if self.work is not None:
            own[root] = self.work
        rows = self.stack.derive_rows(own)
        if self.work is not None:
            self._work_row = int(rows[root][0])
        self._rows = {name: r.to(device) for name, r in rows.items()}
        if self.work is not None and self.length == 0:  # a fresh sequence starts from the empty state
            clear_state(self.stack, self.pools, self.work)

    @property
    def capacity(self) -> int:
        """Positions the slots cover."""
        return int(self.slots.numel())

    def positions(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """Positions of the next ``num_tokens`` tokens (a model's forward checks its chunk here).

        Raises:
            ValueError: an empty chunk, or one past the slots the sequence holds.
        """
        if num_tokens < 1 or self.length + num_tokens > self.capacity:
            raise ValueError(f"token_ids: {num_tokens} tokens at position {self.length} do not fit the "
                             f"{self.capacity} slots of the sequence")
        return torch.arange(self.length, self.length + num_tokens, device=device)

    def tensor(self, pool: str, layer: int) -> torch.Tensor:
        """The device tensor of model layer ``layer`` in ``pool`` (``[rows, *row_shape]``)."""
        spec = self.pools[pool].spec
        return self.pools[pool].tensors[spec.layer_ids.index(layer)][0]

    def rows(self, pool: str) -> torch.Tensor:
        """The request's rows of ``pool`` (device int64)."""
        return self._rows[pool]

    # ---- history: compressed entries / MHA pages ----------------------------------------
    def append_kv(self, pool: str, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the chunk's ``k`` / ``v`` (``[n, kv_heads, d]``, positions from ``length``)
        into ``pool``'s page rows (buffers ``k``, ``v``: ``[rows, page, kv_heads, d]``) and
        read back the keys and values of every position up to the chunk's end, in the
        chunk's dtype (a bf16 pool is read back as the model computes)."""
        spec = self.pools[pool].spec
        k_buf, v_buf = self.pools[pool].tensors[spec.layer_ids.index(layer)]
        page, rows = k_buf.shape[1], self.rows(pool)
        at = torch.arange(self.length, self.length + k.shape[0], device=k.device)
        k_buf[rows[at // page], at % page] = k.to(k_buf.dtype)
        v_buf[rows[at // page], at % page] = v.to(v_buf.dtype)
        end = self.length + k.shape[0]
        return (k_buf[rows].reshape(-1, *k.shape[1:])[:end].to(k.dtype),
                v_buf[rows].reshape(-1, *v.shape[1:])[:end].to(v.dtype))

    def codec(self, pool: str) -> RowCodec:
        """How ``pool``'s rows hold entries."""
        return self.codecs.get(pool, TYPED)

    def round_trip(self, pool: str, values: torch.Tensor) -> torch.Tensor:
        """``values`` as a read of them written to ``pool`` returns them, in their dtype (fp8:
        dequantize(quantize); typed rows: a cast to the pool's dtype and back)."""
        codec = self.codecs.get(pool)
        if codec is not None:
            return codec.round_trip(values).to(values.dtype)
        return values.to(self.pools[pool].spec.buffers[0].dtype).to(values.dtype)

    def read_entries(self, pool: str, layer: int, count: int) -> torch.Tensor:
        """Entries ``[0, count)`` of a compressed pool (``[count, dim]``), read in place."""
        t, codec = self.tensor(pool, layer), self.codec(pool)
        e = torch.arange(count, device=t.device)
        per_row = codec.entries(t)
        return codec.read(t, self.rows(pool)[e // per_row], e % per_row)

    def write_entries(self, pool: str, layer: int, first: int, values: torch.Tensor) -> None:
        """Entries ``[first, first + len(values))`` into their pages' rows."""
        t, codec = self.tensor(pool, layer), self.codec(pool)
        e = torch.arange(first, first + values.shape[0], device=t.device)
        per_row = codec.entries(t)
        codec.write(t, self.rows(pool)[e // per_row], e % per_row, values)

    def state(self, pool: str, layer: int) -> torch.Tensor:
        """The working row of a recurrent ``pool`` at model layer ``layer`` (a view: writes
        to it write the pool)."""
        return self.tensor(pool, layer)[self._work_row]

    # ---- rings: the working swa row and its sidecars ------------------------------------
    def read_ring(self, pool: str, layer: int, start: int, end: int) -> torch.Tensor:
        """Tokens ``[start, end)`` of a ring (``start >= end - ring size``)."""
        t, codec = self.tensor(pool, layer), self.codec(pool)
        slots = torch.arange(start, end, device=t.device) % codec.entries(t)
        return codec.read(t, torch.full_like(slots, self._work_row), slots)

    def write_ring(self, pool: str, layer: int, start: int, values: torch.Tensor) -> None:
        """Tokens ``[start, start + len(values))``; only the last ring-size of them stay."""
        t, codec = self.tensor(pool, layer), self.codec(pool)
        size = codec.entries(t)
        keep = min(values.shape[0], size)
        end = start + values.shape[0]
        slots = torch.arange(end - keep, end, device=t.device) % size
        codec.write(t, torch.full_like(slots, self._work_row), slots, values[-keep:])


def state_root(stack: Stack) -> str | None:
    """The stack's state root (``swa``, ``conv``), whose slots a snapshot takes; ``None`` without one."""
    return next(iter(stack.snapshot_slots), None)


def clear_state(stack: Stack, pools: Mapping[str, DevicePool], slots: torch.Tensor) -> None:
    """Zero the state root's row ``slots`` and every pool derived from it, all layers: the
    state before the first token."""
    for name, rows in stack.derive_rows({state_root(stack): slots}).items():
        pool = pools[name]
        for bufs in pool.tensors:
            for t in bufs:
                t[rows.to(pool.device)] = 0


def copy_state(stack: Stack, pools: Mapping[str, DevicePool], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy the state root's row ``src`` (slots) and every pool derived from it to row
    ``dst``, all layers, in place: a snapshot (working row -> fresh row) or a resume
    (snapshot -> working row)."""
    root = state_root(stack)
    src_rows, dst_rows = stack.derive_rows({root: src}), stack.derive_rows({root: dst})
    for name, rows in src_rows.items():
        pool = pools[name]
        s, d = rows.to(pool.device), dst_rows[name].to(pool.device)
        for bufs in pool.tensors:
            for t in bufs:
                t[d] = t[s]


class PagedModel(abc.ABC):
    """A reference model whose state lives in hicache's pools (subclasses give `_logits`).

    Attributes:
        codecs: the codecs its pools' rows need (`PagedSeq.codecs`); none: typed rows.
    """

    device: torch.device
    codecs: Mapping[str, RowCodec] = MappingProxyType({})

    @torch.no_grad()
    def forward(self, seq: PagedSeq, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[n, vocab]`` of the next ``n`` tokens of ``seq``; writes their state into
        the pools and advances ``seq.length``.

        Raises:
            ValueError: the chunk runs past the slots ``seq`` holds, or is empty.
        """
        ids = token_ids.to(self.device)
        logits = self._logits(seq, ids, seq.positions(ids.numel(), self.device))
        seq.length += ids.numel()
        return logits

    @abc.abstractmethod
    def _logits(self, seq: PagedSeq, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits of tokens ``ids`` at positions ``pos`` (``seq.length`` is still the first)."""

