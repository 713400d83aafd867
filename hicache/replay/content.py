"""Deterministic cache content for `hicache replay`: fill computed pages, check loaded ones.

The bytes a prefix must hold are a function of (hash of the prompt up to and including
the page, pool, layer, buffer), so any page found anywhere can be checked exactly:

    word w of row r  =  pattern[pool, layer, buffer][w]  XOR  seed(r)
    seed(r)          =  unit_seed(unit of r) + GOLDEN x (index of r inside its unit)
    unit             =  a page (history pools, from the anchor's slots) or a snapshot
                        (state pools, from e.g. swa's slots; seeded by the prefix hash at
                        its boundary, tagged so it never equals a page seed)

Words are the widest integer dividing the buffer's row bytes (int64 for every preset),
so one fill is one vector XOR over the rows plus one ``index_copy_``.

A pool held as int8 on the host (``--hicache-host-dtype int8``) gets content that int8
carries exactly, so every check stays byte for byte: each vector of ``D`` values is
``v_i * 2**k`` with integers ``|v_i| <= 127``, ``v_0 = 127`` and ``k`` in [-8, 7] (all from
the same random bytes): its scale is ``2**k``, its int8 values are ``v_i``, and both
dequantize back to the same bf16/fp16 bits. Patterns, row
indices and seeds live on each pool's device (slots come from the tree on the CPU and are
moved once per call), so fills and checks run where the pool is; checks compare the
integer words, i.e. the bytes.
"""
from __future__ import annotations

import numpy as np
import torch

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed int64
STATE_TAG = 0x5DEECE66D
_MASK = (1 << 64) - 1
_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


class ReplayMismatch(RuntimeError):
    """Bytes found on the device differ from what their prefix must hold."""


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def prefix_hashes(tokens: np.ndarray, page_size: int) -> list[int]:
    """Hash of ``tokens[:(p + 1) * page_size]`` for every page p (64-bit, chained)."""
    pages = tokens.reshape(-1, page_size).astype(np.uint64)
    mult = np.arange(1, 2 * page_size, 2, dtype=np.uint64) * np.uint64(0x9E3779B1)
    with np.errstate(over="ignore"):
        page_hash = (pages * mult).sum(axis=1, dtype=np.uint64)
    out, h = [], 0
    for x in page_hash.tolist():
        h = _mix(h ^ x)
        out.append(h)
    return out


def _signed(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values], dtype=torch.int64)


def state_seed(boundary_hash: int) -> int:
    return _mix(boundary_hash ^ STATE_TAG)


class ContentModel:
    """Writes and checks deterministic bytes in a cache's device pools.

    Args:
        cache: a `hicache.HiCache`.
        seed: picks the per-(pool, layer, buffer) patterns.
    """

    def __init__(self, cache, seed: int = 0) -> None:
        self.stack, self.pools = cache.stack, cache.device_pools
        host = cache.host_group.pools
        self.int8 = {p.name for p in self.stack.data_pools() if host[p.name].spec.buffers != p.buffers}
        g = torch.Generator().manual_seed(seed)
        self.patterns: dict[tuple[str, int, int], torch.Tensor] = {}
        for spec in self.stack.data_pools():
            for layer in range(spec.num_layers):
                for b, buf in enumerate(spec.buffers):
                    size, dtype = next((s, d) for s, d in _WORDS if buf.row_bytes % s == 0)
                    raw = torch.randint(0, 256, (buf.row_bytes,), dtype=torch.uint8, generator=g)
                    self.patterns[(spec.name, layer, b)] = raw.view(dtype).to(self.pools[spec.name].device)

    def _jobs(self, root: str, slots: torch.Tensor, unit_seeds: list[int]):
        """(pool name, rows, row seeds) for every data pool rooted at ``root``, on the pool's device."""
        units = len(unit_seeds)
        seeds = _signed(unit_seeds)
        for name, rows in self.stack.derive_rows({root: slots.cpu()}).items():
            per_unit = rows.numel() // units if units else 0
            inner = torch.arange(per_unit, dtype=torch.int64) * _GOLDEN
            row_seeds = (seeds[:, None] + inner[None, :]).reshape(-1)
            device = self.pools[name].device
            yield name, rows.to(device), row_seeds.to(device)

    def _words(self, name: str, layer: int, b: int) -> torch.Tensor:
        view = self.pools[name].row_views()[layer][b]
        return view.view(self.patterns[(name, layer, b)].dtype)

    def _expected(self, name: str, layer: int, b: int, row_seeds: torch.Tensor) -> torch.Tensor:
        pattern = self.patterns[(name, layer, b)]
        words = pattern[None, :] ^ row_seeds.to(pattern.dtype)[:, None]
        return self._int8_exact(words, self.stack.pool(name).buffers[b]) if name in self.int8 else words

    @staticmethod
    def _int8_exact(words: torch.Tensor, buf) -> torch.Tensor:
        """Random words as values an int8 host row holds exactly (module docstring)."""
        n, vec = words.shape[0], buf.row_shape[-1]
        raw = words.view(torch.int8).view(n, -1)[:, : buf.row_bytes // buf.dtype.itemsize]
        vals = raw.clamp(min=-127).view(n, -1, vec).to(torch.float32)
        vals[..., 0] = 127.0  # absmax 127: the scale is exactly 2**k
        k = (raw.view(n, -1, vec)[..., :1].to(torch.int64) & 15) - 8
        vals = vals * torch.pow(2.0, k.to(torch.float32))
        return vals.to(buf.dtype).view(n, -1).view(torch.uint8).view(words.dtype)

    def fill(self, root: str, slots: torch.Tensor, unit_seeds: list[int]) -> None:
        """Write the content of ``len(unit_seeds)`` units (pages or snapshots) at ``slots``."""
        if not slots.numel():
            return
        for name, rows, row_seeds in self._jobs(root, slots, unit_seeds):
            for layer in range(self.stack.pool(name).num_layers):
                for b in range(len(self.stack.pool(name).buffers)):
                    self._words(name, layer, b).index_copy_(0, rows, self._expected(name, layer, b, row_seeds))

    def verify(self, root: str, slots: torch.Tensor, unit_seeds: list[int], what: str) -> int:
        """Check the units at ``slots``; returns bytes checked.

        Raises:
            ReplayMismatch: the first row that differs, named by ``what``, pool, layer, unit.
        """
        checked = 0
        if not slots.numel():
            return checked
        for name, rows, row_seeds in self._jobs(root, slots, unit_seeds):
            per_unit = rows.numel() // len(unit_seeds)
            for layer in range(self.stack.pool(name).num_layers):
                for b, buf in enumerate(self.stack.pool(name).buffers):
                    got = self._words(name, layer, b).index_select(0, rows)
                    want = self._expected(name, layer, b, row_seeds)
                    if not torch.equal(got, want):
                        bad = int((got != want).any(dim=1).nonzero()[0, 0])
                        raise ReplayMismatch(f"{what}: pool {name!r} layer {layer} buffer {buf.role!r}: unit "
                                             f"{bad // per_unit} (device row {int(rows[bad])}) does not hold "
                                             "the bytes its prefix must hold")
                    checked += got.numel() * got.element_size()
        return checked
