"""Matching in `HiRadixCache`: the walk along a key, node splits and the LRU clock.

A match walks whole pages from the root; a node matched only in part is split (non-hybrid
stacks) so that the match ends on a node boundary. Where a hybrid (DeepSeek-V4) match may
end: `hicache.radix.hybrid`.
"""
from __future__ import annotations

from typing import Any

import torch

from hicache.radix.hybrid import select_match_end
from hicache.radix.node import EMPTY_SLOTS, MatchResult, TreeNode, as_key, common_pages, page_key


class MatchMixin:
    """`match_prefix` of `HiRadixCache` and the walk, touch and split it is made of."""

    def match_prefix(self, token_ids: Any) -> MatchResult:
        """Longest usable cached prefix of ``token_ids`` (a partial last page is ignored).

        Non-hybrid stacks may split a node so the match ends on a node boundary. Touches
        the matched nodes (LRU). Hybrid rule: `hicache.radix.hybrid`.

        Returns:
            `MatchResult` (device slots and last device node; host hit length and last
            host node, which equals the last device node when nothing is on host only).
        Raises:
            ValueError: ``token_ids`` not 1-D.
        """
        key = as_key(token_ids, self.page_size, strict=False)
        path, partial = self._walk(key)
        if partial is not None and not self.hybrid:
            path.append(self._split(*partial))
        d, e = select_match_end(path, self.hybrid)
        self._touch(path[:e + 1])
        dev = path[:d + 1]
        slots = torch.cat([n.device for n in dev]) if len(dev) > 1 else (dev[0].device if dev else EMPTY_SLOTS)
        last_dev = dev[-1] if dev else self.root
        last_host = path[e] if e >= 0 else self.root
        return MatchResult(slots, last_dev, last_host.end - last_dev.end, last_host)

    def _walk(self, key) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
        """Fully matched nodes, and the node matched only partly with its matched tokens."""
        node, off, path, ps = self.root, 0, [], self.page_size
        while off < key.size:
            child = node.children.get(page_key(key, off, ps))
            if child is None:
                break
            n = common_pages(child.tokens, key[off:], ps)
            if n < child.num_tokens:
                return path, (child, n)
            path.append(child)
            off += n
            node = child
        return path, None

    def _touch(self, nodes) -> None:
        self._clock += 1
        for n in nodes:
            n.last_access = self._clock

    def _split(self, node: TreeNode, num_tokens: int) -> TreeNode:
        """Cut ``node`` after ``num_tokens`` (whole pages); returns the new upper half.

        The upper half takes the prefix slices of both tiers (and of the page hashes) and
        copies lock, hits, access time, any transfer in flight and whether it is stored;
        the snapshot stays with the lower half (it belongs to the end boundary, which does
        not move).
        """
        parent = node.parent
        upper = TreeNode(tokens=node.tokens[:num_tokens], end=node.end - node.num_tokens + num_tokens,
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
        parent.children[page_key(upper.tokens, 0, self.page_size)] = upper
        node.tokens = node.tokens[num_tokens:]
        node.parent = upper
        upper.children[page_key(node.tokens, 0, self.page_size)] = node
        return upper
