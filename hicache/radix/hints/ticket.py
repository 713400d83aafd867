"""`HintTicket`: what a client holds after a hint, and `HintState`, where the hint stands.

Every hint gets a ticket at once; its state then moves only forward:

                 its work is complete (the bytes are in place)
    ACCEPTED ------------------------------------------------> DONE
     |    |      the deadline passed, displaced by a higher
     |    |      priority, replaced, released, cancelled
     |    +-------------------------------------------------> EXPIRED
     |           a transfer or a write it needed failed
     +------------------------------------------------------> REFUSED
    (or REFUSED / DONE at once: a bad hint, over a budget, a no-op)

A ``retain`` stays ACCEPTED while it is in force and ends EXPIRED; a ``release`` is DONE
at once; ``demote``, ``prefetch`` and ``persist`` are DONE when their pages are on the
host, on the device (or host) and durable in storage. ``reason`` says why a ticket is
not (or no longer) ACCEPTED; ``notes`` list what happened meanwhile (a retained prefix
pushed down a tier by a running request). The cache changes a ticket on its scheduler
thread; callbacks run there, after every change.
"""
from __future__ import annotations

import enum
import itertools
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)

_ids = itertools.count(1)


class HintState(enum.Enum):
    """Where a hint stands (the module docstring's diagram)."""

    ACCEPTED = "accepted"
    DONE = "done"
    REFUSED = "refused"
    EXPIRED = "expired"


# Actions whose work runs after the hint returns: a ticket of one is busy while ACCEPTED.
ASYNC_ACTIONS = frozenset({"demote", "prefetch", "persist"})


class HintTicket:
    """One hint's handle (module docstring). Read its attributes; the cache sets them.

    Attributes:
        id: a number unique in this process (a later hint's reason may name it).
        action: the hint's action (``retain``, ``demote``, ``prefetch``, ``persist``, ``release``).
        state: a `HintState`.
        reason: one line: why it was refused, expired or is a no-op ("" while nothing to say).
        tokens: tokens of the prefix the hint covers (whole pages the tree holds), 0 if none.
        noop: the hint changed nothing (its prefix is unknown, or already where asked).
        notes: what happened to the prefix while the hint held (oldest first).
    Thread-safety: read it from any thread; ``wait`` and ``cancel`` drive the cache and
    belong to its scheduler thread.
    """

    __slots__ = ("id", "action", "state", "reason", "tokens", "noop", "notes", "_callbacks", "_wait", "_cancel")

    def __init__(self, action: str, state: HintState = HintState.ACCEPTED, reason: str = "") -> None:
        self.id = next(_ids)
        self.action, self.state, self.reason = action, state, reason
        self.tokens, self.noop = 0, False
        self.notes: list[str] = []
        self._callbacks: list[Callable[[HintTicket], Any]] = []
        self._wait: Callable[[HintTicket, float | None], None] | None = None
        self._cancel: Callable[[HintTicket], bool] | None = None

    @property
    def final(self) -> bool:
        """The ticket will not change again (DONE, REFUSED or EXPIRED)."""
        return self.state is not HintState.ACCEPTED

    @property
    def busy(self) -> bool:
        """Its work is still running (an ACCEPTED demote, prefetch or persist)."""
        return self.state is HintState.ACCEPTED and self.action in ASYNC_ACTIONS

    def add_callback(self, fn: Callable[[HintTicket], Any]) -> None:
        """Call ``fn(ticket)`` after every change of state or note (on the cache's scheduler
        thread); a final ticket calls it once, now. A callback that raises is logged and
        does not stop the cache. Mutates the ticket."""
        self._callbacks.append(fn)
        if self.final:
            self._call(fn)

    def wait(self, timeout_s: float | None = None) -> HintState:
        """Drive the cache (launch and poll) until the ticket's work is done, then return
        its state: a demote, prefetch or persist until it leaves ACCEPTED; a retain or a
        release at once (in force while ACCEPTED). Call from the cache's scheduler thread.

        Raises:
            TimeoutError: still busy after ``timeout_s`` seconds.
        """
        if self.busy and self._wait is not None:
            self._wait(self, timeout_s)
        return self.state

    def cancel(self) -> bool:
        """Stop an ACCEPTED prefetch (a storage read stops, a queued load still lands) or
        end a retain: EXPIRED, reason "cancelled". Returns whether it took effect (False
        for other actions and final tickets). Call from the cache's scheduler thread."""
        if self.final or self._cancel is None:
            return False
        return self._cancel(self)

    def as_dict(self) -> dict:
        """The ticket as JSON-ready values (what a server returns to its client)."""
        out = {"id": self.id, "action": self.action, "state": self.state.value, "tokens": self.tokens}
        if self.reason:
            out["reason"] = self.reason
        if self.noop:
            out["noop"] = True
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"HintTicket(id={self.id}, action={self.action}, state={self.state.value}, tokens={self.tokens}{why})"

    # ---- the cache's side -----------------------------------------------------------------
    def settle(self, state: HintState, reason: str = "") -> None:
        """Move to ``state`` (the cache's call; a final ticket stays as it is) and call back."""
        if self.final or state is HintState.ACCEPTED:
            return
        self.state, self.reason = state, reason or self.reason
        self._wait = self._cancel = None
        self._changed()

    def note(self, text: str) -> None:
        """Record what happened to the prefix (the cache's call) and call back."""
        self.notes.append(text)
        self._changed()

    def _changed(self) -> None:
        for fn in list(self._callbacks):
            self._call(fn)

    def _call(self, fn: Callable[[HintTicket], Any]) -> None:
        try:
            fn(self)
        except Exception:  # a client's callback: reported, never the scheduler's failure
            logger.exception("hint ticket %d: a callback raised", self.id)


def refused(action: str, reason: str) -> HintTicket:
    """A ticket refused at once with ``reason`` (one line)."""
    return HintTicket(action, HintState.REFUSED, reason)


def done(action: str, reason: str = "", *, tokens: int = 0, noop: bool = False) -> HintTicket:
    """A ticket DONE at once (``noop``: it changed nothing; ``reason`` says why)."""
    ticket = HintTicket(action, HintState.DONE, reason)
    ticket.tokens, ticket.noop = tokens, noop
    return ticket
