"""A request as the adaptive policy's mini caches see it: a chain of named chunks.

Two owners, two shapes of request, one chain:

    owner        request                       chunk                          name
    radix tree   its prompt's int64 token ids  `CHUNK_TOKENS` tokens (a whole   crc32 of the chunk's first and
                 (`TokenChains`)               number of pages; the last        last 8 tokens' bytes (and a
                                               one partial)                     partial one's length), started
                                                                                from the previous chunk's name
    vLLM plugin  one group's offload keys      one host chunk                   the key's hash (vLLM's keys
                 (`KeyChains`)                                                  are prefix hashes already)

Both name a chain below its first chunk for sampling (`sample_hash`: the second chunk's
name, or the first's when there is one), and both recognise the same request heard
again (a tree matches a prompt again after a load or a prefetch; vLLM looks a waiting
request up again: the same length, start and end as the last one heard): ``heard``
answers ``None`` for it, so that it is counted once.
"""
from __future__ import annotations

import zlib
from typing import Hashable, Sequence

import numpy as np

CHUNK_TOKENS = 512  # the unit of the mini caches (a Mooncake block)
SAMPLE_BYTES = 64  # a chunk is named by its first and last 8 token ids
_MASK = (1 << 32) - 1


class TokenChains:
    """Chains of a tree's prompts (int64 token ids, whole pages).

    Args:
        page_size: the tree's page (a chunk is a whole number of pages).
    """

    def __init__(self, page_size: int) -> None:
        self.chunk_tokens = page_size * max(1, CHUNK_TOKENS // page_size)
        self._stride = self.chunk_tokens * 8
        self._last: tuple | None = None

    def heard(self, key: np.ndarray) -> tuple[int, int] | None:
        """(tokens, sample hash) of a new request, or None: the last one heard again."""
        mv = memoryview(key).cast("B")
        h = zlib.crc32(mv[:SAMPLE_BYTES])
        if len(mv) > self._stride:
            h = zlib.crc32(mv[self._stride:self._stride + SAMPLE_BYTES], h)
        ident = (len(mv), h, zlib.crc32(mv[-SAMPLE_BYTES:]))  # its length, start and end
        if ident == self._last:
            return None
        self._last = ident
        return key.size, h

    def chain(self, key: np.ndarray) -> list[tuple[int, int]]:
        """The prompt's chunks root first as (name, tokens)."""
        mv = memoryview(key).cast("B")
        total, stride, out, name = len(mv), self._stride, [], 0
        for start in range(0, total, stride):
            end = min(total, start + stride)
            name = zlib.crc32(mv[end - SAMPLE_BYTES:end], zlib.crc32(mv[start:start + SAMPLE_BYTES], name))
            if end - start < stride:  # the partial last chunk: its length is part of its name
                out.append((zlib.crc32((end - start).to_bytes(4, "little"), name), (end - start) >> 3))
            else:
                out.append((name, stride >> 3))
        return out


class KeyChains:
    """Chains of one vLLM group's offload keys (a lookup's keys, root first).

    Args:
        tokens_per_chunk: tokens one key covers.
    """

    def __init__(self, tokens_per_chunk: int) -> None:
        self.chunk_tokens = max(1, tokens_per_chunk)
        self._last: tuple | None = None

    def heard(self, keys: Sequence[Hashable]) -> tuple[int, int] | None:
        """(tokens, sample hash) of a new request, or None: the last one heard again."""
        if not keys:
            return None
        h = hash(keys[1] if len(keys) > 1 else keys[0]) & _MASK
        ident = (len(keys), h, keys[-1])  # its length, start and end
        if ident == self._last:
            return None
        self._last = ident
        return len(keys) * self.chunk_tokens, h

    def chain(self, keys: Sequence[Hashable]) -> list[tuple[int, int]]:
        t = self.chunk_tokens
        return [(hash(k) & _MASK, t) for k in keys]
