"""`Hints`: where a client's hint enters the tree — checked, limited per scheduler step,
resolved to the prefix's last node, and handed to the part that owns its action.

    hint(tokens, action, ...)   envelope(tokens, {...})
        | one step takes at most MAX_HINTS_PER_STEP (more: refused before the tokens are read)
        | the action and its arguments checked (`envelope.check_hint` / `parse_envelope`)
        | an action this cache cannot take refused (`capabilities`: no host, no storage tier)
        | tokens -> whole pages -> the tree's walk; a node matched in part is split (not on
        |   a hybrid stack, whose prefixes end at node boundaries); nothing cached: a no-op
        v
    retain, release -> `HintBook` (at once)     demote, prefetch, persist -> `HintWork` (jobs)

A refusal is a REFUSED ticket whose reason names the argument and what it allows; it
changes nothing. Token ids that are not a 1-D integer sequence raise as in
`HiRadixCache.match_prefix` (they are the request's, not the hint's).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from hicache.radix.hints.book import HintBook
from hicache.radix.hints.envelope import (MAX_HINTS_PER_STEP, Hint, HintError, capabilities, check_hint,
                                          parse_envelope)
from hicache.radix.hints.ticket import HintState, HintTicket, done, refused
from hicache.radix.hints.work import HintWork
from hicache.radix.index import RadixIndex
from hicache.radix.node import TreeNode, as_key


def build_hints(tree: Any, clock: Callable[[], float], step: Callable[[], None]) -> Hints:
    """The `Hints` of ``tree`` (a `HiRadixCache` being built: its index, tiers, evictor,
    transfers and counters exist), its book wired into the evictor as the hints' filter.

    Args:
        clock: the hints' clock (seconds); step: one scheduler step (launch, poll).
    """
    index, config, counters = tree._index, tree.cache.config, tree.counters
    capacity = {"device": tree.device_pool.num_tokens, "host": tree.host_pool.num_tokens if tree.host_enabled else 0}
    book = HintBook(clock, lambda: index.clock, lambda: index.epoch, {"device": "_device", "host": "_host"},
                    capacity, config.max_retained_ratio, tree.page_size * 8, counters)
    tree._evictor.hints = book
    work = HintWork(tree._transfers, tree._evictor, index, lambda: tree._storage, tree._may_prefetch, tree.hybrid,
                    counters, book.retains)

    def unavailable() -> dict[str, str]:
        out = {} if tree.host_enabled else {"demote": "no host tier", "prefetch": "no host tier"}
        if tree._storage is None:
            out["persist"] = "no storage tier"
        return out
    return Hints(index, book, work, tree.page_size, tree.hybrid, max_retained_ratio=config.max_retained_ratio,
                 max_ttl_s=config.max_hint_ttl_s, unavailable=unavailable, step=step, counters=counters)


class Hints:
    """The hints of one tree (module docstring; scheduler thread).

    Args:
        index: the node structure; book: retains and releases; work: the async hints.
        page_size: tokens per page; hybrid: prefixes end at node boundaries (no split).
        max_retained_ratio, max_ttl_s: the config's limits (the capability report's).
        unavailable: returns action -> why this tree cannot take it now.
        step: one scheduler step for `HintTicket.wait` (launch queued copies, poll).
        counters: the tree's counters (``hints``, ``hints_refused``...).
    """

    def __init__(self, index: RadixIndex, book: HintBook, work: HintWork, page_size: int, hybrid: bool, *,
                 max_retained_ratio: float, max_ttl_s: float, unavailable: Callable[[], dict[str, str]],
                 step: Callable[[], None], counters: Counter) -> None:
        self.index, self.book, self.work, self.page_size, self.hybrid = index, book, work, page_size, hybrid
        self.max_retained_ratio, self.max_ttl_s = max_retained_ratio, max_ttl_s
        self.unavailable, self.step, self.counters = unavailable, step, counters
        self._sent = 0  # hints this step

    def capabilities(self) -> dict:
        """The capability report of this tree (`envelope.capabilities`)."""
        return capabilities(self.max_retained_ratio, self.max_ttl_s, self.unavailable())

    def hint(self, token_ids: Any, action: Any, ttl_s: Any = None, priority: Any = None,
             to: Any = None) -> HintTicket:
        """One hint on the prefix ``token_ids`` (`HiRadixCache.hint`)."""
        name = action if isinstance(action, str) else "?"
        if not self._take(1):
            return self._refused(name, self._flood())
        try:
            hint = check_hint(action, ttl_s, priority, to, max_ttl_s=self.max_ttl_s)
        except HintError as exc:
            return self._refused(name, str(exc))
        return self._apply(hint, as_key(token_ids, self.page_size, strict=False))

    def envelope(self, token_ids: Any, value: Any) -> list[HintTicket]:
        """The hints of one envelope on the prompt ``token_ids`` (`HiRadixCache.hint_envelope`)."""
        try:
            hints = parse_envelope(value, max_ttl_s=self.max_ttl_s)
        except HintError as exc:
            return [self._refused("envelope", str(exc))]
        if not self._take(len(hints)):
            return [self._refused(h.action, self._flood()) for h in hints]
        key = as_key(token_ids, self.page_size, strict=False)
        out = []
        for h in hints:
            cut = key.size if h.tokens is None else min(key.size, h.tokens - h.tokens % self.page_size)
            out.append(self._apply(h, key[:cut]))
        return out

    def poll(self) -> None:
        """A scheduler step: a new allowance of hints, deadlines checked, jobs advanced
        (nothing more when no retain and no job is in force: every step's poll calls this)."""
        self._sent = 0
        if self.book.retains:
            self.book.poll()
        if self.work.jobs:
            self.work.poll()

    # ---- internals ---------------------------------------------------------------------------
    def _take(self, n: int) -> bool:
        self.counters["hints"] += n
        if self._sent + n > MAX_HINTS_PER_STEP:
            return False
        self._sent += n
        return True

    @staticmethod
    def _flood() -> str:
        return f"over {MAX_HINTS_PER_STEP} hints in this scheduler step; send it again after the next one"

    def _refused(self, action: str, reason: str) -> HintTicket:
        self.counters["hints_refused"] += 1
        return refused(action, reason)

    def _apply(self, hint: Hint, key: np.ndarray) -> HintTicket:
        missing = self.unavailable().get(hint.action)
        if missing:
            return self._refused(hint.action, f"{hint.action}: not available here ({missing})")
        if hint.action in ("demote", "prefetch", "persist") and self.work.full():
            return self._refused(hint.action, f"{hint.action}: {len(self.work.jobs)} hints in flight already, "
                                              "the most this cache runs at once")
        node = self._resolve(key)
        if node is None and hint.action != "prefetch":
            self.counters["hints_noop"] += 1
            return done(hint.action, "no-op: no page of this prefix is cached", noop=True)
        ticket = HintTicket(hint.action)
        ticket.tokens = 0 if node is None else node.end
        if hint.action == "retain":
            ticket._cancel = lambda t: self.book.end_retain(t, "cancelled")
            self.book.retain(node, ticket, hint.ttl_s, hint.priority)
        elif hint.action == "release":
            self.book.release(node, ticket)
            ticket.settle(HintState.DONE)
        else:
            ticket._wait = lambda t, timeout_s: self.work.wait(t, timeout_s, self.step)
            ticket._cancel = self.work.cancel
            getattr(self.work, hint.action)(*((key, node, hint.to) if hint.action == "prefetch" else (node,)),
                                            ticket)
        if ticket.state is HintState.REFUSED:
            self.counters["hints_refused"] += 1
        return ticket

    def _resolve(self, key: np.ndarray) -> TreeNode | None:
        """The last node of the cached part of ``key`` (a node matched in part is split,
        but on a hybrid stack), or ``None`` when no page of it is cached."""
        path, partial = self.index.walk(key)
        if partial is not None and partial[1] > 0 and not self.hybrid:
            path.append(self.index.split(*partial))
        return path[-1] if path else None
