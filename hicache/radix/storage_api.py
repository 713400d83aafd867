"""`StorageAPI`: the storage tier's public calls of `HiRadixCache` (prefetch, drain, close).

Each forwards to the tree's `hicache.radix.storage.StorageSide` (``self._storage``, or
``None`` without a tier) and polls through the tree's `poll`; nothing else of the tree
is touched here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hicache.radix.node import MatchResult, TreeNode, as_key
from hicache.radix.prefetch import Prefetch, PrefetchOutcome, PrefetchResult

if TYPE_CHECKING:
    from hicache.radix.storage import StorageSide
    from hicache.radix.store import TierStore


class StorageAPI:
    """Prefetches and the storage tier's life of `HiRadixCache` (base class: what it uses
    is the tree's ``_storage``, ``host_enabled``, ``policy``, ``page_size``, ``poll`` and
    ``_attach_storage``)."""

    _storage: StorageSide | None

    @property
    def storage(self) -> TierStore | None:
        """The storage tier (`TierStore`), or ``None``."""
        return None if self._storage is None else self._storage.store

    def prefetch(self, token_ids: Any) -> Prefetch | None:
        """Start reading the part of ``token_ids`` past the tree from storage into host slots.

        Locks the node where the tree's coverage of the prompt ends until the prefetch is
        done. Under the write-through policies it starts only where that node is on the
        host (backed-up nodes stay a prefix from the root). Mutates the tree; not
        thread-safe; the I/O runs on the store's threads. The prompt is copied.

        Returns:
            A `Prefetch` to poll (`poll` advances it; ``done`` then ``result``), or ``None``:
            no storage tier or host tier, or nothing past the tree (hybrid: and no
            boundary of the prompt's history in the tree without a snapshot).
        Raises:
            TypeError / ValueError: token ids that are not a 1-D integer sequence within int64.
        """
        key = as_key(token_ids, self.page_size, strict=False)
        if self._storage is None or not self.host_enabled:
            return None
        return self._storage.prefetches.start(key, self._may_prefetch)

    def match_and_prefetch(self, token_ids: Any) -> tuple[MatchResult, int]:
        """`match_prefix`; with a storage tier, then `prefetch` of the rest, `wait_prefetch`
        and a second match (a tool's and a test's helper: a server polls between steps).

        Returns:
            (the match, the end of the first match's host part: tokens loaded past it came
            from storage). Mutates the tree as `match_prefix` and `prefetch` do.
        """
        m = self.match_prefix(token_ids)
        first_end = m.last_host_node.end
        p = self.prefetch(token_ids)
        if p is not None:  # lands as host-only nodes; the match picks them up
            self.wait_prefetch(p)
            m = self.match_prefix(token_ids)
        return m, first_end

    def _may_prefetch(self, node: TreeNode) -> bool:
        return node._host is not None or self.policy == "write_back"

    def stop_prefetch(self, p: Prefetch) -> None:
        """Ask ``p`` to stop: it keeps what is read so far and is ``done`` within one I/O chunk."""
        if self._storage is not None:
            self._storage.prefetches.stop(p, PrefetchOutcome.STOPPED)

    def wait_prefetch(self, p: Prefetch, poll_s: float = 0.0005) -> PrefetchResult:
        """Poll until ``p`` is done, as the policy says (a tool's and a test's helper; a
        server polls between steps instead). ``best_effort`` takes what is there now."""
        if p.done:
            return p.result
        return self._storage.wait_prefetch(p, self.poll, poll_s)

    def drain_storage(self, timeout_s: float = 60.0) -> None:
        """Poll until no store job is left (writes included); prefetches stop first.

        Raises:
            RuntimeError: the store did not finish within ``timeout_s``.
        """
        if self._storage is not None:
            self._storage.drain(self.poll, timeout_s)

    def close(self) -> None:
        """Finish the storage tier's work and close it (idempotent); the tree keeps its
        device and host tiers. Call at shutdown, before ``cache.close()``."""
        if self._storage is not None:
            self.drain_storage()
            self._storage.store.close()
            self._attach_storage(None)
