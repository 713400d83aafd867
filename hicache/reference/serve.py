"""`ModelServer`: a reference model served through the whole hierarchy, one request at a time.

A request is a prompt plus ``decode`` greedy tokens. Its life is a server's:

    match_prefix(prompt[:-1])  -> storage prefetch of the rest (wait_complete) and match
    again -> lock the match end -> load_back the host part (start_loading, wait; a fault
    corrupts what came back) -> resume: the matched node's device snapshot copied into a
    fresh working row of the state root (``swa``, ``conv``) -> prefill the rest in chunks
    cut at page boundaries, then decode; at every ``interval`` boundary crossed (every
    page for DeepSeek-V4) and at the last page boundary of the sequence, the working row is
    copied to a fresh row (a snapshot) -> insert each boundary with its snapshot -> free
    the partly filled last page and the working row -> start_writing, wait, drain the
    storage writes -> unlock

    positions  |<- device ->|<- host ->|<- storage ->|<- computed prompt ->|<- decode ->|
               0                                    start            len(prompt)     end

The match stops one token short of the prompt so at least one prompt token is computed
(its logits give the first decoded token). ``end = len(prompt) + decode - 1``: the last
decoded token is returned, not fed.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.radix import HiRadixCache
from hicache.radix.node import TreeNode
from hicache.reference.paged import PagedSeq, clear_state, copy_state

TIERS = ("device", "host", "storage", "computed")


class Served(NamedTuple):
    """One served request: logits of positions ``[start, start + len(logits))``, the greedy
    tokens and where the prompt's tokens came from (keys `TIERS`)."""

    logits: torch.Tensor
    start: int
    generated: list[int]
    tokens_from: dict[str, int]


class Fault:
    """Negative control: corrupts every row of ``pool`` a load brings back. Typed rows get N(0, 1)
    noise; byte rows with a ``codec`` (fp8_ds_mla) get its ``corrupt(rows, gen, parts)``: noise
    on the values re-quantized with their scales, and every tile's scale exponent shifted."""

    def __init__(self, cache: Any, pool: str, seed: int, codec: Any = None,
                 parts: tuple[str, ...] = ("values", "scales")) -> None:
        self.cache, self.pool, self.codec, self.parts = cache, pool, codec, parts
        self.root = cache.stack.root_of(pool).name
        self.gen = torch.Generator().manual_seed(seed)
        self.rows_corrupted = 0

    def apply(self, dst: dict[str, torch.Tensor]) -> None:
        slots = dst.get(self.root)
        if slots is None or not slots.numel():
            return
        pool = self.cache.device_pools[self.pool]
        rows = self.cache.stack.derive_rows({self.root: slots})[self.pool].to(pool.device)
        for bufs in pool.tensors:
            for t in bufs:
                if self.codec is not None:
                    t[rows] = self.codec.corrupt(t[rows], self.gen, self.parts)
                    continue
                noise = torch.randn((rows.numel(), *t.shape[1:]), generator=self.gen).to(t.device, t.dtype)
                t[rows] += noise
        self.rows_corrupted += rows.numel()


class WrongBoundary:
    """Negative control: a request resumes from the snapshot of another boundary than its
    match end's (the nearest ancestor's on the device, else the empty state of boundary
    0), beside the right history. ``rows_corrupted`` counts such resumes."""

    pool = "wrong-boundary"

    def __init__(self) -> None:
        self.rows_corrupted = 0

    def apply(self, dst: dict[str, torch.Tensor]) -> None:
        """Loads come back as they are (the fault is in the resume)."""

    def source(self, node: TreeNode, root: str) -> torch.Tensor | None:
        """Device slots of the snapshot to resume from instead of ``node``'s (``None``: zeros)."""
        self.rows_corrupted += 1
        cur = node.parent
        while cur is not None and not (cur.state_device and root in cur.state_device):
            cur = cur.parent
        return None if cur is None else cur.state_device[root]


