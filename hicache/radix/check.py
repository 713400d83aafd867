"""`check_tree`: every invariant of a `HiRadixCache`, checked from scratch.

    structure   each child is filed under its first page; lengths are whole pages; ``end``
                adds up; slots are contiguous int64 CPU tensors; lock counts never exceed
                the parent's; no dead node is reachable; cached page hashes are one per page
    tiers       each node has history on some tier; device history implies the parent's;
                a snapshot on a tier implies the history there; under write-through
                policies host history implies the parent's (backed-up nodes are a prefix)
    slots       per pool and tier: free + cached + locked + in flight = total, no slot is
                held twice, and every held slot is allocated in its allocator (an op of a
                rolled-back batch whose failed ack is not polled yet holds nothing; in
                flight on the host: prefetches' slots and freed pages a storage write reads)
    candidates  every evictable leaf and snapshot is in the set eviction draws from
    held        the per-page counts insert looks up (``_held``) equal the device anchor
                pages the nodes and the loads in flight hold
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


def _fail(msg: str) -> None:
    raise RuntimeError(f"check_integrity: {msg}")


def tree_nodes(tree) -> list:
    """Every node of ``tree`` but the root (depth first)."""
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _check_structure(tree, node) -> None:
    ps, parent = tree.page_size, node.parent
    if node.dead or parent.children.get(node.key[:ps * 8]) is not node:
        _fail(f"{node!r} is dead or not filed under its first page in its parent")
    if node.num_tokens == 0 or node.num_tokens % ps or node.end != parent.end + node.num_tokens:
        _fail(f"{node!r}: length not whole pages of {ps} or end != parent.end + length ({parent.end})")
    for tier in tree.tiers:
        slots = tier.slots(node)
        if slots is not None and slots.numel() != node.num_tokens:
            _fail(f"{node!r}: {tier.name} has {slots.numel()} slots for {node.num_tokens} tokens")
        if slots is not None and (slots.dtype != torch.int64 or not slots.is_contiguous() or slots.is_cuda):
            _fail(f"{node!r}: {tier.name} slots are not a contiguous int64 CPU tensor (the fast path reads their buffers)")
    if node.lock_ref < 0 or (not parent.is_root and parent.lock_ref < node.lock_ref):
        _fail(f"{node!r}: lock_ref {node.lock_ref} negative or above the parent's {parent.lock_ref}")
    if node.pending is not None and node.pending not in tree._pending:
        _fail(f"{node!r}: pending op {node.pending} unknown to the tree")
    if node.hashes is not None and len(node.hashes) * ps != node.num_tokens:
        _fail(f"{node!r}: {len(node.hashes)} page hashes for {node.num_tokens} tokens")


def _check_tiers(tree, node) -> None:
    parent = node.parent
    if node.device is None and node.host is None:
        _fail(f"{node!r} holds its history on no tier")
    if node.device is not None and parent.device is None:
        _fail(f"{node!r} is on the device but its parent {parent!r} is not")
    if (node.state_device and node.device is None) or (node.state_host and node.host is None):
        _fail(f"{node!r}: a snapshot on a tier without the history there")
    for snap in (node.state_device, node.state_host):
        if snap and {k: v.numel() for k, v in snap.items()} != tree.state_sizes:
            _fail(f"{node!r}: snapshot sizes {[(k, v.numel()) for k, v in snap.items()]} != {tree.state_sizes}")
    if tree.policy != "write_back" and node.host is not None and parent.host is None:
        _fail(f"{node!r} is backed up but its parent {parent!r} is not ({tree.policy})")


def _check_candidates(tree, node) -> None:
    for tier in tree.tiers:
        if tier.is_leaf(node) and node not in tier.leaves:
            _fail(f"{tier.name} leaf {node!r} missing from the {tier.name} eviction candidates")
        if tier.snapshot(node) and node not in tier.states:
            _fail(f"{node!r}: {tier.name} snapshot missing from its candidate set")


def _held_slots(tree, nodes) -> dict:
    """(tier, pool) -> {"cached": [...], "locked": [...], "in_flight": [...]} slot tensors."""
    held = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        kind = "cached" if node.evictable else "locked"
        for tier in tree.tiers:
            slots = tier.slots(node)
            if slots is not None:
                held[(tier.name, tree.anchor)][kind].append(slots)
            for name, s in (tier.snapshot(node) or {}).items():
                held[(tier.name, name)][kind].append(s)
    rolled_back = tree.ctrl.rolled_back_ops()  # their destination slots are free again
    for op, rec in tree._pending.items():
        if op in rolled_back:  # the controller already freed its destination slots
            continue
        tier = "host" if rec.kind == "backup" else "device"
        for name, s in rec.dst.items():
            held[(tier, name)]["in_flight"].append(s)
    if tree.storage is not None:  # prefetches' host slots, and freed pages a write still reads
        for p in tree._prefetches:
            for name, s in [(tree.anchor, p.host), *(p.snap or {}).items()]:
                held[("host", name)]["in_flight"].append(s)
        for name, s in tree.storage.deferred_slots().items():
            held[("host", name)]["in_flight"].append(s)
    return held


def _check_slots(tree, nodes) -> None:
    held = _held_slots(tree, nodes)
    for name in [tree.anchor, *tree.state_sizes]:
        for tier in tree.tiers:
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


def _check_held(tree, nodes) -> None:
    ps, expect = tree.page_size, np.zeros_like(tree._held)
    parts = [n.device for n in nodes if n.device is not None]
    parts += [rec.dst[tree.anchor] for rec in tree._pending.values()
              if rec.kind == "load" and tree.anchor in rec.dst]  # rolled back too, until acked
    for slots in parts:
        np.add.at(expect, slots.numpy()[::ps] // ps, 1)
    wrong = np.flatnonzero(expect != tree._held)
    if wrong.size:
        p = int(wrong[0])
        _fail(f"device page {p}: held count {int(tree._held[p])}, but nodes and loads hold it {int(expect[p])} times")


def check_tree(tree) -> None:
    """Raise RuntimeError naming the first broken invariant of ``tree``.

    Assumes the caller holds no device slots outside the tree and that every
    controller op on these pools was queued by the tree.
    """
    nodes = tree_nodes(tree)
    for node in nodes:
        _check_structure(tree, node)
        _check_tiers(tree, node)
        _check_candidates(tree, node)
    for op, rec in tree._pending.items():
        if rec.node.dead:
            _fail(f"op {op} in flight on a deleted node {rec.node!r}")
    _check_slots(tree, nodes)
    _check_held(tree, nodes)
    tree.ctrl.check_integrity()
