"""`check_tree`: every invariant of a `HiRadixCache`, checked from scratch.

    structure   each child is filed under its first page; lengths are whole pages; ``end``
                adds up; slots are contiguous int64 CPU tensors; lock counts never exceed
                the parent's; no dead node is reachable; cached page hashes are one per page
    tiers       each node has history on some tier; device history implies the parent's;
                a snapshot on a tier implies the history there; under write-through
                policies host history implies the parent's (backed-up nodes are a prefix)
    slots       per pool and tier: free + cached + locked + in flight = total, no slot is
                held twice (history and snapshots: no snapshot row is two nodes'), and
                every held slot is allocated in its allocator (an op of a rolled-back
                batch whose failed ack is not polled yet holds nothing; in flight on the
                host: prefetches' slots and freed pages a storage write reads)
    candidates  every evictable leaf and snapshot is in the set eviction draws from
    held        the per-page counts insert looks up equal what nodes and loads in flight
                hold: device anchor pages, and each state root's device pages
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from hicache.radix.read import child_nodes


def _fail(msg: str) -> None:
    raise RuntimeError(f"check_integrity: {msg}")


def tree_nodes(tree) -> list:
    """Every node of ``tree`` but the root (depth first)."""
    out, stack = [], child_nodes(tree.root)
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(child_nodes(node))
    return out


def _check_filing(tree, node) -> None:
    """``node.children`` as `hicache.radix.read` files them: under each child's first token
    (its key's first 8 bytes), or a dict of two or more children sharing it, keyed by
    their first page."""
    pb = tree.page_size * 8
    for tok, there in node.children.items():
        group = there.items() if type(there) is dict else [(None, there)]
        if type(there) is dict and (pb == 8 or len(there) < 2):
            _fail(f"{node!r}: a dict of {len(there)} children under one first token (page of {pb // 8})")
        for page, child in group:
            if child.key[:8] != tok or (page is not None and child.key[:pb] != page) or child.parent is not node:
                _fail(f"{child!r} is filed under another first token or page, or below another parent than {node!r}")


def _check_structure(tree, node) -> None:
    ps, parent = tree.page_size, node.parent
    if node.dead:  # found through its parent's children, filed as `_check_filing` checks
        _fail(f"{node!r} is dead but still filed in its parent")
    if node.num_tokens == 0 or node.num_tokens % ps or node.end != parent.end + node.num_tokens:
        _fail(f"{node!r}: length not whole pages of {ps} or end != parent.end + length ({parent.end})")
    for tier in tree._ledger.tiers:
        slots = tier.slots(node)
        if slots is not None and slots.numel() != node.num_tokens:
            _fail(f"{node!r}: {tier.name} has {slots.numel()} slots for {node.num_tokens} tokens")
        if slots is not None and (slots.dtype != torch.int64 or not slots.is_contiguous() or slots.is_cuda):
            _fail(f"{node!r}: {tier.name} slots are not a contiguous int64 CPU tensor (the compiled read path reads them)")
    if node.lock_ref < 0 or (not parent.is_root and parent.lock_ref < node.lock_ref):
        _fail(f"{node!r}: lock_ref {node.lock_ref} negative or above the parent's {parent.lock_ref}")
    if node.pending is not None and node.pending not in tree._transfers.pending:
        _fail(f"{node!r}: pending op {node.pending} unknown to the tree")
    if node.hashes is not None and len(node.hashes) * ps != node.num_tokens:
        _fail(f"{node!r}: {len(node.hashes)} page hashes for {node.num_tokens} tokens")


def _check_tiers(tree, node) -> None:
    parent = node.parent
    if node._device is None and node._host is None:
        _fail(f"{node!r} holds its history on no tier")
    if node._device is not None and parent._device is None:
        _fail(f"{node!r} is on the device but its parent {parent!r} is not")
    if (node._state_device and node._device is None) or (node._state_host and node._host is None):
        _fail(f"{node!r}: a snapshot on a tier without the history there")
    for snap in (node._state_device, node._state_host):
        if snap and {k: v.numel() for k, v in snap.items()} != tree.state_sizes:
            _fail(f"{node!r}: snapshot sizes {[(k, v.numel()) for k, v in snap.items()]} != {tree.state_sizes}")
    if tree.policy != "write_back" and node._host is not None and parent._host is None:
        _fail(f"{node!r} is backed up but its parent {parent!r} is not ({tree.policy})")


def _check_candidates(tree, node) -> None:
    for tier in tree._ledger.tiers:
        if tier.is_leaf(node) and node not in tier.leaves:
            _fail(f"{tier.name} leaf {node!r} missing from the {tier.name} eviction candidates")
        if tier.snapshot(node) and node not in tier.states:
            _fail(f"{node!r}: {tier.name} snapshot missing from its candidate set")


def _held_slots(tree, nodes) -> dict:
    """(tier, pool) -> {"cached": [...], "locked": [...], "in_flight": [...]} slot tensors."""
    held = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        kind = "cached" if node.evictable else "locked"
        for tier in tree._ledger.tiers:
            slots = tier.slots(node)
            if slots is not None:
                held[(tier.name, tree.anchor)][kind].append(slots)
            for name, s in (tier.snapshot(node) or {}).items():
                held[(tier.name, name)][kind].append(s)
    rolled_back = tree.ctrl.rolled_back_ops()  # their destination slots are free again
    for op, rec in tree._transfers.pending.items():
        if op in rolled_back:  # the controller already freed its destination slots
            continue
        tier = "host" if rec.kind == "backup" else "device"
        for name, s in rec.dst.items():
            held[(tier, name)]["in_flight"].append(s)
    if tree._storage is not None:  # prefetches' host slots, and freed pages a write still reads
        for name, s in tree._storage.prefetches.in_flight_slots():
            held[("host", name)]["in_flight"].append(s)
        for name, s in tree.storage.deferred_slots().items():
            held[("host", name)]["in_flight"].append(s)
    return held


def _check_slots(tree, nodes) -> None:
    held = _held_slots(tree, nodes)
    for name in [tree.anchor, *tree.state_sizes]:
        for tier in tree._ledger.tiers:
            pool, parts = tier.pools[name], held[(tier.name, name)]
            counts = {k: sum(int(s.numel()) for s in v) for k, v in parts.items()}
            free, total = pool.available(), pool.num_tokens
            if free + sum(counts.values()) != total:
                _fail(f"{tier.name} {name}: {free=} + {counts} != {total=}")
            everything = [s for v in parts.values() for s in v]
            if not everything:
                continue
            _check_unique_owned(f"{tier.name} {name}", torch.cat(everything), pool.allocator)


def _check_unique_owned(what: str, flat: torch.Tensor, allocator) -> None:
    """Held slots are whole allocator pages, each page held once and allocated."""
    try:
        owned = allocator.is_owned(flat)  # validates: whole aligned pages, no page twice
    except ValueError as exc:
        _fail(f"{what}: held slots are not distinct whole pages ({exc})")
    if not owned:
        _fail(f"{what}: the tree holds slots its allocator calls free")


def _expect_counts(counts: np.ndarray, parts: list, page_size: int) -> np.ndarray:
    expect = np.zeros_like(counts)
    for slots in parts:
        np.add.at(expect, slots.numpy()[::page_size] // page_size, 1)
    return expect


def _check_held(tree, nodes) -> None:
    """The per-page held counts equal what nodes and loads in flight (rolled back too,
    until acked) hold: the device anchor's pages and each state root's."""
    ledger, loads = tree._ledger, [rec for rec in tree._transfers.pending.values() if rec.kind == "load"]
    parts = [n._device for n in nodes if n._device is not None]
    parts += [rec.dst[tree.anchor] for rec in loads if tree.anchor in rec.dst]
    _compare_held("device page", ledger.held, _expect_counts(ledger.held, parts, tree.page_size))
    for name, counts in ledger.state_held.items():
        parts = [n._state_device[name] for n in nodes if n._state_device is not None]
        parts += [rec.dst[name] for rec in loads if rec.with_state]
        ps = ledger.device.pools[name].allocator.page_size
        _compare_held(f"device {name} page", counts, _expect_counts(counts, parts, ps))


def _compare_held(what: str, counts: np.ndarray, expect: np.ndarray) -> None:
    wrong = np.flatnonzero(expect != counts)
    if wrong.size:
        p = int(wrong[0])
        _fail(f"{what} {p}: held count {int(counts[p])}, but nodes and loads hold it {int(expect[p])} times")


def check_tree(tree) -> None:
    """Raise RuntimeError naming the first broken invariant of ``tree``.

    Assumes the caller holds no device slots outside the tree and that every
    controller op on these pools was queued by the tree.
    """
    nodes = tree_nodes(tree)
    for node in (tree.root, *nodes):
        _check_filing(tree, node)
    for node in nodes:
        _check_structure(tree, node)
        _check_tiers(tree, node)
        _check_candidates(tree, node)
    for op, rec in tree._transfers.pending.items():
        if rec.node.dead:
            _fail(f"op {op} in flight on a deleted node {rec.node!r}")
    _check_slots(tree, nodes)
    _check_held(tree, nodes)
    tree.ctrl.check_integrity()
