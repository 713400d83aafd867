"""`Shadows`: miniature caches, one per candidate score, over a hashed sample of the traffic
(miniature simulation: Waldspurger et al., USENIX ATC 2017).

The adaptive policy (`hicache.radix.policies.adaptive`) needs the hits each candidate
score would have had on the live traffic. Simulating every candidate at full size costs a
cache's worth of bookkeeping per candidate; a *sample* of the traffic replayed through
caches scaled down by the same rate gives the same hit rates (spatial sampling, SHARDS)
at a fixed cost:

    chunk        a request's prompt cut into ``chunk_tokens`` pieces (the last one
                 partial), each named by its whole prefix (a chain: equal names = equal
                 prefixes), root first
    sample       a request is simulated when the hash of its chain below the first chunk
                 (the first chunk is often one system prompt every request shares) is
                 under ``rate``: a session's turns, which extend each other, are all in or
                 all out, so the sample holds whole prefix chains
    rate         min(1, `MAX_CHUNKS` / (capacity / chunk_tokens)): a small cache is
                 simulated whole
    mini cache   capacity x rate tokens; on a sampled request: hit tokens = the leading
                 run of chunks it holds; every chunk's (last access, requests) updated
                 once for all caches; the chunks it lacks admitted; then its lowest keys
                 evicted until it fits (a key is re-scored when popped: `scores`)
    counts       a chunk's requests are kept while a mini cache holds it and, after, for
                 `GHOST_SPAN` x the chunks a mini cache holds (oldest forgotten first)
    cold         until the first eviction the mini caches hold the same chunks: one dict
                 serves them all (a cache that never fills costs one simulation, not one
                 per candidate)

Every structure is bounded by what the caches hold (entries, not requests): memory is
``nbytes()``. Scheduler thread only.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Sequence

from hicache.radix.policies.scores import Score

MAX_CHUNKS = 1024  # chunks a mini cache holds at most (its capacity / chunk size)
GHOST_SPAN = 4  # counts of evicted chunks kept: this many mini caches' worth
SAMPLE_SPACE = 1 << 32  # sample hashes are 32-bit
_ENTRY_BYTES, _STAT_BYTES = 200, 230  # a held chunk (dict slot + heap tuple), a chunk's counts (tracemalloc)


class _Mini:
    """One candidate's scaled-down cache (chunks it holds, a heap of their keys, tokens)."""

    __slots__ = ("score", "held", "heap", "tokens", "hits")

    def __init__(self, score: Score) -> None:
        self.score = score
        self.held: dict[int, int] = {}  # chunk -> its tokens
        self.heap: list[tuple] = []  # (key, last, -depth, chunk): one per held chunk, maybe stale
        self.tokens = 0
        self.hits = 0  # hit tokens since the owner last read them


