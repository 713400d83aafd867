"""The built-in ``agents-hinted`` workload: agent sessions whose turns are separated by
tool calls of stated lengths, other traffic in between, and the hints an agent framework
sends (`hicache.radix.hints`). Seeded; timestamps in milliseconds (the hints' clock).

    session  |sys|res|res|res ...|      turn k+1 = turn k + the model's call + a tool result
             4 at a time, 40 in all, 3-8 turns each; 4 system prompts of 1-2.5k tokens
    time     turn --gen-- tool call (stated: short 2-10 s, or long 40-150 s) --> next turn
    other    one-off prompts (fresh ids) all along: they pass through the cache once

The hints each turn carries, as an agent framework would send them:

    first turn     after   persist the shared system prompt (``tokens``: its length) and
                           retain it for 5 minutes at a low priority (each turn through it
                           restarts the retain): a release of a context stops below it
    not the last   after   retain the context for the tool's stated length (+ the answer's
                           time, a quarter more for slack) at a priority that falls as the
                           tool gets longer (a context back sooner is worth more); a long
                           tool call also demotes it: it waits on the host
    not the first  before  prefetch it to the device just before the turn
    the last       after   release the context: the session is over

A fixed number of sessions run at once (a new one starts when one ends); their turns
interleave with the other traffic in time order. Without a storage tier the persists
are refused (counted); the other hints work on device and host.
"""
from __future__ import annotations

import heapq
import random

from hicache.replay.workload import BLOCK_TOKENS, Request, TraceHint

__all__ = ["agents_hinted_workload"]

LONG_TOOL_S = 40.0  # a tool call this long or longer demotes the context
SYSTEM_RETAIN_S = 300.0  # a system prompt's retain (each session's turn through it restarts it)
GEN_MS_PER_TOKEN = 20  # the answer's generation time


def _priority(tool_s: float) -> int:
    """A context back sooner is worth more: 95 for a 2 s tool call, 20 for a 150 s one."""
    return max(1, min(99, int(100 - tool_s / 2)))


class _Session:
    """One agent session: its context's block ids and length, and the turns left."""

    def __init__(self, rng: random.Random, prefix: list[int], turns: tuple[int, int]) -> None:
        self.ids, self.length = list(prefix), len(prefix) * BLOCK_TOKENS
        self.system_tokens = self.length
        self.turns_left = rng.randint(*turns)
        self.turn = 0


def _ids_for(s: _Session, fresh: list[int]) -> None:
    while len(s.ids) * BLOCK_TOKENS < s.length:
        s.ids.append(fresh[0])
        fresh[0] += 1


def _turn_hints(s: _Session, last: bool, tool_s: float, gen_s: float) -> tuple[TraceHint, ...]:
    hints = []
    if s.turn > 0:
        hints.append(TraceHint("before", {"prefetch": "device"}))
    if s.turn == 0:  # the shared system prompt: to storage, and kept while sessions use it
        hints.append(TraceHint("after", {"persist": True, "retain_s": SYSTEM_RETAIN_S, "priority": 10,
                                         "tokens": s.system_tokens}))
    if last:
        hints.append(TraceHint("after", {"release": True}))
    else:
        env = {"retain_s": round((tool_s + gen_s) * 1.25, 1), "priority": _priority(tool_s)}
        if tool_s >= LONG_TOOL_S:
            env["demote"] = True
        hints.append(TraceHint("after", env))
    return tuple(hints)


