"""The built-in workloads of `hicache replay` (``--workload``), seeded, no file needed.

Each is a list of `Request`s as a Mooncake trace would hold them: ``hash_ids`` name
512-token blocks, equal ids at equal depth are the same content, and every new prompt's
private part gets fresh ids. Three shapes, each a different eviction problem (and a
fourth with client hints, ``agents-hinted``: `hicache.replay.hinted`):

    chat            64 conversations of 2-8 turns from 4 shared 2-block system prompts; a
                    turn's prompt is the previous one plus its answer and a new message
                    (recency wins: the next turn reuses what was just used)
    shared-prompts  many users on a few long system prompts (4-16 blocks) of skewed
                    popularity, each user adding a short private tail, some returning once
                    (frequency wins: a popular prompt is worth more than the last tail)
    agents          agents re-reading a growing context: a long preamble per agent kind,
                    then steps that each append a tool result and resend everything
                    (long contexts reused step after step, interleaved with other agents)

    chat            |sys|msg|ans|msg|ans|msg| ...      turn t+1 = turn t + answer + message
    shared-prompts  |---- system prompt k ----|tail|   k drawn with weight 1/(k+1)
    agents          |--- preamble ---|step|step|step|  each step resends the whole context
"""
from __future__ import annotations

import random
from typing import Callable, NamedTuple

from hicache.replay.hinted import agents_hinted_workload
from hicache.replay.sessions import sessions_workload
from hicache.replay.workload import BLOCK_TOKENS, FreshIds, Request

__all__ = ["WORKLOADS", "Workload", "agents_hinted_workload", "agents_workload", "chat_workload",
           "shared_prompts_workload"]


def _shared_prefixes(lengths: list[int]) -> tuple[list[list[int]], FreshIds]:
    """Shared prefixes of ``lengths`` blocks (ids 0, 1, ... in turn), and the fresh ids after them."""
    prefixes, start = [], 0
    for n in lengths:
        prefixes.append(list(range(start, start + n)))
        start += n
    return prefixes, FreshIds(start)


def _interleave(queues: list[list[tuple[int, int, tuple[int, ...]]]], rng: random.Random) -> list[Request]:
    """Each queue's requests in its own order, the queues interleaved at random."""
    order = [c for c, q in enumerate(queues) for _ in q]
    rng.shuffle(order)
    cursor = [0] * len(queues)
    out = []
    for ts, c in enumerate(order):
        n_in, n_out, ids = queues[c][cursor[c]]
        cursor[c] += 1
        out.append(Request(ts, n_in, n_out, ids))
    return out


def chat_workload(seed: int = 0, conversations: int = 64, max_turns: int = 8,
                  system_prompts: int = 4) -> list[Request]:
    """A seeded multi-turn chat workload.

    Each conversation starts from one of ``system_prompts`` shared 2-block prompts; every
    turn appends the previous answer (``output_length`` tokens, modelled as part of the
    next prompt) and a new user message, so turn t+1's prompt extends turn t's. Turns of
    different conversations interleave at random.
    """
    rng = random.Random(seed)
    fresh = FreshIds(2 * system_prompts)
    queues = []
    for _ in range(conversations):
        sp = rng.randrange(system_prompts)
        ids, length, reqs = [2 * sp, 2 * sp + 1], 2 * BLOCK_TOKENS, []
        for _turn in range(rng.randint(2, max_turns)):
            length += rng.randint(150, 900)  # the new user message
            fresh.extend(ids, length)
            out = rng.randint(80, 400)
            reqs.append((length, out, tuple(ids)))
            length += out  # the answer becomes part of the next prompt
        queues.append(reqs)
    return _interleave(queues, rng)


def shared_prompts_workload(seed: int = 0, users: int = 200, system_prompts: int = 40) -> list[Request]:
    """Many users sharing a few long system prompts, each with a short private tail.

    System prompt k is 4-16 blocks long and chosen with weight 1/(k+1) (a few hot ones, a
    long tail of cold ones); a user sends its prompt plus a 100-600-token message, and a
    third of the users come back once with their previous prompt, its answer and a new
    message. About 270 requests and 1.5 M prompt tokens.
    """
    rng = random.Random(seed)
    prefixes, fresh = _shared_prefixes([rng.randint(4, 16) for _ in range(system_prompts)])
    weights = [1 / (k + 1) for k in range(system_prompts)]
    queues = []
    for _ in range(users):
        k = rng.choices(range(system_prompts), weights)[0]
        ids, length, reqs = list(prefixes[k]), len(prefixes[k]) * BLOCK_TOKENS, []
        for _turn in range(2 if rng.random() < 1 / 3 else 1):
            length += rng.randint(100, 600)
            fresh.extend(ids, length)
            out = rng.randint(50, 300)
            reqs.append((length, out, tuple(ids)))
            length += out
        queues.append(reqs)
    return _interleave(queues, rng)


def agents_workload(seed: int = 0, agents: int = 16, kinds: int = 3) -> list[Request]:
    """Agents re-reading a growing context: a shared preamble per kind, then tool steps.

    Each agent has one of ``kinds`` preambles (8-16 blocks: instructions and tool
    descriptions) and takes 3-12 steps; a step appends the model's call (50-200 tokens)
    and a tool result (300-3,000 tokens) and resends the whole context. Agents' steps
    interleave at random. About 120 requests and 2 M prompt tokens.
    """
    rng = random.Random(seed)
    prefixes, fresh = _shared_prefixes([rng.randint(8, 16) for _ in range(kinds)])
    queues = []
    for _ in range(agents):
        k = rng.randrange(kinds)
        ids, length, reqs = list(prefixes[k]), len(prefixes[k]) * BLOCK_TOKENS, []
        for _step in range(rng.randint(3, 12)):
            length += rng.randint(300, 3000)  # the tool's result
            fresh.extend(ids, length)
            out = rng.randint(50, 200)  # the next call
            reqs.append((length, out, tuple(ids)))
            length += out
        queues.append(reqs)
    return _interleave(queues, rng)


class Workload(NamedTuple):
    """A named built-in workload: its generator (seed -> requests) and one line saying what it is."""

    make: Callable[[int], list[Request]]
    description: str


WORKLOADS: dict[str, Workload] = {
    "chat": Workload(chat_workload, "the built-in multi-turn chat (64 conversations of 2-8 turns)"),
    "shared-prompts": Workload(shared_prompts_workload, "the built-in shared system prompts (200 users on 40 "
                                                        "prompts of skewed popularity, short private tails)"),
    "agents": Workload(agents_workload, "the built-in agents (16 agents re-reading a growing context, 3-12 steps)"),
    "agents-hinted": Workload(agents_hinted_workload, "the built-in hinted agents (40 sessions, 4 at a time, between "
                                                      "tool calls of stated lengths, other traffic all along)"),
    "sessions": Workload(sessions_workload, "the built-in sessions (1,000 requests: multi-turn sessions back after "
                                            "heavy-tailed gaps among one-off prompts, `hicache.replay.sessions`)"),
}
