"""What any cache could reach on a workload: three hit rates computed from the trace alone.

`hicache replay` prints them beside every run, for that run's capacity, so a user reads
"this run hit 0.131; an ideal LRU of the same size would hit 0.180; no policy could beat
0.429" (the shipped trace, DeepSeek-V4 Flash, 262,144 device tokens, ratio 4). Every
figure is in the replay's own units:

    block      one page (``page_size`` tokens of the replay's model) of a request's prompt,
               named by the whole prompt up to and including it (a prefix identity: two
               blocks are equal when everything before them is too). A prompt is cut to whole
               pages, as the replay caches it: its last partial page never hits.
    capacity   C = (device tokens + host tokens of the run's anchor pool) // page_size blocks,
               the two tiers counted as one exclusive pool (the device-only run: the device
               alone). A write-through host holds copies of device pages, so a run holds
               fewer distinct blocks than C: a bound, not a promise.
    order      requests one at a time in trace order; a request is matched against the
               cache as it was before it, then all its blocks join the cache (a prompt never
               hits itself), then blocks leave until at most C remain.
    hit rate   sum over requests of (blocks of its leading run found in the cache) x
               page_size, over the sum of ``input_length`` (every prompt counted once, as
               the replay's ``hit`` column counts it).

    infinite   C = infinity: a block hits when any earlier request had it. No cache of any
               size or policy beats it.
    lru        the ideal prefix-block LRU: after a request its blocks are the most recent
               ones (within a request the deeper block counts as older, so a leaf leaves
               before its parent, as a radix tree evicts); the least recent leaves first.
               What the replay's LRU tree would reach with none of a server's constraints.
    belady     the clairvoyant cache (Belady's MIN, with bypass): the requests' blocks read
               as one sequence of accesses; on a miss with C blocks cached, of the cached
               blocks and the incoming one, the block whose next access is furthest away is
               dropped (the incoming one is then not cached). MIN is optimal for uniform
               blocks: no policy keeping any C blocks it has computed (in any order, on any
               tier) has more blocks present at their accesses, and a prefix hit needs its
               blocks present, so no policy's hit rate can exceed it (a storage tier adds
               capacity of its own: its runs can). The set MIN keeps stays closed under
               prefixes (a block's next access never comes after its descendant's), so a
               prefix cache reaches it: the bound is tight.

Hybrid stacks add two bounds under the snapshot rule (`hicache.replay.snapshots`): a hit
ends at the deepest boundary of its leading run where an earlier prefill saved a
snapshot, a prefill saves only where it computes (the prompt's end and the rule's
interval boundaries past its hit), and a snapshot leaves with its page:

    infinite_snapshots   C = infinity under the rule: no cache obeying it can do better
                         (``infinite - infinite_snapshots``: the hit lost to boundaries)
    lru_snapshots        the ideal prefix-block LRU under the rule, what the replay's LRU
                         reaches at best (`docs/RESULTS.md` measured DeepSeek-V4's gap so)

Cost: one pass to name the blocks (a dict walk of the requests' ``hash_ids``), numpy for
the next accesses and the runs (`TraceBounds`), then one heap-based pass per capacity for
``belady`` and one ordered-dict pass for ``lru``: about 3 s for a 12k-request trace, then
0.1-0.3 s per capacity (`bench/replay.py --bounds`).
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from hicache.replay.workload import BLOCK_TOKENS, Request

if TYPE_CHECKING:
    from hicache.replay.snapshots import SnapshotRule

__all__ = ["Bounds", "TraceBounds", "block_ids"]


class Bounds(NamedTuple):
    """The three hit rates at one capacity (fractions of prompt tokens)."""

    capacity_tokens: int
    infinite: float
    lru: float
    belady: float
    infinite_snapshots: float | None = None  # hybrid stacks: under the snapshot rule
    lru_snapshots: float | None = None


def block_ids(requests: Sequence[Request], page_size: int) -> list[np.ndarray]:
    """Per request, the ids of its whole pages (int64, dense from 0; equal id = equal prefix).

    A page's id is (the path of ``hash_ids`` up to the block holding its last token, its
    page index): the tokens of a prefix are a function of that path
    (`hicache.replay.workload.request_tokens`).
    """
    trie: dict[tuple[int, int], int] = {}
    stride = BLOCK_TOKENS // page_size + 2  # pages that end inside one 512-token block, plus slack
    out: list[np.ndarray] = []
    for req in requests:
        pages = req.input_length // page_size
        if not pages:
            out.append(np.empty(0, dtype=np.int64))
            continue
        nodes, parent = [], 0
        for h in req.hash_ids[:(pages * page_size - 1) // BLOCK_TOKENS + 1]:
            parent = trie.setdefault((parent, h), len(trie) + 1)
            nodes.append(parent)
        p = np.arange(pages, dtype=np.int64)
        last_block = ((p + 1) * page_size - 1) // BLOCK_TOKENS
        offset = p - last_block * BLOCK_TOKENS // page_size
        out.append(np.asarray(nodes, dtype=np.int64)[last_block] * stride + offset)
    flat = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
    _, dense = np.unique(flat, return_inverse=True)
    return np.split(dense.astype(np.int64), np.cumsum([len(k) for k in out])[:-1])


class TraceBounds:
    """The bounds of one workload at one page size, each capacity computed once.

    The blocks are simulated in runs: consecutive blocks of a prompt that every request
    having one of them has all of (a block and its child with the same access count), so
    their accesses are always consecutive. A run is cached as a count of its leading
    blocks; both policies drop a run's deepest blocks first, which is what they would do
    block by block, so the figures are the per-block ones at a fraction of the cost.

    Args:
        requests: the workload, in order.
        page_size: the replay's page (tokens).
        rule: the snapshot rule of a hybrid stack (adds the ``*_snapshots`` bounds), or ``None``.
    """

    def __init__(self, requests: Sequence[Request], page_size: int, rule: SnapshotRule | None = None) -> None:
        self.page_size = page_size
        self.prompt_tokens = max(1, sum(r.input_length for r in requests))
        pages = block_ids(requests, page_size)
        self.rule, self._pages = rule, (pages if rule is not None else [])
        self.snapshots_saved = 0  # snapshots the prefills save with an infinite cache (hybrid stacks)
        self._infinite_snapshots = None
        if rule is not None:
            hits, self.snapshots_saved = snapshot_hits(pages, rule, page_size, None)
            self._infinite_snapshots = self._rate(hits)
        flat = np.concatenate(pages) if pages else np.empty(0, dtype=np.int64)
        distinct = int(flat.max()) + 1 if flat.size else 0  # block ids are dense
        self.infinite = self._rate(flat.size - distinct)  # every access but a block's first
        self.runs, self.weights, self.starts = _runs(pages, flat)
        self._next = _next_access(self.runs)
        self._cache: dict[int, Bounds] = {}

    def _rate(self, blocks: int) -> float:
        return blocks * self.page_size / self.prompt_tokens

    def at(self, capacity_tokens: int) -> Bounds:
        """The bounds for ``capacity_tokens`` (device + host + storage tokens; computed once per capacity)."""
        if capacity_tokens not in self._cache:
            c = capacity_tokens // self.page_size
            lru = lru_hits(self.runs, self.weights, self.starts, c)
            belady = belady_hits(self.runs, self.weights, self._next, c)
            lru_snapshots = None if self.rule is None else \
                self._rate(snapshot_hits(self._pages, self.rule, self.page_size, c)[0])
            self._cache[capacity_tokens] = Bounds(capacity_tokens, self.infinite, self._rate(lru), self._rate(belady),
                                                  self._infinite_snapshots, lru_snapshots)
        return self._cache[capacity_tokens]


def _runs(pages: Sequence[np.ndarray], flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The accesses in runs: (run id per access, its length in blocks, each request's first access)."""
    lengths = np.array([len(p) for p in pages], dtype=np.int64)
    offsets = np.append(0, np.cumsum(lengths))  # request r's accesses: flat[offsets[r]:offsets[r + 1]]
    first = np.zeros(flat.size, dtype=bool)
    first[offsets[:-1][lengths > 0]] = True  # every request starts a run
    if flat.size:
        count = np.bincount(flat)[flat]
        first[1:] |= count[1:] != count[:-1]
    heads = np.flatnonzero(first)
    weights = np.diff(np.append(heads, flat.size))
    _, runs = np.unique(flat[heads], return_inverse=True)
    per_request = np.bincount(np.searchsorted(offsets, heads, side="right") - 1, minlength=len(pages))
    starts = np.append(0, np.cumsum(per_request))
    return runs.astype(np.int64), weights, starts