class Shadows:
    """Mini caches of every candidate score over a sample of request chains (module docstring).

    Args:
        scores: the candidates (each its own instance: an aging score ages with its cache).
        capacity_tokens: tokens of the cache being modelled (every tier's distinct tokens).
        chunk_tokens: tokens per chunk.
        max_chunks: chunks a mini cache holds at most (sets the rate).
    """

    def __init__(self, scores: Sequence[Score], capacity_tokens: int, chunk_tokens: int,
                 max_chunks: int = MAX_CHUNKS) -> None:
        full = max(1, capacity_tokens // chunk_tokens)
        self.rate = min(1.0, max_chunks / full)
        self.threshold = int(self.rate * SAMPLE_SPACE)
        self.capacity = max(chunk_tokens, int(capacity_tokens * self.rate))
        self.minis = [_Mini(s) for s in scores]
        self._stats: dict[int, list[int]] = {}  # chunk -> [last access, requests, mini caches holding it, depth]
        # until the first eviction every mini cache holds the same chunks: one dict serves them all
        self._cold: dict[int, int] | None = {}
        self._cold_tokens = 0
        self._idle: OrderedDict[int, None] = OrderedDict()  # chunks none holds, oldest first
        self._max_idle = GHOST_SPAN * max(1, self.capacity // max(1, chunk_tokens))
        self.requests = 0

    def sampled(self, sample_hash: int) -> bool:
        """Whether a request whose chain hashes to ``sample_hash`` (32-bit) is simulated."""
        return sample_hash < self.threshold

    def observe(self, chain: Sequence[tuple[int, int]], now: int) -> None:
        """Serve one sampled request: ``chain`` its chunks root first as (name, tokens).

        Mutates the mini caches; each one's ``hits`` grows by the tokens it would have hit.
        """
        self.requests += 1
        cold = self._cold
        for mini in self.minis if cold is None else self.minis[:1]:
            held, hits = cold if cold is not None else mini.held, 0
            for chunk, tokens in chain:
                if chunk not in held:
                    break
                hits += tokens
            mini.hits += hits
        stats, idle = self._stats, self._idle
        for depth, (chunk, _) in enumerate(chain):
            st = stats.get(chunk)
            if st is None:
                stats[chunk] = [now, 1, 0, depth]
            else:
                st[0] = now
                st[1] += 1
        if cold is not None:
            self._admit_cold(chain, now)
            return
        for mini in self.minis:
            self._admit(mini, chain, now)
        while len(idle) > self._max_idle:
            chunk, _ = idle.popitem(last=False)
            if stats[chunk][2] == 0:
                del stats[chunk]

    def _admit_cold(self, chain: Sequence[tuple[int, int]], now: int) -> None:
        """Admit into the one dict of the identical mini caches; past capacity each gets its own."""
        cold = self._cold
        for chunk, tokens in chain:
            if chunk not in cold:
                cold[chunk] = tokens
                self._cold_tokens += tokens
        hits = self.minis[0].hits  # the first mini counted the hits of all
        for mini in self.minis[1:]:
            mini.hits = hits
        if self._cold_tokens <= self.capacity:
            return
        self._cold, stats = None, self._stats
        for mini in self.minis:
            key = mini.score.key
            mini.held, mini.tokens = dict(cold), self._cold_tokens
            mini.heap = [(key(stats[c][0], stats[c][1]), stats[c][0], -stats[c][3], c) for c in cold]
            heapq.heapify(mini.heap)
        for chunk in cold:
            stats[chunk][2] = len(self.minis)
        for mini in self.minis:
            self._shrink(mini, now)

    def _admit(self, mini: _Mini, chain: Sequence[tuple[int, int]], now: int) -> None:
        """Admit the chunks ``mini`` lacks, then evict its lowest keys until it fits."""
        held, heap, stats, key = mini.held, mini.heap, self._stats, mini.score.key
        for depth, (chunk, tokens) in enumerate(chain):
            if chunk in held:
                continue
            st = stats[chunk]
            if st[2] == 0:
                self._idle.pop(chunk, None)
            st[2] += 1
            held[chunk] = tokens
            mini.tokens += tokens
            heapq.heappush(heap, (key(now, st[1]), now, -depth, chunk))
        self._shrink(mini, now)

    def _shrink(self, mini: _Mini, now: int) -> None:
        """Evict ``mini``'s lowest keys until it fits (a key touched since it was pushed goes back)."""
        held, heap, stats, key = mini.held, mini.heap, self._stats, mini.score.key
        while mini.tokens > self.capacity:
            entry = heapq.heappop(heap)
            chunk = entry[3]
            st = stats[chunk]
            fresh = (key(st[0], st[1]), st[0], entry[2], chunk)
            if fresh > entry:  # touched (or aged) since it was pushed: back with its key now
                heapq.heappush(heap, fresh)
                continue
            mini.tokens -= held.pop(chunk)
            mini.score.evicted(entry[0], now)
            st[2] -= 1
            if st[2] == 0:
                self._idle[chunk] = None

    def rescore(self, mini_index: int) -> None:
        """Re-key every chunk of one mini cache (its score's keys may have fallen)."""
        if self._cold is not None:  # no heaps yet
            return
        mini = self.minis[mini_index]
        stats, key = self._stats, mini.score.key
        mini.heap = [(key(stats[c][0], stats[c][1]), stats[c][0], e[2], c) for e in mini.heap for c in (e[3],)]
        heapq.heapify(mini.heap)

    def take_hits(self) -> list[int]:
        """Each mini cache's hit tokens since the last call (then zeroed)."""
        out = [m.hits for m in self.minis]
        for m in self.minis:
            m.hits = 0
        return out

    def entries(self) -> int:
        """Chunks held over all mini caches, plus the chunks whose counts are kept."""
        return sum(len(m.held) for m in self.minis) + len(self._stats) + len(self._cold or ())

    def nbytes(self) -> int:
        """An estimate of the memory the mini caches and counts take (per-entry sizes
        measured with tracemalloc)."""
        held = sum(len(m.held) for m in self.minis) + len(self._cold or ())
        return held * _ENTRY_BYTES + len(self._stats) * _STAT_BYTES
