"""One replay: requests through `HiRadixCache` + controller + real transfers, content checked.

Simulated server loop per request (requests finish at once; output tokens are only
counted, or, in the chat workload, part of the next turn's prompt):

    match_prefix -> (storage tier) prefetch the rest of the prompt into host slots, as the
      prefetch policy says, and match again -> lock the match end -> load_back the host
      part (start_loading, wait) -> check every device page of the prefix (and the
      snapshot) byte for byte -> allocate device slots for the rest (evict when short)
      -> fill their content -> insert (backups per policy; start_writing; poll) -> unlock

    prompt   |<- device hit ->|<- host hit ->|<- storage hit ->|<- recomputed ->|
             0                          first match end      loaded end      prompt end

With a storage tier the store's writes finish between requests (`Replayer.serve`): a
server computes while its I/O threads write, but the replay's requests take no time, so
without it the writes would queue up behind each other, pages dropped by the host would
still be on their way, and the hit rates would move with the machine's load. Lookups see
writes still running in any case (`hicache.radix.store`).

Hybrid stacks: the "prefill" also saves state snapshots where `hicache.replay.snapshots`
says: the prompt end, and inside the computed part every ``--hicache-state-interval``
tokens (recurrent state) or the last 512-token block boundary (DeepSeek-V4), where the
next request of a Mooncake session (whose hash_ids re-block the previous prompt) branches off.

A request's client hints (`hicache.replay.hintplay`) go to the tree before its match
(``when: before``) and after its insert (``after``), each time followed by a scheduler
step (launch, poll); the hints' clock is the request's timestamp.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from hicache.radix import HiRadixCache
from hicache.radix.node import EMPTY_SLOTS
from hicache.radix.prefetch import PrefetchOutcome
from hicache.replay.content import ContentModel, ReplayMismatch, prefix_hashes, state_seed
from hicache.replay.hintplay import HintPlayer
from hicache.replay.snapshots import SnapshotRule
from hicache.replay.stats import RunStats, collect_transfers, host_bytes_used, tier_tokens
from hicache.replay.timing import RunTiming
from hicache.replay.workload import Request, request_tokens

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


class Replayer:
    """Replays requests against one built cache.

    Args:
        cache: a `hicache.HiCache`.
        hicache_ratio: the label of this run (0 = device-only baseline: no host tier).
        verify_hits: also check device-hit pages, not only loaded ones.
        storage: the storage tier (`TierStore`, closed with the tree by `close`), or ``None``.
        hints: ``--hints`` (`hicache.replay.hintplay`).
        timing: the run's time estimates and load gate (`RunTiming`), or ``None``: hits only,
            everything found loaded.
    """

    def __init__(self, cache, hicache_ratio: float, verify_hits: bool = True,
                 storage: TierStore | None = None, hints: str = "on", timing: RunTiming | None = None) -> None:
        self.cache, self.ctrl, self.stack = cache, cache.controller, cache.stack
        self.now = 0.0  # the hints' clock: the request's timestamp, in seconds
        self.timing = timing
        self.tree = HiRadixCache(cache, host_tier=hicache_ratio > 0, storage=storage, clock=lambda: self.now,
                                 load_gate=timing.gate if timing is not None else None)
        self.hint_mode = hints
        self.content = ContentModel(cache)
        self.page = self.stack.page_size
        self.anchor = self.stack.anchor.name
        self.stats = RunStats(hicache_ratio, host_dtype=cache.config.host_dtype,
                              host_capacity_bytes=cache.host_group.nbytes,
                              eviction_policy=cache.config.eviction_policy,
                              capacity_tokens=self._capacity_tokens(hicache_ratio > 0, storage is not None),
                              hints=hints)
        self.verify_hits = verify_hits
        self.rule = SnapshotRule.of(self.stack, cache.config)
        if self.rule is not None:
            self.stats.state_interval = self.rule.interval
            self.stats.snapshot_bytes = sum(self.stack.snapshot_bytes().values())
        self._instrument()

    def _capacity_tokens(self, host_tier: bool, storage: bool) -> int:
        """Anchor tokens the run's tiers hold: the bounds' capacity (`tier_tokens`)."""
        host = self.cache.host_group.pools[self.anchor].allocator
        tokens = self.cache.device_pools[self.anchor].num_tokens
        if not host_tier or host is None:
            return tokens
        return tier_tokens(tokens, host.num_slots, self.cache.host_group.nbytes,
                           self.cache.config.storage_capacity_bytes if storage else None)

    def _instrument(self) -> None:
        """Time the launches to completion (CPU mode copies synchronously inside them; on
        CUDA the device is synchronized after each launch: a measuring tool, not a server)."""
        device = next(iter(self.cache.device_pools.values())).device
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

        def timed(fn, field):
            def run():
                t0 = time.perf_counter()
                out = fn()
                sync()
                setattr(self.stats, field, getattr(self.stats, field) + time.perf_counter() - t0)
                return out
            return run
        self.ctrl.start_writing = timed(self.ctrl.start_writing, "seconds_d2h")
        self.ctrl.start_loading = timed(self.ctrl.start_loading, "seconds_h2d")
        poll = self.ctrl.poll

        def watched_poll():  # the first failed ack's error, for the report (counts: _collect_transfers)
            acks = poll()
            if not self.stats.transfer_error:
                self.stats.transfer_error = next((a.error or "failed" for a in acks if not a.success), "")
            return acks
        self.ctrl.poll = watched_poll

    def run(self, requests: list[Request], progress=None, check_every: int = 250) -> RunStats:
        """Serve every request in order; raises `ReplayMismatch` on the first bad byte."""
        t0 = time.perf_counter()
        self.hints = HintPlayer(self.tree, self.hint_mode, requests, self._step)
        for i, req in enumerate(requests):
            self.serve(i, req)
            if check_every and (i + 1) % check_every == 0:
                self.tree.check_integrity()
            if progress is not None:
                progress(i + 1)
        self.tree.wait()
        self.tree.drain_storage()
        self.tree.check_integrity()
        collect_transfers(self.stats, self.ctrl.stats(), self.tree.storage, self.stack)
        self.stats.hints_sent, self.stats.hint_states = len(self.hints.tickets), self.hints.states()
        self.stats.collect_policy(self.tree.stats()["policy"])
        if self.timing is not None:
            for key, value in self.timing.summary().items():
                setattr(self.stats, key, value)
        self.stats.wall_s = time.perf_counter() - t0
        return self.stats

    def close(self) -> None:
        """Finish and close the storage tier (the cache is the caller's)."""
        self.tree.close()

    def serve(self, i: int, req: Request) -> None:
        st, tree = self.stats, self.tree
        st.requests += 1
        st.tokens_total += req.input_length
        tokens = request_tokens(req, self.page)
        hashes = prefix_hashes(tokens, self.page) if tokens.size else []
        self.now = req.timestamp / 1000
        self.hints.send(req, tokens, "before")
        if self.timing is not None:
            self.timing.arrive(req)
        m, first_end, host_end, found_end = self._match(tokens)
        lock = m.last_host_node
        tree.inc_lock_ref(lock)
        try:
            prefix = self._prefix(i, tokens, hashes, m, tree.load_target(tokens, m), first_end)
            self._compute(tokens, hashes, prefix)
        finally:
            tree.dec_lock_ref(lock)
        tree.poll()
        if tree.storage is not None:  # the writes finish while a server would compute (module docstring)
            tree.drain_storage(writes_only=True)  # a hint's prefetch keeps running
        self.hints.send(req, tokens, "after")
        st.tokens_recomputed += req.input_length - prefix.numel()
        st.peak_host_bytes = max(st.peak_host_bytes, host_bytes_used(self.cache))
        if self.timing is not None:
            self.timing.record(req, m.device_hit_length, host_end, found_end, prefix.numel(), tree)

    def _match(self, tokens) -> tuple:
        """The match after any storage prefetch (`HiRadixCache.match_and_prefetch`'s steps),
        the first match's end (tokens loaded past it came from storage), where the tree's
        coverage ended (past it: storage) and where what could be loaded ends: what the
        prefetch read, or what it found where the load gate declined to read it."""
        tree = self.tree
        m = tree.match_prefix(tokens)
        first_end = host_end = m.last_host_node.end
        p = tree.prefetch(tokens)
        if p is None:
            return m, first_end, host_end, first_end
        got = tree.wait_prefetch(p)
        m = tree.match_prefix(tokens)
        cut = got.outcome in (PrefetchOutcome.RECOMPUTE, PrefetchOutcome.COMPLETE)
        loadable = got.found_tokens if cut else got.read_tokens
        return m, first_end, p.start, max(m.last_host_node.end, p.start + loadable)

    # ---- the cached prefix ---------------------------------------------------------
    def _prefix(self, i: int, tokens, hashes: list[int], m, target, first_end: int) -> torch.Tensor:
        """Device slots of the usable prefix after loading back to ``target`` (`load_target`);
        checks its content. Tokens loaded past ``first_end`` (the match before the prefetch)
        count as storage hits."""
        st, tree = self.stats, self.tree
        st.device_hit_tokens += m.device_hit_length
        if self.verify_hits:
            self._check(i, m.device_slots, hashes, 0, m.last_device_node, "device hit")
        if target is m.last_device_node or tree.load_back(target) is None:
            return m.device_slots
        self.ctrl.start_loading()
        tree.wait()
        again = tree.match_prefix(tokens)
        if again.last_device_node is not target:  # the load failed: recompute
            return m.device_slots
        start, end = m.device_hit_length, again.device_hit_length
        self._check(i, again.device_slots[start:], hashes, start, again.last_device_node, "loaded")
        st.host_hit_tokens += min(end, first_end) - start
        st.storage_hit_tokens += max(0, end - max(first_end, start))
        return again.device_slots

    def _check(self, i: int, slots: torch.Tensor, hashes: list[int], start: int, node, what: str) -> None:
        ps = self.page
        first, last = start // ps, (start + slots.numel()) // ps
        st = self.stats
        try:
            st.bytes_checked += self.content.verify(self.anchor, slots, hashes[first:last],
                                                    f"request {i}: {what} tokens [{start}, {last * ps})")
            if node.state_device and last:
                for root, s in node.state_device.items():
                    st.bytes_checked += self.content.verify(root, s, [state_seed(hashes[last - 1])],
                                                            f"request {i}: {what} snapshot at {last * ps}")
        except ReplayMismatch:
            st.mismatches += 1
            raise

    # ---- computing the rest --------------------------------------------------------
    def _alloc(self, pool: str, n: int, evict) -> torch.Tensor | None:
        dev = self.cache.device_pools[pool]
        slots = dev.alloc(n)
        if slots is None:
            evict(n - dev.available())
            slots = dev.alloc(n)
        return slots

    def _compute(self, tokens, hashes: list[int], prefix: torch.Tensor) -> None:
        """Allocate, fill and insert the pages past ``prefix`` (and snapshots if hybrid)."""
        start = prefix.numel()
        new = self._alloc(self.anchor, tokens.size - start, self.tree.evict) if tokens.size > start else EMPTY_SLOTS
        if new is None:
            self.stats.uncached_requests += 1
            return
        self.content.fill(self.anchor, new, hashes[start // self.page:])
        slots = torch.cat([prefix, new]) if start else new
        snaps = self._snapshots(tokens.size, start, hashes)
        for end in sorted(b for b in snaps if b < tokens.size):
            node = self.tree.insert(tokens[:end], slots[:end], extra=snaps.pop(end)).last_node
            if node.end != end or node.device is None:  # stopped at a load in flight
                self._free(slots[end:], snaps)
                return
            # insert took ownership of slots[:end]: continue with the tree's own slots
            slots = torch.cat([self.tree.device_slots(node), slots[end:]])
        self.tree.insert(tokens, slots, extra=snaps.get(tokens.size))
        self.ctrl.start_writing()

    def _free(self, slots: torch.Tensor, snaps: dict[int, dict]) -> None:
        if slots.numel():
            self.cache.device_pools[self.anchor].free(slots)
        for snap in snaps.values():
            for root, s in snap.items():
                self.cache.device_pools[root].free(s)

    def _snapshots(self, end: int, start: int, hashes: list[int]) -> dict[int, dict]:
        """State snapshots at the boundaries of (start, end] the snapshot rule names."""
        if self.rule is None:
            return {}
        snaps = {}
        for b in self.rule.boundaries(start, end):
            snap = {}
            for root, size in self.tree.state_sizes.items():
                s = self._alloc(root, size, self.tree.evict_states)
                if s is None:
                    break
                self.content.fill(root, s, [state_seed(hashes[b // self.page - 1])])
                snap[root] = s
            if len(snap) == len(self.tree.state_sizes):
                snaps[b] = snap
                self.stats.snapshots += 1
            else:
                for root, s in snap.items():
                    self.cache.device_pools[root].free(s)
        return snaps

    # ---- accounting ----------------------------------------------------------------
    def _step(self) -> None:
        """A scheduler step: launch what is queued, poll."""
        self.ctrl.start_writing()
        self.ctrl.start_loading()
        self.tree.poll()
