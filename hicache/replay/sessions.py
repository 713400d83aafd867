"""The ``sessions`` workload: multi-turn sessions that come back after heavy-tailed gaps,
among one-off traffic, in the Mooncake trace's format (seeded, no file needed).

A server's real multi-turn traffic is not the built-in chat (where the next turn follows
at once): a user reads, thinks, leaves for lunch. Most of what a cache holds is then
one-off prompts (a document summarized once, a retrieval-augmented question), and what
is worth keeping is the few sessions that will come back, which a recency order cannot
tell from the one-offs. This generator makes that traffic from a few stated
distributions (times in seconds, one request a second on average):

    system prompts   `SYSTEM_PROMPTS` of 1-2 blocks; every request starts with one
                     (weight 1/(k+1)): the first block is shared, the rest is not
    one-off          a system prompt + a fresh context of lognormal length (median
                     `ONE_OFF_MEDIAN` tokens, 1k-48k) + a short question; never again
    session          a system prompt + a fresh context (lognormal, median
                     `SESSION_MEDIAN`), then turns: each appends the previous answer
                     and a new message (100-900 tokens), so turn t+1 extends turn t
    turns            1 + geometric (mean `MEAN_TURNS`)
    gaps             Pareto (shape `GAP_SHAPE`, at least `GAP_MIN_S` s): most users come
                     back within minutes, some after hours
    arrivals         sessions and one-offs start as Poisson processes; one-offs are
                     `ONE_OFF_SHARE` of the first requests

    time  ->   o   S1  o  o  S2  o  o  o  S1' o  o  o  o  o  o  o  S2' ... S1''
    (o: one-off;  S1, S1', S1'': one session's turns, each a prefix of the next)

`write_trace` writes the requests as JSON lines (``timestamp`` in ms, ``input_length``,
``output_length``, ``hash_ids``): ``hicache replay --trace`` reads them back exactly.
"""
from __future__ import annotations

import heapq
import json
import math
import random
from pathlib import Path

from hicache.replay.workload import BLOCK_TOKENS, FreshIds, Request

__all__ = ["sessions_workload", "write_trace"]

SYSTEM_PROMPTS = 4
ONE_OFF_MEDIAN, SESSION_MEDIAN = 9000, 7000  # tokens of a fresh context (lognormal medians)
LENGTH_SIGMA = 0.8  # of both lognormals: a tenth of the contexts over ~2.8x the median
MEAN_TURNS = 3.0
GAP_SHAPE, GAP_MIN_S, GAP_MAX_S = 1.0, 110.0, 20000.0
ONE_OFF_SHARE = 0.6  # of the requests that start something (the rest start a session)


def _context(rng: random.Random, median: int) -> int:
    return int(min(48_000, max(1000, rng.lognormvariate(math.log(median), LENGTH_SIGMA))))


def _gap(rng: random.Random) -> float:
    return min(GAP_MAX_S, GAP_MIN_S * rng.paretovariate(GAP_SHAPE))


def sessions_workload(seed: int = 0, requests: int = 1000) -> list[Request]:
    """``requests`` requests of sessions and one-offs (module docstring), in arrival order.

    Deterministic for a seed. Each session's turn is a prefix of its next turn; one-offs
    and sessions share only their system prompt's blocks.
    """
    rng = random.Random(seed)
    prompts = [[2 * k] + ([2 * k + 1] if rng.random() < 0.5 else []) for k in range(SYSTEM_PROMPTS)]
    fresh = FreshIds(2 * SYSTEM_PROMPTS)
    weights = [1 / (k + 1) for k in range(SYSTEM_PROMPTS)]
    due: list[tuple[float, int, list, int, int]] = []  # (time, seq, ids, length, turns left) of waiting sessions
    out: list[Request] = []
    now, seq = 0.0, 0
    while len(out) < requests:
        start = now + rng.expovariate(1.0 - _returning_share())  # new starts: the rest of one a second
        if due and due[0][0] <= start:  # a session comes back before anything new starts
            now, _, ids, length, left = heapq.heappop(due)
        else:
            now = start
            ids = list(prompts[rng.choices(range(SYSTEM_PROMPTS), weights)[0]])
            one_off = rng.random() < ONE_OFF_SHARE
            length = len(ids) * BLOCK_TOKENS + _context(rng, ONE_OFF_MEDIAN if one_off else SESSION_MEDIAN)
            left = 0 if one_off else _turns(rng)
        length += rng.randint(100, 900)  # the new message (or the one-off's question)
        fresh.extend(ids, length)
        answer = rng.randint(50, 600)
        out.append(Request(int(now * 1000), length, answer, tuple(ids)))
        if left:
            seq += 1
            heapq.heappush(due, (now + _gap(rng), seq, ids, length + answer, left - 1))
    return out


def _returning_share() -> float:
    """The share of requests that are a session's later turn (keeps the rate at one a second)."""
    starts_session = 1.0 - ONE_OFF_SHARE
    later = starts_session * (MEAN_TURNS - 1.0)
    return later / (1.0 + later)


def _turns(rng: random.Random) -> int:
    """1 + geometric with mean ``MEAN_TURNS`` (the turns still to come after the first: this - 1)."""
    p = 1.0 / MEAN_TURNS
    return int(math.log(1.0 - rng.random()) / math.log(1.0 - p)) if p < 1 else 0


def write_trace(requests: list[Request], path: str | Path) -> Path:
    """Write ``requests`` as a Mooncake JSONL trace (one object per line); returns the path."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"timestamp": r.timestamp, "input_length": r.input_length,
                                "output_length": r.output_length, "hash_ids": list(r.hash_ids)}) + "\n")
    return path