def _next_access(flat: np.ndarray) -> np.ndarray:
    """For each access, the index of the next access to the same item (``len(flat)``: none)."""
    order = np.argsort(flat, kind="stable")
    nxt = np.full(flat.size, flat.size, dtype=np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def lru_hits(runs: np.ndarray, weights: np.ndarray, starts: np.ndarray, capacity: int) -> int:
    """Blocks hit by the ideal prefix-block LRU of ``capacity`` blocks (module docstring);
    ``runs[starts[r]:starts[r + 1]]`` are request r's runs."""
    if capacity <= 0:
        return 0
    cached: OrderedDict[int, int] = OrderedDict()  # run -> its leading blocks cached; oldest first
    hits = size = 0
    run_list, weight_list, bounds = runs.tolist(), weights.tolist(), starts.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        for i in range(lo, hi):  # the leading run of blocks
            have = cached.get(run_list[i], 0)
            hits += have
            if have < weight_list[i]:
                break
        for i in range(hi - 1, lo - 1, -1):  # deepest first: the shallowest block is the most recent
            size += weight_list[i] - cached.get(run_list[i], 0)
            cached[run_list[i]] = weight_list[i]
            cached.move_to_end(run_list[i])
        while size > capacity:  # the oldest run loses its deepest blocks first
            run, have = next(iter(cached.items()))
            drop = min(have, size - capacity)
            size -= drop
            if drop == have:
                del cached[run]
            else:
                cached[run] = have - drop
    return hits


def belady_hits(runs: np.ndarray, weights: np.ndarray, nxt: np.ndarray, capacity: int) -> int:
    """Blocks found cached at their access under MIN with bypass, a cache of ``capacity``
    blocks (``nxt``: `_next_access` of ``runs``)."""
    if capacity <= 0 or not runs.size:
        return 0
    cached = [0] * (int(runs.max()) + 1)  # leading blocks of each run cached
    due = [-1] * len(cached)  # a cached run's next access
    heap: list[tuple[int, int]] = []  # (-next access, run); stale entries skipped when met
    size = hits = 0
    for k, w, n in zip(runs.tolist(), weights.tolist(), nxt.tolist()):
        hits += cached[k]
        need = w - cached[k]
        take = min(need, capacity - size)
        cached[k] += take
        size += take
        need -= take
        if cached[k]:
            due[k] = n
            heapq.heappush(heap, (-n, k))
        while need:
            while due[heap[0][1]] != -heap[0][0]:  # stale: touched or dropped since
                heapq.heappop(heap)
            far = heap[0][1]
            if due[far] <= n:  # the incoming blocks are needed last: bypass them
                break
            drop = min(need, cached[far])  # the furthest run's deepest blocks
            cached[far] -= drop
            need -= drop
            if not cached[far]:
                due[far] = -1
            if not cached[k]:
                due[k] = n
                heapq.heappush(heap, (-n, k))
            cached[k] += drop
    return hits


def snapshot_hits(pages: Sequence[np.ndarray], rule: SnapshotRule, page_size: int,
                  capacity: int | None) -> tuple[int, int]:
    """(blocks hit, snapshots saved) under the snapshot rule (module docstring) by the ideal
    prefix-block LRU of ``capacity`` blocks (``None``: an infinite cache); ``pages``: `block_ids`."""
    order: OrderedDict[int, None] = OrderedDict()  # cached blocks, the least recent first
    saved: set[int] = set()  # blocks a snapshot ends at
    hits = taken = 0
    for ids in pages:
        keys = ids.tolist()
        run = next((i for i, k in enumerate(keys) if k not in order), len(keys))
        while run and keys[run - 1] not in saved:  # back to the deepest saved boundary
            run -= 1
        hits += run
        bounds = rule.boundaries(run * page_size, len(keys) * page_size)
        taken += len(bounds)
        saved.update(keys[b // page_size - 1] for b in bounds)
        for k in reversed(keys):  # deepest first: the shallowest block is the most recent
            order[k] = None
            order.move_to_end(k)
        while capacity is not None and len(order) > capacity:
            saved.discard(order.popitem(last=False)[0])  # a snapshot leaves with its page
    return hits, taken