class ModelServer:
    """Serves requests of ``model`` (`Dsv4Model` / `MhaModel`) on ``cache`` through ``tree``.

    Args:
        cache: the `hicache.HiCache` whose device pools the model reads and writes.
        tree: the `HiRadixCache` over it (storage tier included when configured).
        fault: corrupts loads of one pool (`Fault`) or resumes (`WrongBoundary`), or ``None``.
        interval: tokens between snapshots (a multiple of the page; default one page).
    Not thread-safe.
    """

    def __init__(self, model: Any, cache: Any, tree: HiRadixCache, fault: Fault | WrongBoundary | None = None,
                 interval: int | None = None) -> None:
        self.model, self.cache, self.tree, self.fault = model, cache, tree, fault
        self.stack, self.pools = cache.stack, cache.device_pools
        self.page = self.stack.page_size
        self.interval = interval or self.page
        self.anchor = self.stack.anchor.name
        self.root, self.window = next(iter(tree.state_sizes.items()), (None, 0))
        self._last = 0  # the current request's last page boundary (`_compute`)

    def serve(self, prompt: np.ndarray, decode: int) -> Served:
        """Serve one request; the tree keeps its pages (and snapshots) afterwards.

        Raises:
            ValueError: the device cannot hold the request (``--device-tokens`` too small).
        """
        tree = self.tree
        key = prompt[:-1]
        m, first_end = tree.match_and_prefetch(key)  # a prefetch lands host-only: the device hit stays
        device_hit = m.device_hit_length
        lock = m.last_host_node
        tree.inc_lock_ref(lock)
        try:
            node, prefix = self._restore(key, m)
            start = prefix.numel()
            tiers = {"device": device_hit, "host": max(0, min(start, first_end) - device_hit),
                     "storage": max(0, start - max(first_end, device_hit)), "computed": prompt.size - start}
            logits, generated = self._compute(prompt, decode, node, prefix)
        finally:
            tree.dec_lock_ref(lock)
        tree.poll()
        return Served(logits, start, generated, tiers)

    # ---- the cached prefix --------------------------------------------------------------
    def _restore(self, key: np.ndarray, m) -> tuple[TreeNode, torch.Tensor]:
        """(node whose state to resume, device slots of its prefix) after any load-back."""
        tree = self.tree
        if m.last_host_node is m.last_device_node:
            return m.last_device_node, m.device_slots
        dst = tree.load_back(m.last_host_node)
        if dst is None:  # the device is short: compute the host part again
            return m.last_device_node, m.device_slots
        self.cache.controller.start_loading()
        tree.wait()
        if self.fault is not None:
            self.fault.apply(dst)
        again = tree.match_prefix(key)
        if again.last_device_node is not m.last_host_node:  # the load failed
            return m.last_device_node, m.device_slots
        return again.last_device_node, again.device_slots

    # ---- computing the rest -----------------------------------------------------------
    def _alloc(self, pool: str, n: int, evict) -> torch.Tensor | None:
        dev = self.pools[pool]
        slots = dev.alloc(n)
        if slots is None:
            evict(n - dev.available())
            slots = dev.alloc(n)
        return slots

    def _open(self, end: int, node: TreeNode, prefix: torch.Tensor) -> PagedSeq:
        """The request's sequence: prefix slots plus fresh pages up to ``end``, a working
        row holding ``node``'s snapshot (hybrid stacks)."""
        start = prefix.numel()
        need = -(-end // self.page) * self.page - start
        new = self._alloc(self.anchor, need, self.tree.evict)
        if new is None:
            raise ValueError(f"--device-tokens: the device cannot hold a {end}-token request "
                             f"({self.pools[self.anchor].num_tokens} tokens); raise it")
        work = None
        if self.window:
            work = self._alloc(self.root, self.window, self.tree.evict_states)
            if work is None:
                self.pools[self.anchor].free(new)
                raise ValueError(f"--device-tokens: no device {self.root} row left for the working state; raise it")
            if start:
                self._resume(node, work)
        return PagedSeq(self.stack, self.pools, torch.cat([prefix, new]), work, length=start,
                        codecs=self.model.codecs)

    def _resume(self, node: TreeNode, work: torch.Tensor) -> None:
        """The working row takes ``node``'s device snapshot (a `WrongBoundary` fault: another's)."""
        src = node.state_device[self.root]
        if isinstance(self.fault, WrongBoundary):
            src = self.fault.source(node, self.root)
        if src is None:
            clear_state(self.stack, self.pools, work)
        else:
            copy_state(self.stack, self.pools, src, work)

    def _compute(self, prompt: np.ndarray, decode: int, node: TreeNode, prefix: torch.Tensor
                 ) -> tuple[torch.Tensor, list[int]]:
        end = prompt.size + decode - 1
        self._last = end - end % self.page  # the last boundary inserted: it gets a snapshot too
        seq = self._open(end, node, prefix)
        tokens = torch.from_numpy(prompt)
        snaps: dict[int, dict] = {}
        logits = []
        while seq.length < prompt.size:  # prefill, cut at page boundaries
            stop = min(prompt.size, (seq.length // self.page + 1) * self.page)
            logits.append(self.model.forward(seq, tokens[seq.length:stop]))
            self._snapshot(seq, snaps)
        generated = [int(logits[-1][-1].argmax())]
        while len(generated) < decode:
            logits.append(self.model.forward(seq, torch.tensor(generated[-1:])))
            self._snapshot(seq, snaps)
            generated.append(int(logits[-1][-1].argmax()))
        full = np.concatenate([prompt, np.asarray(generated[:-1], np.int64)])
        self._insert(full, seq, snaps)
        return torch.cat(logits).cpu(), generated

    def _snapshot(self, seq: PagedSeq, snaps: dict[int, dict]) -> None:
        """At an interval boundary or the last one: copy the working row to a fresh row of
        the state root (skipped when short)."""
        if not self.window or seq.length % self.page or (seq.length % self.interval and seq.length != self._last):
            return
        partial = [kv.shape[0] for kv, _ in seq.scratch.values() if kv.shape[0]]
        if partial:
            raise RuntimeError(f"snapshot at {seq.length}: HCA windows still partial ({partial} tokens); "
                               "the page must be a multiple of the HCA ratio")
        snap = self._alloc(self.root, self.window, self.tree.evict_states)
        if snap is not None:
            copy_state(self.stack, self.pools, seq.work, snap)
            snaps[seq.length] = {self.root: snap}

    def _insert(self, tokens: np.ndarray, seq: PagedSeq, snaps: dict[int, dict]) -> None:
        """Insert every boundary with its snapshot (as the tree's own slots grow), then the
        whole pages left; free the last partial page and the working row."""
        tree, slots = self.tree, seq.slots
        last, done = tokens.size // self.page * self.page, 0
        for b in sorted(snaps):
            node = tree.insert(tokens[:b], slots[:b], extra=snaps.pop(b)).last_node
            if node.end != b or node.device is None:  # stopped at a load in flight
                self._release(slots[b:], snaps)
                slots = slots[:0]
                break
            slots, done = torch.cat([tree.device_slots(node), slots[b:]]), b
        if slots.numel():
            if last > done:
                tree.insert(tokens[:last], slots[:last])
            if slots.numel() > last:
                self.pools[self.anchor].free(slots[last:])
        if seq.work is not None:
            self.pools[self.root].free(seq.work)
        self.cache.controller.start_writing()
        tree.wait()
        if tree.storage is not None:
            tree.drain_storage()

    def _release(self, slots: torch.Tensor, snaps: dict[int, dict]) -> None:
        if slots.numel():
            self.pools[self.anchor].free(slots)
        for snap in snaps.values():
            self.pools[self.root].free(snap[self.root])
        snaps.clear()
