"""`ReleaseRecord`: whether a client's releases prove right, judged by what comes back.

A release names a prefix (its last node); it was wrong if that prefix is used again:

    the released node is still cached, and hit            a hit on it (its mark clears)
    it was evicted, and a later insert brings it back     a node made after it holds its
                                                          last page at the same position
                                                          (a fingerprint: end, page bytes)

Only the named prefix's last page is judged: a release also marks the unshared nodes
above it, and a system prompt among them that another session brings back later does
not make the release wrong. The record covers the last `TRUST_WINDOW` releases (and as
many fingerprints); releases are honoured while at most `MAX_WRONG` of them came back.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import Iterable

from hicache.radix.hints.ticket import HintTicket
from hicache.radix.node import TreeNode

TRUST_WINDOW = 64  # the releases a client's record is judged on
MAX_WRONG = 0.25  # of them, the most that may have come back for releases to be honoured


class ReleaseRecord:
    """The last releases and which came back (scheduler thread).

    Args:
        page_bytes: key bytes of one page.
    """

    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.window: deque[HintTicket] = deque(maxlen=TRUST_WINDOW)
        self.returned: set[HintTicket] = set()
        self._ends: list[int] = []  # fingerprints' end positions, sorted (duplicates allowed)
        self._prints: list[tuple[int, bytes, int, HintTicket]] = []  # (end, last page, node id, ticket), same order

    def trusted(self) -> bool:
        """Releases are honoured: at most `MAX_WRONG` of the last ones came back."""
        return len(self.returned) <= MAX_WRONG * len(self.window)

    def released(self, ticket: HintTicket, node: TreeNode) -> None:
        """``ticket`` released the prefix ending at ``node``: judge it from now on."""
        if len(self.window) == self.window.maxlen:
            old = self.window[0]
            self.returned.discard(old)
            i = next((i for i, p in enumerate(self._prints) if p[3] is old), None)
            if i is not None:
                del self._ends[i], self._prints[i]
        self.window.append(ticket)
        pb = self.page_bytes
        entry = (node.end, node.key[-pb:], node.id, ticket)
        i = bisect.bisect_right(self._ends, node.end)
        self._ends.insert(i, node.end)
        self._prints.insert(i, entry)

    def came_back(self, ticket: HintTicket) -> bool:
        """The prefix ``ticket`` released was used again; whether that is news."""
        if ticket not in self.window or ticket in self.returned:
            return False
        self.returned.add(ticket)
        i = next((i for i, p in enumerate(self._prints) if p[3] is ticket), None)
        if i is not None:
            del self._ends[i], self._prints[i]
        return True

    def judge(self, nodes: Iterable[TreeNode]) -> list[HintTicket]:
        """Releases that ``nodes`` (candidates of an eviction) bring back: a node made after
        a released one that holds its last page at its position. Returns their tickets."""
        if not self._ends:
            return []
        out, pb, ends = [], self.page_bytes, self._ends
        for n in nodes:
            start = n.end - n.num_tokens
            lo, hi = bisect.bisect_right(ends, start), bisect.bisect_right(ends, n.end)
            for end, page, made, ticket in self._prints[lo:hi]:
                if n.id > made and n.key[(end - start) * 8 - pb:(end - start) * 8] == page:
                    out.append(ticket)
        return out
