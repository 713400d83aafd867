"""Client hints on cached prefixes: retain, demote, prefetch, persist, release.

A client (an agent framework) knows what an eviction policy can only guess: that a
context comes back after a tool call, that a system prompt serves many sessions, that a
finished session's context is never read again. `HiRadixCache.hint` takes one action on a
prefix and returns a `HintTicket`; `HiRadixCache.hint_envelope` takes the JSON envelope a
vLLM request or a replay trace line carries (`hicache.radix.hints.envelope`). The parts:

    module      owns
    ticket      HintTicket, HintState: what the client holds, its callbacks and wait()
    envelope    the envelope and the hint's checks, the capability report (torch-free)
    retains     Retain, the budget allotment per tier, the clock of hits
    book        HintBook: retains and releases in force, deadlines, the eviction filter
    work        HintWork: demote, prefetch and persist as jobs through transfers and storage
    front       Hints: the per-step limit, checks, the prefix's node, dispatch

The tree composes one `Hints` (with its book and work); eviction consults the book through
one filter where a tier's victims are chosen (`hicache.radix.evict`).
"""
from hicache.radix.hints.book import HintBook
from hicache.radix.hints.envelope import (ACTIONS, ENVELOPE_KEY, MAX_HINTS_IN_FLIGHT, MAX_HINTS_PER_STEP, Hint,
                                          HintError, capabilities, capability_line, check_hint, parse_envelope)
from hicache.radix.hints.front import Hints, build_hints
from hicache.radix.hints.ticket import HintState, HintTicket
from hicache.radix.hints.work import HintWork

__all__ = ["ACTIONS", "ENVELOPE_KEY", "MAX_HINTS_IN_FLIGHT", "MAX_HINTS_PER_STEP", "Hint", "HintBook", "HintError",
           "HintState", "HintTicket", "HintWork", "Hints", "build_hints", "capabilities", "capability_line",
           "check_hint", "parse_envelope"]
