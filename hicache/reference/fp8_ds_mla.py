"""DeepSeek-V4's ``fp8_ds_mla`` cache format: the page rows of ``swa``, ``c4_kv``, ``c128_kv``
(KV records) and ``c4_indexer`` (indexer keys), quantized on write, dequantized on read.

The real model (head 512 = 448 NoPE + 64 RoPE, index head 128, page 256 tokens) and the toy
(head 64 = 48 NoPE + 16 RoPE, index head 32, page 32) follow the same rules:

    KV record of one entry (a token of ``swa``, an entry of ``c4_kv`` / ``c128_kv``)
      values  NoPE channels as fp8 e4m3, then RoPE channels as bf16   real 448 + 128 = 576 B
                                                                      toy   48 +  32 =  80 B
      scales  one UE8M0 byte per tile of ``tile`` NoPE channels       real 7 tiles of 64
              (scale = 2 ** (byte - 127)), padded with zero bytes     toy  3 tiles of 16
              to a multiple of 8                                      real 7 + 1, toy 3 + 5 = 8 B
    KV page row ([values of every entry][scales of every entry][pad]):
      +------------+------------+-----+--------------+-----+--------------+------+
      | values e0  | values e1  | ... | scales e0    | ... | scales eE-1  | pad  |
      +------------+------------+-----+--------------+-----+--------------+------+
      0            vb           E*vb  E*vb           E*vb + (E-1)*sb     E*(vb+sb)
      padded with zeros to a multiple of vb (FlashMLA's 576-byte alignment):
          real: swa 128 x 584 -> 74 880, c4_kv 64 x 584 -> 37 440, c128_kv 2 x 584 -> 1 728
          toy:  swa  16 x  88 ->  1 440, c4_kv  8 x  88 ->    720, c128_kv 2 x  88 ->   240
    Indexer page row (SGLang's ``index_k_with_scale_buffer``, not padded):
      | keys e0 .. eE-1 as fp8 e4m3 (dim B each) | one fp32 scale per block of min(128, dim)
      channels of each key (a power of two, UE8M0-valued), e0 .. eE-1 |
          real: 64 x (128 + 4) = 8 448; toy: 8 x (32 + 4) = 288

Quantizing a tile (vLLM's cache insert): ``amax = max(|x|, 1e-4)``, exponent ``e = ceil(log2(
amax / 448))`` (exact, from ``frexp``), stored ``x * 2**-e`` clamped to +-448 and rounded to
e4m3; the RoPE channels round to bf16. Every entry is quantized alone, so a value's bytes do
not depend on how its sequence was chunked: the served and the recomputed caches are
byte-identical. The compressor state rings (``c4_state``, ``c4_indexer_state``) stay fp32, as
in the real model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class Dsv4Config(Protocol):
    """The model dims the row layouts read (`hicache.reference.config.Dsv4Config` has them;
    a protocol here: the config imports this module, not the reverse)."""

    head_dim: int
    rope_dim: int
    window: int
    page_size: int
    c4_ratio: int
    hca_ratio: int
    index_head_dim: int
    fp8_tile: int

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4  # an all-zero tile still gets a finite scale
INDEX_BLOCK = 128  # indexer channels per fp32 scale in the real model
KV_POOLS = ("swa", "c4_kv", "c128_kv")
PARTS = ("values", "scales")


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class RowLayout:
    """The byte layout of one pool's page row (module docstring).

    Attributes:
        fp8_dims: channels stored as fp8 e4m3 (KV: NoPE; indexer: the whole key), leading.
        bf16_dims: trailing channels stored as bf16 (KV: RoPE; indexer: 0).
        tile: fp8 channels per scale.
        scale_bytes_each: 1 (UE8M0 byte) or 4 (fp32).
        entries: entries per page row.
        kv: KV record (scales padded to 8 bytes, row to a multiple of the values) or indexer.
    """

    fp8_dims: int
    bf16_dims: int
    tile: int
    scale_bytes_each: int
    entries: int
    kv: bool

    @property
    def dim(self) -> int:
        return self.fp8_dims + self.bf16_dims

    @property
    def tiles(self) -> int:
        return self.fp8_dims // self.tile

    @property
    def value_bytes(self) -> int:
        return self.fp8_dims + 2 * self.bf16_dims

    @property
    def scale_bytes(self) -> int:
        raw = self.tiles * self.scale_bytes_each
        return _round_up(raw, 8) if self.kv else raw

    @property
    def row_bytes(self) -> int:
        raw = self.entries * (self.value_bytes + self.scale_bytes)
        return _round_up(raw, self.value_bytes) if self.kv else raw


def kv_layout(nope: int, rope: int, tile: int, entries: int) -> RowLayout:
    """A KV pool's row: ``entries`` records of ``nope`` fp8 + ``rope`` bf16 channels.

    Raises:
        ValueError: ``tile`` does not divide ``nope``, or a size below 1.
    """
    if min(nope, tile, entries) < 1 or rope < 0 or nope % tile:
        raise ValueError(f"fp8_tile: must divide the NoPE channels ({nope}); got tile {tile}")
    return RowLayout(nope, rope, tile, 1, entries, kv=True)


def indexer_layout(dim: int, entries: int) -> RowLayout:
    """The indexer pool's row: ``entries`` fp8 keys of ``dim``, then their fp32 scales."""
    block = min(INDEX_BLOCK, dim)
    if dim % block:
        raise ValueError(f"index_head_dim: must be a multiple of {INDEX_BLOCK} or below it, got {dim}")
    return RowLayout(dim, 0, block, 4, entries, kv=False)


