"""Matching in `HiRadixCache`: the walk along a key, node splits and the LRU clock.

A match walks whole pages from the root; a node matched only in part is split (non-hybrid
stacks) so that the match ends on a node boundary. Where a hybrid (DeepSeek-V4) match may
end: `hicache.radix.hybrid`.
"""
from __future__ import annotations

from typing import Any

import torch

from hicache import fastpath
from hicache.radix.hybrid import select_match_end
from hicache.radix.node import EMPTY_SLOTS, MatchResult, TreeNode, as_key, common_pages


class MatchMixin:
    """`match_prefix` of `HiRadixCache` and the walk, touch and split it is made of."""

    def match_prefix(self, token_ids: Any) -> MatchResult:
        """Longest usable cached prefix of ``token_ids`` (a partial last page is ignored).

        Non-hybrid stacks may split a node so the match ends on a node boundary. Touches
        the matched nodes (LRU). Hybrid rule: `hicache.radix.hybrid`. The walk is kept
        for an `insert` of the same tokens (or more) that follows before the tree's shape
        changes: that insert continues from it instead of walking again.

        Returns:
            `MatchResult` (device slots and last device node; host hit length and last
            host node, which equals the last device node when nothing is on host only).
        Raises:
            ValueError: ``token_ids`` not 1-D.
        """
        kb = as_key(token_ids, self.page_size, strict=False).tobytes()
        path, partial = self._walk_bytes(kb)
        if partial is not None and not self.hybrid:
            path.append(self._split(*partial))
        if self.hybrid:
            d, e = select_match_end(path, True)
            self._touch(path[:e + 1])
        else:  # every boundary qualifies; device nodes are closed under parent
            self._clock += 1
            clock, d, e = self._clock, -1, len(path) - 1
            for node in path:  # touched (LRU) and counted in one pass
                node.last_access = clock
                if node.device is not None:
                    d += 1
        if d > 0:
            slots = torch.cat([n.device for n in path[:d + 1]])
        else:
            slots = path[0].device if d == 0 else EMPTY_SLOTS
        self._last_walk = (kb, path, self._epoch, slots)
        last_dev = path[d] if d >= 0 else self.root
        last_host = path[e] if e >= 0 else self.root
        return MatchResult(slots, last_dev, last_host.end - last_dev.end, last_host)

    def _walk(self, key) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
        """`_walk_bytes` of an int64 key array."""
        return self._walk_bytes(key.tobytes())

    def _walk_bytes(self, kb: bytes, node: TreeNode | None = None
                    ) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
        """Fully matched nodes below ``node`` (default: the root), and the node matched only
        partly with its matched tokens. ``kb`` is the whole key's bytes from the root."""
        node = self.root if node is None else node
        path, child = fastpath.walk(node, kb, self._page_bytes)
        return path, self._partly(kb, path[-1] if path else node, child)

    def _partly(self, kb: bytes, above: TreeNode, child: TreeNode | None) -> tuple[TreeNode, int] | None:
        """``child`` (below ``above``, matching ``kb`` only in part) with its matched tokens."""
        if child is None:
            return None
        off = above.end << 3
        return child, common_pages(child.key, kb[off:off + len(child.key)], self.page_size)

    def _walk_from_match(self, kb: bytes) -> tuple[list[TreeNode], tuple[TreeNode, int] | None,
                                                   torch.Tensor | None]:
        """The walk of ``kb`` and the device slots of the last `match_prefix`, continuing
        that match's walk when ``kb`` extends its key and the tree did not change since
        (``_epoch``: no split, no deletion, no copy dropped or published); else a new walk
        and ``None``."""
        last = self._last_walk
        if last is None or last[2] != self._epoch or not kb.startswith(last[0]):
            return (*self._walk_bytes(kb), None)
        path = last[1]
        start = path[-1] if path else self.root
        more, child = fastpath.walk(start, kb, self._page_bytes)
        path = path + more if more else path
        return path, self._partly(kb, path[-1] if path else start, child), last[3]

    def _touch(self, nodes) -> None:
        self._clock += 1
        clock = self._clock
        for n in nodes:
            n.last_access = clock

    def _split(self, node: TreeNode, num_tokens: int) -> TreeNode:
        """Cut ``node`` after ``num_tokens`` (whole pages); returns the new upper half.

        The upper half takes the prefix slices of both tiers (and of the page hashes) and
        copies lock, hits, access time, any transfer in flight and whether it is stored;
        the snapshot stays with the lower half (it belongs to the end boundary, which does
        not move).
        """
        self._epoch += 1
        parent, cut = node.parent, num_tokens << 3
        upper = TreeNode(key=node.key[:cut], end=node.end - node.num_tokens + num_tokens,
                         parent=parent, lock_ref=node.lock_ref, hit_count=node.hit_count,
                         last_access=node.last_access, pending=node.pending)
        if node.device is not None:
            upper.device, node.device = node.device[:num_tokens], node.device[num_tokens:]
        if node.host is not None:
            upper.host, node.host = node.host[:num_tokens], node.host[num_tokens:]
        if node.hashes is not None:
            pages = num_tokens // self.page_size
            upper.hashes, node.hashes = node.hashes[:pages], node.hashes[pages:]
        upper.stored = node.stored
        pb = self._page_bytes
        parent.children[upper.key[:pb]] = upper
        node.key = node.key[cut:]
        node.parent = upper
        upper.children[node.key[:pb]] = node
        return upper
