"""`Evictor`: one eviction for every tier of `HiRadixCache` (`hicache.radix.tiers`), in
the order of its policy (`hicache.radix.policies`: ``--hicache-eviction-policy``).

Candidates are kept per tier in sets that may hold stale entries; every transition that
can make a node a leaf adds it (a node gaining its tier without children there, a child
losing it), and each eviction filters the set, so no pass walks the whole tree:

    device leaf  history on device, no child with history on device
    host leaf    history on host only, no children at all

    evict(n) / evict_host(n) on a leaf of the tier (the policy's first, unlocked, no transfer
    in flight):
        the tier below holds the history       -> drop this tier's copy (history and snapshot)
        it does not, tier writes back          -> back it up below first, then drop the copy;
                                                  a failed backup deletes the node's subtree
        it does not, otherwise                 -> delete the node's subtree
    device: below = host (`Transfers`), writes back under ``write_back`` (a synchronous backup);
    host: below = storage (`StorageSide`, writes back under its ``write_back``) or nothing.

What lies below a tier is a `Below`: the evictor asks it three things and nothing else.
Client hints (`hicache.radix.hints`) reach eviction through one filter, where a tier's
victims are chosen (`Hinted.victims`): released leaves first, retained ones last, and a
retained leaf only ever goes down a tier (saved below first, never deleted).
Snapshots are evicted on their own too (``evict_states``), in the same order: the
history chain stays. The policy hears of every copy dropped and every node deleted.
"""
from __future__ import annotations

import heapq
from collections import Counter
from typing import Protocol

from hicache.radix.index import RadixIndex
from hicache.radix.node import TreeNode
from hicache.radix.read import child_nodes
from hicache.radix.policies import LRU, EvictionPolicy, Victims
from hicache.radix.tiers import SlotLedger, Tier


class Below(Protocol):
    """What lies below a tier, as eviction sees it."""

    @property
    def writes_back(self) -> bool:
        """Whether a leaf is saved below before this tier drops it."""

    def holds(self, node: TreeNode) -> bool:
        """Whether the tier below already holds ``node``'s history (and snapshot)."""

    def save(self, nodes: list[TreeNode], asked: frozenset = frozenset()) -> None:
        """Save ``nodes`` (history and snapshot) below; may poll. ``asked``: the retained
        among them, saved whatever a storage admission says."""

    def save_snapshots(self, nodes: list[TreeNode]) -> None:
        """Save the snapshots of ``nodes`` below before they are dropped here."""


class Hinted(Protocol):
    """What eviction asks of the client hints (`hicache.radix.hints.HintBook`)."""

    def victims(self, policy: EvictionPolicy, tier: str, nodes: list[TreeNode]) -> tuple[Victims, frozenset]:
        """The candidates in the order they go, and the retained (protected) ones among them."""

    def kept(self, tier: str) -> frozenset:
        """The nodes ``tier`` protects."""

    def went_down(self, tier: str, node: TreeNode) -> None:
        """A protected ``node`` gave up its copy on ``tier`` to a running request."""


class NoHints:
    """No client hints: the policy's candidates as they are."""

    def victims(self, policy: EvictionPolicy, tier: str, nodes: list[TreeNode]) -> tuple[Victims, frozenset]:
        return policy.victims(tier, nodes), frozenset()

    def kept(self, tier: str) -> frozenset:
        return frozenset()

    def went_down(self, tier: str, node: TreeNode) -> None:
        return None


class NothingBelow:
    """The host tier without a storage tier: nothing is saved, a host leaf is deleted."""

    writes_back = False

    def holds(self, node: TreeNode) -> bool:
        return False

    def save(self, nodes: list[TreeNode], asked: frozenset = frozenset()) -> None:
        return None

    def save_snapshots(self, nodes: list[TreeNode]) -> None:
        return None


