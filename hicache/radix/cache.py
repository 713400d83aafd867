"""`HiRadixCache`: a page-granular prefix tree whose nodes live on device, host or both.

Built on what `hicache.build` returns; the write policy and the sizes come from its
config and plan. One request's life through the tree (the replay tool does exactly this):

    m = tree.match_prefix(tokens)            device hit + host hit (MatchResult)
    p = tree.prefetch(tokens)                storage tier: the rest of the prompt into host
    ... tree.poll() until p.done (or          slots (None: no tier, nothing past the tree);
        tree.stop_prefetch(p)) ...            p.result says how much it got
    m = tree.match_prefix(tokens)            the landed pages are a host hit now
    tree.inc_lock_ref(m.last_host_node)      nothing on the path is evicted meanwhile
    tree.load_back(m.last_host_node)         if m.host_hit_length (or a snapshot) must move
    ctrl.start_loading(); tree.poll()        the ack publishes the device copies
    ... allocate device slots for the rest (tree.evict when short), compute them ...
    tree.insert(tokens, slots, extra=...)    takes ownership; queues backups per policy
    ctrl.start_writing(); tree.poll()        the acks publish the host copies
    tree.dec_lock_ref(m.last_host_node)
    tree.close()                             at shutdown: storage writes finish, store closes

Keys, matches, inserts and evictions are whole pages (``stack.page_size`` tokens); the
write policies: `hicache.radix.transfers`. The tree is assembled from parts that own
their state and talk through a few calls (composition; each part a module):

    part                    owns                                   module
    RadixIndex              root, walks, splits, LRU clock, epoch  hicache.radix.index
    SlotLedger              tiers, their slots, who holds a page   hicache.radix.tiers
    Evictor                 eviction per tier, room                hicache.radix.evict
    EvictionPolicy          which leaf goes first, its history     hicache.radix.policies
    Transfers               controller ops in flight, acks         hicache.radix.transfers
    Inserter                an insert's checks and plan            hicache.radix.insert
    StorageSide (optional)  store, prefetches, queued writes       hicache.radix.storage
                            -> changes the tree only through       hicache.radix.landing
                               StorageEdits, at poll
    Hints                   client hints; eviction's one filter    hicache.radix.hints
    LoadCut (optional)      where a load is cut (cost policy)      hicache.radix.loadcut

The storage tier's public calls (``prefetch``, ``stop_prefetch``, ``wait_prefetch``,
``drain_storage``, ``close``) are thin methods here that forward to the `StorageSide`.

``poll`` is where finished work changes the tree: the controller's acks (`Transfers`),
then the store's jobs (`StorageSide`). Anything that may poll (making room under
write-back) reads the tree again afterwards. No slot tensor this class hands out is one
the tree holds (copies, or a match's fresh concatenation): editing it in place never
changes the tree's slots (`hicache.radix.index` says what an edited match's slots mean
to the insert that follows).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from hicache.cost import live_gate
from hicache.radix.check import check_tree
from hicache.radix.evict import Evictor, NothingBelow
from hicache.radix.hints import HintTicket, build_hints
from hicache.radix.hybrid import snapshot_sizes
from hicache.radix.index import RadixIndex
from hicache.radix.insert import Inserter
from hicache.radix.landing import StorageEdits
from hicache.radix.loadcut import LoadCut
from hicache.radix.node import EMPTY_SLOTS, InsertResult, MatchResult, TreeNode, as_key, copy_slots, lock, unlock
from hicache.radix.policies import make_policy
from hicache.radix.policies.ghosts import tree_key
from hicache.radix.policies.requests import TokenChains
from hicache.radix.prefetch import Prefetch, PrefetchOutcome, PrefetchResult
from hicache.radix.storage import StorageSide
from hicache.radix.tiers import SlotLedger
from hicache.radix.transfers import Transfers

if TYPE_CHECKING:
    from hicache.radix.store import TierStore


class HiRadixCache:
    """Prefix tree over page-aligned token ids with device, host and storage tiers.

    Args:
        cache: a `hicache.HiCache` (``hicache.build(...)``); the tree owns its
            controller's acks (call ``tree.poll()``, never ``controller.poll()``).
        host_tier: use the host tier; default: when the host anchor pool has any room.
        storage: the storage tier below the host: a `TierStore` (the tree closes it in
            `close`), ``None`` for none, or ``"config"`` (default) to open what
            ``cache.config`` asks for (``--hicache-storage-*``; needs the host tier).
        clock: the client hints' clock in seconds (retain deadlines; default ``time.monotonic``;
            a replay passes its trace's time).
        load_gate: what cuts what `load_target` loads back and what a prefetch reads: a
            `hicache.cost.LoadGate`, None (load all found), or ``"config"`` (default): the
            gate ``cache.config`` asks for (``--hicache-load-policy cost`` on
            ``--hicache-device-profile``, the controller's and the store's queued bytes as
            backlog; `hicache.cost.live_gate`), none for a stack that is no preset with a shape.
    Raises:
        ValueError: a stack with an own-indexed pool other than the anchor that is not a
            STATE pool.
        StorageUnavailableError: ``"config"`` names a store that cannot be reached (the
            message names the flag; ``--hicache-storage-optional`` runs without it).

    Attributes:
        mutex: its controller's re-entrant lock (one for both): every public call runs
            whole under it. Hold it across calls that must see one state, e.g. ``with
            tree.mutex:`` a match and the ``inc_lock_ref`` of its node (another thread's
            eviction could come between them otherwise).
    Thread-safe: any number of threads may call it; each call is atomic. A node a caller
    holds between calls is protected by its lock ref only (as from one thread).
    """

    def __init__(self, cache: Any, *, host_tier: bool | None = None,
                 storage: TierStore | str | None = "config", clock: Callable[[], float] | None = None,
                 load_gate: Any = "config") -> None:
        self.cache, self.stack, self.ctrl = cache, cache.stack, cache.controller
        # ONE lock for the tree and its controller (no lock order to keep); the per-request
        # calls take it through its bound methods: half the instructions of a `with`
        self.mutex = self.ctrl.mutex
        self._enter, self._leave = self.mutex.acquire, self.mutex.release
        self.page_size = self.stack.page_size
        self.policy = cache.config.write_policy
        self.anchor = self.stack.anchor.name
        self.state_sizes = snapshot_sizes(self.stack)
        self.hybrid = bool(self.state_sizes)
        self.device_pool = cache.device_pools[self.anchor]
        self.host_pool = cache.host_group.pools[self.anchor]
        self.host_enabled = self.host_pool.num_tokens > 0 if host_tier is None else host_tier
        self.counters: Counter = Counter()
        self._index = RadixIndex(self.page_size)
        self._ledger = SlotLedger(cache, self._index, self.state_sizes)
        order = self._make_order(cache.config.eviction_policy)
        self._evictor = Evictor(self._index, self._ledger, self.counters, order)
        self._transfers = Transfers(self.ctrl, self._index, self._ledger, self.counters, policy=self.policy,
                                    host_enabled=self.host_enabled)
        self._transfers.make_room, self._transfers.poll = self._evictor.make_room, self.poll
        self._transfers.on_loaded = order.regained
        self._evictor.below["device"] = self._transfers
        self._insert = Inserter(self._index, self._ledger, self._transfers, cache.device_pools, self.counters, order)
        self._storage = None
        self._hints = build_hints(self, clock or time.monotonic, self._step)
        if storage == "config":  # the storage layer is imported only when a store is configured
            storage = None
            if self.host_enabled and cache.config.storage_backend != "none":
                from hicache.radix.store import open_store
                storage = open_store(cache)
        if load_gate == "config":
            load_gate = live_gate(cache.config, self.stack, self.ctrl, storage)
        self._cut = None if load_gate is None else LoadCut(load_gate, self.hybrid)
        self._attach_storage(storage)

    def _make_order(self, name: str):
        """The eviction policy, over the tokens the tiers hold together (a write-through
        host holds copies of the device's pages: the larger tier; write-back: both)."""
        device, host = self.device_pool.num_tokens, self.host_pool.num_tokens if self.host_enabled else 0
        distinct = device + host if self.policy == "write_back" else max(device, host)
        order = make_policy(name, {"device": device, "host": host}, lambda: self._index.clock,
                            distinct_tokens=distinct, ghost_key=tree_key(self.page_size),
                            chains=TokenChains(self.page_size))
        self._order = order
        self._heard = order.requested if order.hears_requests else None  # the policy hears each request
        return order

    def _attach_storage(self, store: TierStore | None) -> None:
        """Wire the storage tier in (or none): below the host for eviction, host frees
        through its pins, write-through writes after each backup's ack."""
        side = None
        if store is not None:
            edits = StorageEdits(self._index, self._ledger, self._evictor, self.ctrl, self.policy)
            side = StorageSide(store, edits, self.cache.host_group.pools, self.state_sizes, self.counters, self._cut)
        self._storage = side
        self._evictor.below["host"] = NothingBelow() if side is None else side
        self._ledger.route_host_frees(None if side is None else side.free_host)
        self._transfers.on_backed_up = None if side is None else side.queue_store
        if side is not None:
            side.on_written = self._hints.work.written

    @property
    def root(self) -> TreeNode:
        """The root node (empty key)."""
        return self._index.root

    @property
    def storage(self) -> TierStore | None:
        """The storage tier (`TierStore`), or ``None``."""
        return None if self._storage is None else self._storage.store

    # ---- match and insert ---------------------------------------------------------------
    def match_prefix(self, token_ids: Any) -> MatchResult:
        """Longest usable cached prefix of ``token_ids`` (a partial last page is ignored).

        Non-hybrid stacks may split a node so the match ends on a node boundary. Touches
        the matched nodes (their last access: what the eviction policies read). Hybrid rule: `hicache.radix.hybrid`. The walk is kept
        for an `insert` of the same tokens (or more) that follows before the tree's shape
        changes: that insert continues from it instead of walking again.

        Returns:
            `MatchResult` (the device slots, a tensor of the caller's, and the last device
            node; host hit length and last host node, which equals the last device node
            when nothing is on host only).
        Raises:
            TypeError: ids that are not integers.
            ValueError: ``token_ids`` not 1-D, or an id outside int64.
        """
        key = as_key(token_ids, self.page_size, strict=False)
        self._enter()
        try:
            if self._heard is not None:
                self._heard(key)
            path, d, e, slots = self._index.match(key, self.hybrid)  # slots: the caller's
            root = self._index.root
            last_dev = path[d] if d >= 0 else root
            last_host = path[e] if e >= 0 else root
            # tuple.__new__: the named tuple without its Python-level __new__ (every request's path)
            return tuple.__new__(MatchResult, (slots, last_dev, last_host.end - last_dev.end, last_host))
        finally:
            self._leave()

    def insert(self, token_ids: Any, device_slots: Any,
               extra: Mapping[str, torch.Tensor] | None = None) -> InsertResult:
        """Cache ``token_ids`` whose KV sits in ``device_slots``; takes ownership of the slots.

        Pages already cached on the device keep the tree's slots; the caller's slots for
        them are freed when they are provably duplicates (held by no node and no load in
        flight). Host-only pages are revived with the caller's slots. ``extra`` is the
        device snapshot at the end of ``token_ids`` (``{"swa": slots}``, hybrid stacks
        only; freed when the boundary already has one). Queues backups per write policy
        (launch with ``controller.start_writing()``). Mutates the tree; a CUDA slot tensor
        is copied to the host once. After a `match_prefix` of these tokens (or a prefix
        of them) the insert continues that match's walk.

        Returns:
            `InsertResult`: tokens already cached on the device, and the node ending at
            ``len(token_ids)``.
        Raises:
            TypeError: token ids or slots that are not integers.
            ValueError: tokens not whole pages or outside int64; ``device_slots`` not one
                per token, unaligned, out of range, repeated, not allocated, or slots the
                tree already holds for other tokens; ``extra`` naming other pools / sizes
                than the stack's snapshot, slots not allocated or not whole rows, or slots
                another node's snapshot or a load in flight holds. Nothing changes then.
        """
        self._enter()
        try:
            return self._insert.insert(token_ids, device_slots, extra)
        finally:
            self._leave()

    # ---- eviction ----------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device anchor slots if the unlocked tree allows, leaves
        in the order of ``config.eviction_policy`` (`hicache.radix.policies`).

        Backed-up nodes drop their device copy; others are backed up first under
        ``write_back`` (a synchronous backup, which polls) and deleted otherwise. Locked
        nodes and nodes with a transfer in flight are never touched. Mutates the tree.

        Returns:
            Device anchor slots freed (whole pages; may exceed ``num_tokens``, or fall
            short when everything left is locked).
        """
        with self.mutex:
            return self._evictor.evict(self._ledger.device, num_tokens)

    def evict_host(self, num_tokens: int) -> int:
        """Delete host-only leaves in the eviction policy's order until ``num_tokens`` are free
        (written to storage first under its ``write_back``).

        Never touches a locked node, one with a transfer in flight, or a node whose
        history is on the device. Mutates the tree.

        Returns:
            Host anchor slots freed (may fall short when nothing else is evictable).
        """
        with self.mutex:
            return self._evictor.evict(self._ledger.host, num_tokens)

    def evict_states(self, num_slots: int) -> int:
        """Drop device snapshots in the eviction policy's order until ``num_slots`` are free.

        The nodes keep their history (and any host snapshot). Locked or in-flight nodes
        are skipped. Mutates the tree.

        Returns:
            Slots freed in the first state root pool (``swa``).
        Raises:
            ValueError: the stack has no state pools.
        """
        with self.mutex:
            return self._evict_snapshots(self._ledger.device, num_slots)

    def evict_host_states(self, num_slots: int) -> int:
        """Free host snapshots (the policy's order, never of a node in use); the history chain stays.

        Returns:
            Host slots freed in the first state root pool.
        Raises:
            ValueError: the stack has no state pools.
        """
        with self.mutex:
            return self._evict_snapshots(self._ledger.host, num_slots)

    def _evict_snapshots(self, tier, num_slots: int) -> int:
        if not self.state_sizes:
            raise ValueError("evict_states: this stack has no state pools")
        return self._evictor.evict_snapshots(tier, num_slots)

    # ---- transfers ---------------------------------------------------------------------
    def load_target(self, token_ids: Any, m: MatchResult) -> TreeNode:
        """The node whose host chain to `load_back` for the match ``m`` of ``token_ids``.

        Without a load gate: ``m.last_host_node`` (everything found). With one
        (``--hicache-load-policy cost``): the deepest node up to which loading beats
        recomputing (`hicache.radix.loadcut`); ``m.last_device_node`` when nothing pays. On a
        non-hybrid stack a cut inside a node splits it (as `match_prefix` of the prompt's
        first tokens does); on a hybrid one a cut is a snapshot boundary. Mutates the tree
        only by that split; holds the tree's mutex.
        """
        if self._cut is None or m.last_host_node is m.last_device_node:
            return m.last_host_node
        with self.mutex:
            return self._cut.node(m, len(token_ids), lambda end: self.match_prefix(token_ids[:end]).last_host_node)

    def load_back(self, node: TreeNode) -> dict[str, torch.Tensor] | None:
        """Queue the load of ``node``'s host-only history chain (and its host snapshot).

        The chain is every host-only node from the deepest device ancestor down to
        ``node``, read after device room is made by evicting (which may poll; nodes on
        ``node``'s path are locked meanwhile). The device slots are published on the nodes
        when the ack arrives (`poll` after ``controller.start_loading()``); ``node`` stays
        locked until then. Mutates the tree.

        Returns:
            The caller's copy of the device slots keyed by pool name (the anchor key always
            present, empty when only the snapshot moves), or ``None`` when the device is
            short or part of the chain is already in flight (nothing changes then).
        Raises:
            ValueError: ``node`` is the root or no longer in the tree.
        """
        self._enter()
        try:
            return self._transfers.load_back(node)
        finally:
            self._leave()

    def poll(self) -> list:
        """Process every finished ack of the controller (never blocks).

        Acks of this tree's ops publish (or, failed, forget) their slots, each on its own:
        one that cannot be applied is logged, counted (``acks_broken``) and its slots
        given back, and the others are applied. Acks of ops the tree did not queue are
        returned untouched. With a storage tier, finished storage jobs are taken in too
        (writes marked, prefetches advanced, deadlines enforced) and the write-through
        writes of this poll submitted. Launching is the caller's:
        ``controller.start_writing()`` / ``start_loading()``. Mutates the tree.

        Returns:
            All acks, in order.
        """
        self._enter()
        try:
            acks = self.ctrl.poll()
            self._transfers.apply(acks)
            if self._storage is not None:
                self._storage.poll()
            self._hints.poll()
            return acks
        finally:
            self._leave()

    def _step(self) -> None:
        """One scheduler step for a hint's ``wait``: launch what is queued, then poll."""
        self.ctrl.start_writing()
        self.ctrl.start_loading()
        self.poll()

    def wait(self, ops=None) -> None:
        """Launch what ``ops`` need and poll until they are acked (default: every op of this tree).

        Launches queued writes if a backup is awaited and queued loads if a load is (the
        whole controller queue of that direction goes). Blocks until done (CUDA: polls).

        Raises:
            RuntimeError: an awaited op is neither queued nor in flight in the controller.
        """
        with self.mutex:
            self._transfers.wait(ops)

    def pending_ops(self) -> int:
        """Controller operations of this tree in flight."""
        with self.mutex:
            return len(self._transfers.pending)

    # ---- client hints (hicache.radix.hints) -----------------------------------------------
    def hint(self, token_ids: Any, action: str, *, ttl_s: float | None = None, priority: int | None = None,
             to: str | None = None) -> HintTicket:
        """A client's hint on the cached prefix of ``token_ids`` (`hicache.radix.hints`):
        ``retain`` (``ttl_s``, ``priority`` 0-100), ``demote``, ``prefetch`` (``to="device"``
        or ``"host"``), ``persist`` or ``release``. Mutates the tree (a node matched in part
        is split, but on a hybrid stack); copies it queues run at the next launches and
        finish at `poll`. Safe from any number of threads (under ``mutex``); the ticket's
        ``wait`` and ``cancel`` are the scheduler thread's (another thread holds ``mutex``).

        Returns:
            A `HintTicket`: ACCEPTED (a retain in force; the others DONE once their pages
            are in place), DONE at once (a release; a no-op: nothing of it cached) or
            REFUSED with a one-line reason (a bad argument, an action this tree cannot
            take, over a budget, too many this step), which changed nothing.
        Raises:
            TypeError / ValueError: token ids that are not a 1-D integer sequence within int64.
        """
        with self.mutex:
            return self._hints.hint(token_ids, action, ttl_s, priority, to)

    def hint_envelope(self, token_ids: Any, envelope: Any) -> list[HintTicket]:
        """The hints of one envelope (`hicache.radix.hints.envelope`) on the prompt
        ``token_ids``, a ticket each (malformed: one REFUSED ticket, nothing applied)."""
        with self.mutex:
            return self._hints.envelope(token_ids, envelope)

    def capabilities(self) -> dict:
        """The hint actions this tree takes (and why not the others) and its limits."""
        with self.mutex:
            return self._hints.capabilities()

    # ---- storage (forwarded to the StorageSide; nothing without a tier) -----------------
    def prefetch(self, token_ids: Any) -> Prefetch | None:
        """Start reading the part of ``token_ids`` past the tree from storage into host slots.

        Locks the node where the tree's coverage of the prompt ends until the prefetch is
        done. Under the write-through policies it starts only where that node is on the
        host (backed-up nodes stay a prefix from the root). Mutates the tree; the I/O
        runs on the store's threads. The prompt is copied.

        Returns:
            A `Prefetch` to poll (`poll` advances it; ``done`` then ``result``), or ``None``:
            no storage tier or host tier, or nothing past the tree (hybrid: and no
            boundary of the prompt's history in the tree without a snapshot).
        Raises:
            TypeError / ValueError: token ids that are not a 1-D integer sequence within int64.
        """
        with self.mutex:
            key = as_key(token_ids, self.page_size, strict=False)
            if self._storage is None or not self.host_enabled:
                return None
            return self._storage.prefetches.start(key, self._may_prefetch)

    def _may_prefetch(self, node: TreeNode) -> bool:
        return node._host is not None or self.policy == "write_back"

    def match_and_prefetch(self, token_ids: Any) -> tuple[MatchResult, int]:
        """`match_prefix`; with a storage tier, then `prefetch` of the rest, `wait_prefetch`
        and a second match (a tool's and a test's helper: a server polls between steps).

        Returns:
            (the match, the end of the first match's host part: tokens loaded past it came
            from storage). Mutates the tree as `match_prefix` and `prefetch` do.
        """
        with self.mutex:
            m = self.match_prefix(token_ids)
            first_end = m.last_host_node.end
            p = self.prefetch(token_ids)
            if p is not None:  # lands as host-only nodes; the match picks them up
                self.wait_prefetch(p)
                m = self.match_prefix(token_ids)
            return m, first_end

    def stop_prefetch(self, p: Prefetch) -> None:
        """Ask ``p`` to stop: it keeps what is read so far and is ``done`` within one I/O chunk."""
        with self.mutex:
            if self._storage is not None:
                self._storage.prefetches.stop(p, PrefetchOutcome.STOPPED)

    def wait_prefetch(self, p: Prefetch, poll_s: float = 0.0005) -> PrefetchResult:
        """Poll until ``p`` is done, as the policy says (a tool's and a test's helper; a
        server polls between steps instead). ``best_effort`` takes what is there now."""
        with self.mutex:
            if p.done:
                return p.result
            return self._storage.wait_prefetch(p, self.poll, poll_s)

    def drain_storage(self, timeout_s: float = 60.0, writes_only: bool = False) -> None:
        """Poll until no store job is left (writes included); prefetches stop first.
        ``writes_only``: wait for the storage writes alone, prefetches keep running.

        Raises:
            RuntimeError: the store did not finish within ``timeout_s``.
        """
        with self.mutex:
            if self._storage is not None:
                self._storage.drain(self.poll, timeout_s)

    def close(self) -> None:
        """Finish the storage tier's work and close it (idempotent); the tree keeps its
        device and host tiers. Call at shutdown, before ``cache.close()``."""
        with self.mutex:
            if self._storage is not None:
                self.drain_storage()
                self._storage.store.close()
                self._attach_storage(None)

    # ---- locks and views ---------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock ``node`` and its ancestors: no tier of them is evicted until unlocked."""
        self._enter()
        try:
            lock(node)
        finally:
            self._leave()

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref` of ``node``. Raises RuntimeError on an unlocked node."""
        self._enter()
        try:
            unlock(node)
        finally:
            self._leave()

    def device_slots(self, node: TreeNode) -> torch.Tensor:
        """The caller's copy of the device anchor slots of tokens ``[0, node.end)``.

        Raises:
            ValueError: part of the path is not on the device.
        """
        with self.mutex:
            parts = []
            while not node.is_root:
                if node._device is None:
                    raise ValueError(f"node: {node!r} has no device copy")
                parts.append(node._device)
                node = node.parent
            return torch.cat(parts[::-1]) if parts else EMPTY_SLOTS.clone()

    def snapshot_slots(self, node: TreeNode) -> tuple[dict | None, dict | None]:
        """Copies of the (device, host) snapshot slots of ``node``'s boundary, each keyed by pool or None."""
        with self.mutex:
            return copy_slots(node._state_device), copy_slots(node._state_host)

    def stats(self) -> dict:
        """Counters of the tree (backups, loads, evictions, prefetches...), the controller's,
        the eviction policy's (``policy``: the live score and why, ghosts, memory) and, with a
        storage tier, the store's (bytes, objects, faults, busy seconds)."""
        with self.mutex:
            out = {"tree": dict(self.counters), "controller": self.ctrl.stats(), "policy": self._order.stats()}
            if self._storage is not None:
                out["storage"] = self._storage.store.stats()
            return out

    def check_integrity(self) -> None:
        """Raise RuntimeError if an invariant is broken (see `hicache.radix.check`).

        Call when the caller holds no device slots outside the tree (between requests).
        """
        with self.mutex:
            check_tree(self)