def layouts(cfg: Dsv4Config) -> dict[str, RowLayout]:
    """Each fp8 pool's row layout for ``cfg``'s dims (pool name -> layout)."""
    nope, page = cfg.head_dim - cfg.rope_dim, cfg.page_size
    return {"swa": kv_layout(nope, cfg.rope_dim, cfg.fp8_tile, cfg.window),
            "c4_kv": kv_layout(nope, cfg.rope_dim, cfg.fp8_tile, page // cfg.c4_ratio),
            "c128_kv": kv_layout(nope, cfg.rope_dim, cfg.fp8_tile, page // cfg.hca_ratio),
            "c4_indexer": indexer_layout(cfg.index_head_dim, page // cfg.c4_ratio)}


def ceil_log2(v: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(v))`` of positive fp32 ``v``, exactly (int32)."""
    mantissa, exponent = torch.frexp(v)  # v = m * 2**e, m in [0.5, 1)
    return torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.int32)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` as fp32 built from its bits (exact; ``e`` in [-126, 127])."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


class Fp8Rows:
    """Reads and writes entries of one pool's byte rows in ``layout`` (``t`` is ``[rows, row_bytes]``
    uint8; ``rows`` / ``slots`` pick one entry each)."""

    def __init__(self, layout: RowLayout) -> None:
        self.layout = layout

    def entries(self, t: torch.Tensor) -> int:
        return self.layout.entries

    # ---- one entry <-> its bytes ------------------------------------------------------
    def exponents(self, x: torch.Tensor) -> torch.Tensor:
        """Each tile's scale exponent ``[n, tiles]`` for values ``x`` ``[n, dim]``."""
        lay = self.layout
        tiles = x[:, :lay.fp8_dims].reshape(x.shape[0], lay.tiles, lay.tile)
        amax = tiles.abs().amax(dim=-1).clamp(min=AMAX_FLOOR)
        return ceil_log2(amax / E4M3_MAX).clamp(-126, 127)

    def encode(self, x: torch.Tensor, exps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(value bytes ``[n, value_bytes]``, scale bytes ``[n, scale_bytes]``) of ``x`` ``[n, dim]``
        fp32, quantized with ``exps`` (default: `exponents` of ``x``)."""
        lay, n, x = self.layout, x.shape[0], x.float()  # fp32 first, whatever the model computes in
        exps = self.exponents(x) if exps is None else exps
        tiles = x[:, :lay.fp8_dims].reshape(n, lay.tiles, lay.tile) * pow2(-exps)[..., None]
        fp8 = tiles.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, lay.fp8_dims)
        rope = x[:, lay.fp8_dims:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, 2 * lay.bf16_dims)
        return torch.cat([fp8, rope], dim=1), self.scale_bytes(exps)

    def scale_bytes(self, exps: torch.Tensor) -> torch.Tensor:
        """Scale bytes ``[n, scale_bytes]`` of exponents ``[n, tiles]`` (padding zero)."""
        lay, n = self.layout, exps.shape[0]
        scales = torch.zeros((n, lay.scale_bytes), dtype=torch.uint8, device=exps.device)
        if lay.scale_bytes_each == 1:  # UE8M0: the fp32 exponent field
            scales[:, :lay.tiles] = (exps + 127).to(torch.uint8)
        else:
            scales[:, :4 * lay.tiles] = pow2(exps).contiguous().view(torch.uint8).reshape(n, 4 * lay.tiles)
        return scales

    def scale_exponents(self, scales: torch.Tensor) -> torch.Tensor:
        """The exponents ``[n, tiles]`` stored in scale bytes ``[n, scale_bytes]``."""
        lay = self.layout
        if lay.scale_bytes_each == 1:
            return scales[:, :lay.tiles].to(torch.int32) - 127
        bits = scales[:, :4 * lay.tiles].contiguous().view(torch.int32)
        return ((bits >> 23) & 0xFF) - 127

    def decode(self, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """fp32 ``[n, dim]`` of value and scale bytes (the attention's read)."""
        lay, n = self.layout, values.shape[0]
        fp8 = values[:, :lay.fp8_dims].contiguous().view(torch.float8_e4m3fn).float()
        if lay.scale_bytes_each == 1:
            scale = pow2(self.scale_exponents(scales))
        else:
            scale = scales[:, :4 * lay.tiles].contiguous().view(torch.float32)
        nope = (fp8.reshape(n, lay.tiles, lay.tile) * scale[..., None]).reshape(n, lay.fp8_dims)
        rope = values[:, lay.fp8_dims:].contiguous().view(torch.bfloat16).float()
        return torch.cat([nope, rope], dim=1)

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x))``: what a read of ``x`` written to the pool returns."""
        return self.decode(*self.encode(x))

    # ---- entries of page rows -----------------------------------------------------------
    def _offsets(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lay = self.layout
        vb, sb = lay.value_bytes, lay.scale_bytes
        v = slots[:, None] * vb + torch.arange(vb, device=slots.device)
        s = lay.entries * vb + slots[:, None] * sb + torch.arange(sb, device=slots.device)
        return v, s

    def read(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Entries ``[n, dim]`` (fp32) at (``rows``, ``slots``), dequantized."""
        v, s = self._offsets(slots)
        return self.decode(t[rows[:, None], v], t[rows[:, None], s])

    def write(self, t: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Quantize ``x`` ``[n, dim]`` into the entries at (``rows``, ``slots``)."""
        values, scales = self.encode(x)
        v, s = self._offsets(slots)
        t[rows[:, None], v] = values
        t[rows[:, None], s] = scales

    def corrupt(self, rows: torch.Tensor, gen: torch.Generator, parts: tuple[str, ...] = PARTS) -> torch.Tensor:
        """A corrupted copy of whole page rows ``[n, row_bytes]`` (a negative control): ``"values"``
        adds N(0, 1) to every entry and re-quantizes it with its stored scales; ``"scales"``
        shifts every tile's exponent by a random non-zero -3..3 (finite: no NaN, no inf).
        Padding stays as it is.

        Raises:
            ValueError: ``parts`` empty or naming something else than ``values`` / ``scales``.
        """
        if not parts or set(parts) - set(PARTS):
            raise ValueError(f"parts: must be a non-empty subset of {PARTS}, got {parts!r}")
        lay = self.layout
        n, e = rows.shape[0], lay.entries
        out = rows.clone()
        slots = torch.arange(e, device=rows.device).repeat(n)
        which = torch.arange(n, device=rows.device).repeat_interleave(e)
        v, s = self._offsets(slots)
        values, scales = out[which[:, None], v], out[which[:, None], s]
        exps = self.scale_exponents(scales)
        if "values" in parts:
            noise = torch.randn((n * e, lay.dim), generator=gen).to(rows.device)
            values = self.encode(self.decode(values, scales) + noise, exps)[0]
        if "scales" in parts:
            sign = torch.randint(0, 2, exps.shape, generator=gen) * 2 - 1
            shift = (torch.randint(1, 4, exps.shape, generator=gen) * sign).to(rows.device)
            scales = self.scale_bytes((exps + shift).clamp(-126, 127))
        out[which[:, None], v], out[which[:, None], s] = values, scales
        return out


def codecs(cfg: Dsv4Config) -> dict[str, Fp8Rows]:
    """The fp8 pools' codecs of ``cfg`` (``PagedSeq.codecs``)."""
    return {name: Fp8Rows(layout) for name, layout in layouts(cfg).items()}


def real_layouts() -> dict[str, RowLayout]:
    """The real model's layouts (head 448 + 64, tile 64, index head 128, page 256, window 128)."""
    return {"swa": kv_layout(448, 64, 64, 128), "c4_kv": kv_layout(448, 64, 64, 64),
            "c128_kv": kv_layout(448, 64, 64, 2), "c4_indexer": indexer_layout(128, 64)}

