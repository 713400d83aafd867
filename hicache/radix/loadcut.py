"""`LoadCut`: the tree's side of the load-or-recompute gate (``--hicache-load-policy cost``).

The gate (`hicache.cost.LoadGate`) weighs a match's tiers; this part hands it the tree's
facts and turns its answer back into the tree's terms, at the two places a load starts:

    where                     the tree knows                            the answer
    load (host -> device)     the match: device end, host end, and      the node to load back
                              (hybrid) the snapshot boundaries between  to (`node`)
    prefetch (storage ->      the walk's device end and match end, the  how many of the found
    host), after its lookup   pages found past the tree and (hybrid)    pages to read (`pages`);
                              the stored snapshot boundaries            0: recompute them

    prompt  |<- device ->|<-- host -->|<--- storage (found) --->|
            0          device_end   start                    start + found pages

A cut falls on a page; on a hybrid stack only where a snapshot is (a node's end with a
snapshot on either tier, or a stored snapshot boundary), so a cut never strands history
without the state to resume from. Without a gate (``always``) nothing is cut.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from hicache.radix.hybrid import select_match_end
from hicache.radix.node import MatchResult, TreeNode


class LoadCut:
    """Where a match's load is cut (module docstring).

    Args:
        gate: a `hicache.cost.LoadGate` (its ``end``).
        hybrid: cuts only at snapshot boundaries.
    Holds no state of its own (scheduler thread).
    """

    def __init__(self, gate: Any, hybrid: bool) -> None:
        self.gate, self.hybrid = gate, hybrid

    def node(self, m: MatchResult, prompt: int, split_at: Callable[[int], TreeNode]) -> TreeNode:
        """The node whose chain to load back: ``m.last_host_node`` when loading it all pays,
        ``m.last_device_node`` when nothing past the device does, else the node ending at the
        cut (``split_at(end)``: the tree's match of the prompt's first ``end`` tokens, which
        splits a node there on a non-hybrid stack)."""
        last, dev = m.last_host_node, m.last_device_node
        if last is dev:
            return last
        ends: dict[int, TreeNode] = {}
        if self.hybrid:  # the snapshot boundaries between the device end and the match end
            node = last
            while node is not dev:
                if node._state_device or node._state_host:
                    ends[node.end] = node
                node = node.parent
        end = self.gate.end(prompt, dev.end, last.end, None, list(ends) if self.hybrid else None)
        if end >= last.end:
            return last
        if end <= dev.end:
            return dev
        return ends[end] if self.hybrid else split_at(end)

    def walk_ends(self, path: Sequence[TreeNode], partial: tuple[TreeNode, int] | None) -> tuple[int, tuple[int, ...]]:
        """A prefetch's walk: the tree's device end, and (hybrid) the snapshot boundaries past
        it up to the match end, where a cut may fall in the tree."""
        d, e = select_match_end(path, self.hybrid)
        device = path[d].end if d >= 0 else 0
        if self.hybrid:
            return device, tuple(n.end for n in path[d + 1:e + 1] if n._state_device or n._state_host)
        if partial is not None and d == len(path) - 1 and partial[0]._device is not None:
            device += partial[1]
        return device, ()

    def pages(self, prompt: int, device_end: int, tree_cuts: Sequence[int], start: int, found: int, page: int,
              bounds: Sequence[int] = ()) -> int:
        """Of the ``found`` pages past ``start`` (the tree's coverage), how many to read: those
        up to the cut (hybrid: ``tree_cuts`` from `walk_ends` and ``bounds``, pages from
        ``start`` with a stored snapshot)."""
        cuts = [*tree_cuts, *(start + b * page for b in bounds if b <= found)] if self.hybrid else None
        end = self.gate.end(prompt, device_end, start, start + found * page, cuts)
        return max(0, (end - start) // page)
