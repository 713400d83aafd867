"""`HostBlockIndex`: the scheduler-side index of host chunks, keyed by vLLM's offload key.

One key names one chunk of one KV cache group (vLLM packs block hash + group index into
the key bytes). Each group has its own chunk-id space, a ``host_pools.PageAllocator`` of
``num_chunks`` ids, because the worker keeps one host pool per group. States of a key::

             prepare_store               complete_store(ok)
    (absent) ------------> STORING -------------------------> READY  <--+
        ^                     |  complete_store(failed)         |       | complete_load
        +---------------------+  (id freed)                     |       | (last one)
        ^                                        prepare_load   v       |
        +---- evicted (policy's order, by prepare_store) -- READY,idle  LOADING(n)

Only READY keys with no pending load sit in the per-group eviction order and can be
evicted; a STORING or LOADING key never is. The order is ``--hicache-eviction-policy``'s
(`hicache.integrations.vllm.order`: LRU by default). ``demote`` moves keys to the evicting
end of their order (a sliding-window chunk no returning prefix needs any more). Groups may
differ in capacity (a sliding-window group keeps fewer chunks than a full-attention one).

``reset`` frees idle READY chunks at once, but a chunk whose store or load is still in
flight goes to quarantine, out of reach of ``prepare_store``, until ``release_reset``:
a worker may still write (or read) it, and handing it to a new key first would let the
late copy land in, or read from, the new key's bytes. Each reset starts a new ``epoch``;
entries carry the one they were made in, and a completion given an older epoch (the
job in flight at the reset reporting late) is ignored rather than applied to the key's
new entry. Not thread-safe: vLLM calls it
from the scheduler thread only. No vLLM import: the manager adapter translates types.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Collection, Hashable, NamedTuple, Sequence

from hicache.integrations.vllm.order import orders
from host_pools.allocator import PageAllocator


class Lookup(enum.Enum):
    """Where a key stands for a reader."""

    MISS = "miss"
    HIT = "hit"  # stored and readable
    PENDING = "pending"  # its store has not completed yet


@dataclass(slots=True)
class _Entry:
    group: int
    chunk: int
    ready: bool = False  # False while its store is in flight
    loads: int = 0  # pending loads; > 0 pins the chunk
    demoted: bool = False  # joins the LRU at its evicting end when published
    epoch: int = 0  # the reset epoch it was made in


class StorePlan(NamedTuple):
    """What ``prepare_store`` decided: keys to copy, their chunk ids (same order), evictions,
    and the reset epoch to complete them with."""

    keys: list[Hashable]
    chunks: list[int]
    evicted: list[Hashable]
    epoch: int = 0


class HostBlockIndex:
    """Index of host chunks per KV cache group, evicting in a policy's order.

    Args:
        num_chunks: chunk ids per group (the host capacity), >= 1: one count for every
            group, or one per group.
        num_groups: KV cache groups, >= 1.
        group_of: maps a key to its group index in ``[0, num_groups)``.
        eviction_policy: ``--hicache-eviction-policy`` (`hicache.integrations.vllm.order`).
    Raises:
        ValueError: a count below 1, ``num_chunks`` of another length than ``num_groups``,
            or an unknown policy.
    """

    def __init__(self, num_chunks: int | Sequence[int], num_groups: int,
                 group_of: Callable[[Hashable], int], eviction_policy: str = "lru") -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups: must be >= 1, got {num_groups}")
        counts = [num_chunks] * num_groups if isinstance(num_chunks, int) else list(num_chunks)
        if len(counts) != num_groups or min(counts) < 1:
            raise ValueError(f"num_chunks: must be >= 1 for each of {num_groups} group(s), "
                             f"got {num_chunks}")
        self.chunks_per_group, self.num_groups, self._group_of = counts, num_groups, group_of
        self._alloc = [PageAllocator(n) for n in counts]
        self._order = orders(eviction_policy, counts)
        self._entries: dict[Hashable, _Entry] = {}
        self._quarantine: list[list[int]] = [[] for _ in range(num_groups)]
        self.epoch = 0  # resets so far; a completion of an older one is ignored
        # the keys of a group no eviction may take (client retains: hints.py), set by the manager
        self.keep: Callable[[int], Collection[Hashable]] = lambda group: ()
        self.counters = {"stored": 0, "store_failed": 0, "loaded": 0, "evicted": 0,
                         "store_refused": 0, "demoted": 0, "stale_completions": 0}

    @property
    def num_chunks(self) -> int:
        """Chunk ids of all groups together."""
        return sum(self.chunks_per_group)

    def __len__(self) -> int:
        return len(self._entries)

    def group(self, key: Hashable) -> int:
        g = self._group_of(key)
        if not 0 <= g < self.num_groups:
            raise ValueError(f"key: group {g} outside [0, {self.num_groups})")
        return g

    def lookup(self, key: Hashable) -> Lookup:
        """MISS, HIT or PENDING for one key (no state change)."""
        entry = self._entries.get(key)
        if entry is None:
            return Lookup.MISS
        return Lookup.HIT if entry.ready else Lookup.PENDING

    def prepare_load(self, keys: Collection[Hashable]) -> list[int]:
        """Pin ``keys`` against eviction until ``complete_load``; returns their chunk ids.

        Raises:
            ValueError: a key is absent or not READY (nothing was pinned).
        """
        entries = [self._entries.get(k) for k in keys]
        for key, entry in zip(keys, entries):
            if entry is None or not entry.ready:
                raise ValueError(f"keys: {key!r} is {'absent' if entry is None else 'still storing'}"
                                 "; only HIT keys can be loaded")
        for key, entry in zip(keys, entries):
            if entry.loads == 0:
                self._order[entry.group].discard(key)
            entry.loads += 1
        self.counters["loaded"] += len(entries)
        return [e.chunk for e in entries]

    def complete_load(self, keys: Collection[Hashable], epoch: int | None = None) -> None:
        """Unpin keys of an earlier ``prepare_load``; the last unpin makes a key evictable again.

        Args:
            epoch: ``epoch`` when the load was prepared; keys made since a later reset are
                left alone (``None``: the keys' current entries).

        Raises:
            ValueError: a key has no pending load (nothing was changed).
        """
        keys = self._current(keys, epoch)
        entries = [self._entries.get(k) for k in keys]
        if any(e is None or e.loads < 1 for e in entries):
            bad = next(k for k, e in zip(keys, entries) if e is None or e.loads < 1)
            raise ValueError(f"keys: {bad!r} has no pending load")
        for key, entry in zip(keys, entries):
            entry.loads -= 1
            if entry.loads == 0:
                self._order[entry.group].add(key)

    def touch(self, keys: Collection[Hashable]) -> None:
        """A request carries ``keys`` (its chain, root first): each held key is most recently
        used and counts one request more; a key evicted before counts it in its ghost (the
        policy's: `hicache.integrations.vllm.order`); a key never held is ignored."""
        if self.num_groups == 1:
            self._order[0].touch(keys)
            return
        per_group: list[list[Hashable]] = [[] for _ in range(self.num_groups)]
        for key in keys:
            per_group[self.group(key)].append(key)
        for order, chain in zip(self._order, per_group):
            if chain:
                order.touch(chain)

    def prepare_store(self, keys: Collection[Hashable]) -> StorePlan | None:
        """Give chunk ids to the absent ``keys``, evicting idle LRU keys when short.

        Keys already present (READY or STORING) are skipped. All or nothing: ``None``
        (the capacity shortfall vLLM expects, no exception) when a group cannot free
        enough idle chunks; then nothing changed. Keys of this call, and those ``keep``
        names (retained by a client), are never evicted.
        """
        new = list(dict.fromkeys(k for k in keys if k not in self._entries))
        per_group = [0] * self.num_groups
        for key in new:
            per_group[self.group(key)] += 1
        protected = set(keys)
        victims: list[list[Hashable]] = []
        for g, need in enumerate(per_group):
            short = need - self._alloc[g].available()
            pick = self._order[g].victims(short, _Either(protected, self.keep(g))) if short > 0 else []
            if len(pick) < short:
                self.counters["store_refused"] += 1
                return None
            victims.append(pick)
        evicted = [k for pick in victims for k in pick]
        for key in evicted:
            self._order[self._entries[key].group].evicted(key)
            self._drop(key)
        chunks = []
        for key in new:
            g = self.group(key)
            chunk = int(self._alloc[g].alloc(1)[0])
            self._entries[key] = _Entry(g, chunk, epoch=self.epoch)
            self._order[g].stored(key)
            chunks.append(chunk)
        self.counters["evicted"] += len(evicted)
        return StorePlan(new, chunks, evicted, self.epoch)

    def complete_store(self, keys: Collection[Hashable], success: bool = True,
                       epoch: int | None = None) -> list[Hashable]:
        """Publish (``success``) or drop the STORING keys among ``keys``; returns the published.

        Keys that are absent or already READY are ignored (vLLM may repeat a completion), so
        are keys made since a reset later than ``epoch`` (the plan's; ``None``: any entry).
        """
        done = []
        for key in self._current(keys, epoch):
            entry = self._entries.get(key)
            if entry is None or entry.ready:
                continue
            if success:
                entry.ready = True
                self._order[entry.group].add(key, demoted=entry.demoted)
                done.append(key)
            else:
                self._drop(key)
                self.counters["store_failed"] += 1
        self.counters["stored"] += len(done)
        return done

    def _current(self, keys: Collection[Hashable], epoch: int | None) -> list[Hashable]:
        """``keys`` whose entry is of ``epoch`` (all of them for ``None``); the rest counted stale."""
        keys = list(keys)
        if epoch is None:
            return keys
        out = [k for k in keys if k not in self._entries or self._entries[k].epoch <= epoch]
        self.counters["stale_completions"] += len(keys) - len(out)
        return out

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key)
        self._order[entry.group].forget(key)
        self._alloc[entry.group].free(_ids([entry.chunk]))

    def demote(self, keys: Collection[Hashable]) -> int:
        """Make ``keys`` the next to be evicted in their group (a STORING key when it is
        published; a LOADING one stays pinned). Unknown keys are ignored; returns the
        number of keys demoted."""
        count = 0
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                continue
            entry.demoted = True
            self._order[entry.group].demote(key)
            count += 1
        self.counters["demoted"] += count
        return count

    def reset(self) -> None:
        """Forget every key. Idle READY chunks are free at once; chunks with a store or
        load in flight are quarantined until :meth:`release_reset`; a new epoch begins."""
        self.epoch += 1
        for key, entry in list(self._entries.items()):
            if entry.ready and entry.loads == 0:
                self._drop(key)
                continue
            del self._entries[key]
            self._order[entry.group].forget(key)
            self._quarantine[entry.group].append(entry.chunk)

    def quarantined(self, group: int) -> int:
        """Chunk ids of ``group`` waiting for the transfers in flight at a reset to end."""
        return len(self._quarantine[group])

    def release_reset(self) -> int:
        """Free the chunks :meth:`reset` quarantined (every transfer in flight at the reset
        has ended); returns how many."""
        count = 0
        for g, chunks in enumerate(self._quarantine):
            if chunks:
                self._alloc[g].free(_ids(chunks))
                count += len(chunks)
                chunks.clear()
        return count

    def used(self, group: int) -> int:
        """Chunk ids of ``group`` not free: held by a key (any state) or quarantined."""
        return self.chunks_per_group[group] - self._alloc[group].available()

    def check_integrity(self) -> None:
        """``RuntimeError`` on any broken invariant (free + used = total, order = idle READY keys)."""
        for g in range(self.num_groups):
            self._alloc[g].check_integrity()
            held = [e.chunk for e in self._entries.values() if e.group == g] + self._quarantine[g]
            if len(held) != self.used(g) or len(set(held)) != len(held):
                raise RuntimeError(f"group {g}: keys and quarantine hold {len(held)} chunks "
                                   f"({len(set(held))} distinct), allocator says {self.used(g)} used")
            idle = {k for k, e in self._entries.items() if e.group == g and e.ready and e.loads == 0}
            order = self._order[g].keys()
            if idle != order:
                raise RuntimeError(f"group {g}: the eviction order has {len(order)} keys, {len(idle)} idle READY keys")


class _Either:
    """Membership in either of two collections, without building their union."""

    __slots__ = ("a", "b")

    def __init__(self, a: Collection[Hashable], b: Collection[Hashable]) -> None:
        self.a, self.b = a, b

    def __contains__(self, key: Hashable) -> bool:
        return key in self.a or key in self.b


def _ids(chunks: list[int]):
    """Chunk ids as the int64 tensor ``PageAllocator.free`` takes."""
    import torch
    return torch.tensor(chunks, dtype=torch.int64)