def agents_hinted_workload(seed: int = 0, sessions: int = 40, concurrent: int = 4, kinds: int = 4,
                           other_every_ms: int = 2500, result_tokens: tuple[int, int] = (200, 1000),
                           turns: tuple[int, int] = (3, 8), other_tokens: tuple[int, int] = (1000, 4000),
                           system_blocks: tuple[int, int] = (2, 5)) -> list[Request]:
    """The ``agents-hinted`` workload (module docstring).

    Args:
        seed: the seed; sessions: sessions in all; concurrent: sessions running at once.
        kinds: agent kinds, each with its system prompt of ``system_blocks`` 512-token blocks.
        other_every_ms: mean gap between one-off prompts of other traffic (``other_tokens`` long).
        result_tokens: a tool result's tokens (each turn adds one, and the answer before it).
        turns: a session's turns.
    Returns:
        The requests in time order (seed 0: 200 agent turns, 679 other prompts, 2.55 M prompt
        tokens over 31 minutes; the longest context 8.5k tokens).
    """
    rng = random.Random(seed)
    prefixes, start = [], 0
    for _ in range(kinds):
        n = rng.randint(*system_blocks)
        prefixes.append(list(range(start, start + n)))
        start += n
    fresh = [start]
    out = _agent_turns(rng, prefixes, fresh, sessions, concurrent, result_tokens, turns)
    out += _other_traffic(rng, out[-1].timestamp if out else 0, fresh, other_every_ms, other_tokens)
    out.sort(key=lambda r: r.timestamp)
    return out


def _agent_turns(rng: random.Random, prefixes: list[list[int]], fresh: list[int], sessions: int, concurrent: int,
                 result_tokens: tuple[int, int], turns: tuple[int, int]) -> list[Request]:
    """Every session's turns in time order, ``concurrent`` sessions at once."""
    events: list[tuple[int, int, _Session]] = []  # (time ms, order, session): the session's next turn
    for i in range(min(concurrent, sessions)):
        heapq.heappush(events, (i * 3000, i, _Session(rng, prefixes[rng.randrange(len(prefixes))], turns)))
    order = started = min(concurrent, sessions)
    out: list[Request] = []
    while events:
        t, _, s = heapq.heappop(events)
        req, gap_ms = _turn(rng, s, t, fresh, result_tokens)
        out.append(req)
        if s.turns_left:
            heapq.heappush(events, (t + gap_ms, order, s))
        elif started < sessions:
            nxt = _Session(rng, prefixes[rng.randrange(len(prefixes))], turns)
            heapq.heappush(events, (t + gap_ms + rng.randint(500, 5000), order, nxt))
            started += 1
        order += 1
    return out


def _turn(rng: random.Random, s: _Session, t: int, fresh: list[int],
          result_tokens: tuple[int, int]) -> tuple[Request, int]:
    """Session ``s``'s turn at ``t`` ms, and the ms to its next one (the answer, then a tool
    call; after the last turn, the answer alone)."""
    s.length += rng.randint(*result_tokens)  # the tool's result (the first turn: the task)
    _ids_for(s, fresh)
    out_tokens = rng.randint(50, 200)
    s.turns_left -= 1
    last = s.turns_left == 0
    tool_s = rng.uniform(2, 10) if rng.random() < 0.6 else rng.uniform(LONG_TOOL_S, 150)
    gen_s = out_tokens * GEN_MS_PER_TOKEN / 1000
    req = Request(t, s.length, out_tokens, tuple(s.ids), _turn_hints(s, last, tool_s, gen_s))
    s.length += out_tokens
    s.turn += 1
    return req, int(gen_s * 1000) if last else int((gen_s + tool_s) * 1000)


def _other_traffic(rng: random.Random, end: int, fresh: list[int], every_ms: int,
                   tokens: tuple[int, int]) -> list[Request]:
    """One-off prompts (fresh ids) until ``end`` ms, ``every_ms`` apart on average."""
    out, t = [], 0
    while True:
        t += int(rng.expovariate(1 / every_ms))
        if t > end:
            return out
        ids: list[int] = []
        length = rng.randint(*tokens)
        while len(ids) * BLOCK_TOKENS < length:
            ids.append(fresh[0])
            fresh[0] += 1
        out.append(Request(t, length, rng.randint(50, 300), tuple(ids)))