class Evictor:
    """Eviction of history and snapshots on each tier, in ``policy``'s order (scheduler thread).

    Args:
        index: the node structure (deletions).
        ledger: the tiers and their slots.
        counters: the tree's counters (``*_evicted_tokens``, ``nodes_deleted``, ``states_evicted``).
        policy: the eviction order (default LRU).
    Attributes:
        below: what lies below each tier, keyed by tier name (set by the tree).
        hints: the client hints' filter (set by the tree; default none).
    """

    def __init__(self, index: RadixIndex, ledger: SlotLedger, counters: Counter,
                 policy: EvictionPolicy | None = None) -> None:
        self.index, self.ledger, self.counters = index, ledger, counters
        self.policy = LRU() if policy is None else policy
        self.below: dict[str, Below] = {"device": NothingBelow(), "host": NothingBelow()}
        self.hints: Hinted = NoHints()

    def evict(self, tier: Tier, num_tokens: int) -> int:
        """Free at least ``num_tokens`` anchor slots of ``tier`` if the unlocked tree allows
        (module docstring). Returns the slots freed (whole pages; may exceed the ask or
        fall short)."""
        freed = 0
        while freed < num_tokens:
            victims, kept = self._victims(tier)
            if not victims:
                break
            gained, staged = self._evict_round(tier, victims, kept, num_tokens - freed)
            freed += gained
            if staged:
                back = self._write_back(tier, staged, kept)
                freed += back
                if back == 0 and kept.issuperset(staged):  # retained, and nothing below takes them
                    break
            elif gained == 0:
                break
        self.counters[f"{tier.name}_evicted_tokens"] += freed
        return freed

    def _evict_round(self, tier: Tier, victims: Victims, kept: frozenset,
                     need: int) -> tuple[int, list[TreeNode]]:
        freed, staged, staged_tokens = 0, [], 0
        below = self.below[tier.name]
        write_back = below.writes_back
        while victims and freed + staged_tokens < need:
            node = victims.pop()
            if (write_back or node in kept) and not below.holds(node):  # retained: saved below first
                staged.append(node)
                staged_tokens += node.num_tokens
                continue
            freed += self._drop(tier, node, kept)
            parent = node.parent
            if tier.is_leaf(parent) and parent.evictable:
                victims.push(parent)
        return freed, staged

    def _victims(self, tier: Tier) -> tuple[Victims, frozenset]:
        keep = {n for n in tier.leaves if tier.is_leaf(n)}
        tier.leaves = keep
        return self.hints.victims(self.policy, tier.name, [n for n in keep if n.evictable])

    def _write_back(self, tier: Tier, nodes: list[TreeNode], kept: frozenset = frozenset()) -> int:
        """Back ``nodes`` up to the tier below, then drop their copies here (or the nodes)."""
        self.below[tier.name].save(nodes, kept)
        return sum(self._drop(tier, n, kept) for n in nodes if not n.dead and tier.is_leaf(n) and n.evictable)

    def _drop(self, tier: Tier, node: TreeNode, kept: frozenset = frozenset()) -> int:
        """Give back ``tier``'s copy of a leaf; delete the node if no other tier holds its
        history. A retained (``kept``) node only goes down: 0 when nothing below holds it."""
        tokens = node.num_tokens
        others = [t for t in self.ledger.tiers if t is not tier and getattr(node, t.attr) is not None]
        if node in kept:
            if not others and not self.below[tier.name].holds(node):
                return 0
            self.hints.went_down(tier.name, node)
        if not others:
            self.policy.deleted(tier.name, self.delete_subtree(node))
        else:
            self.policy.dropped(tier.name, node)
            self.ledger.drop_copy(tier, node, others)
        return tokens

    def delete_subtree(self, node: TreeNode) -> list[TreeNode]:
        """Remove ``node`` and everything below it, giving back every tier they hold.
        Returns the nodes removed, ``node`` first."""
        gone, stack = [], [node]
        while stack:
            cur = stack.pop()
            stack.extend(child_nodes(cur))
            self.ledger.release(cur)
            cur.dead = True
            gone.append(cur)
        parent = node.parent
        self.index.detach(node)
        for tier in self.ledger.tiers:
            tier.leaves.add(parent)
        self.counters["nodes_deleted"] += 1
        return gone

    # ---- snapshots on their own, and room -------------------------------------------------
    def evict_snapshots(self, tier: Tier, num_slots: int) -> int:
        """Snapshots of ``tier`` go in the policy's order (never of a node in use) until
        ``num_slots`` of the first state root are free; the tier below saves them first if
        it writes back. Returns the slots freed there."""
        per = next(iter(self.ledger.state_sizes.values()))
        entry = self.policy.entry
        name = tier.name
        kept = self.hints.kept(name)  # a retained prefix keeps its snapshot
        heap = heapq.nsmallest(-(-num_slots // per), (entry(name, n) for n in tier.states
                                                      if n.evictable and n not in kept))
        victims = [e[-1] for e in heap]
        below = self.below[tier.name]
        if below.writes_back:
            below.save_snapshots(victims)
        for node in victims:
            self.ledger.free_snapshot(tier, node)
        self.counters["states_evicted"] += len(victims)
        return len(victims) * per

    def demote(self, node: TreeNode) -> int:
        """Drop ``node``'s device copy now (a client's demote): a device leaf not in use whose
        history the host holds. Returns the tokens freed (0 when it is not one)."""
        tier = self.ledger.device
        if node.dead or not node.evictable or not tier.is_leaf(node) or not self.below["device"].holds(node):
            return 0
        return self._drop(tier, node)

    def make_room(self, tier: Tier, anchor_tokens: int, with_state: bool) -> None:
        """Evict on ``tier`` until ``anchor_tokens`` (and, with state, one snapshot) fit."""
        short = anchor_tokens - tier.anchor.available()
        if short > 0:
            self.evict(tier, short)
        if with_state:
            for name, size in self.ledger.state_sizes.items():
                short = size - tier.pools[name].available()
                if short > 0:
                    self.evict_snapshots(tier, short)
