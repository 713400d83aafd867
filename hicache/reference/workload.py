"""The multi-turn workload of `hicache verify-model`: conversations revisited in random order.

Every conversation opens with the same system prompt (``SYSTEM_TOKENS`` = 40: one page and
a quarter, so a new conversation matches only part of a page of another's), then each
turn adds a user message of ``USER_TOKENS`` random tokens; the prompt of a turn is the
whole conversation so far (every earlier prompt and the tokens the model answered):

    turn 1   [system | user 1]                                       -> decode d tokens
    turn 2   [system | user 1 | answer 1 | user 2]                   -> decode d tokens
    turn 3   [system | user 1 | answer 1 | user 2 | answer 2 | user 3] ...

The order interleaves conversations at random (each one's turns stay in order), so a
conversation returns after a random number of others: its prefix may still be on the
device, or evicted to the host, or to storage.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

SYSTEM_TOKENS = 40
USER_TOKENS = (12, 56)  # a user message's length range, inclusive


class Turn(NamedTuple):
    """One request: conversation ``conversation``'s turn ``turn`` and its user message."""

    conversation: int
    turn: int
    user: np.ndarray


def schedule(num_conversations: int, num_turns: int, vocab_size: int, seed: int
             ) -> tuple[np.ndarray, list[Turn]]:
    """(the shared system prompt, every turn in serving order), deterministic in ``seed``.

    Raises:
        ValueError: a count below 1 (naming its flag).
    """
    if num_conversations < 1:
        raise ValueError(f"--conversations: must be >= 1, got {num_conversations}")
    if num_turns < 1:
        raise ValueError(f"--turns: must be >= 1, got {num_turns}")
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, SYSTEM_TOKENS, dtype=np.int64)
    left = [num_turns] * num_conversations
    turns = []
    while any(left):
        c = int(rng.choice([i for i, n in enumerate(left) if n]))
        length = int(rng.integers(USER_TOKENS[0], USER_TOKENS[1] + 1))
        turns.append(Turn(c, num_turns - left[c], rng.integers(0, vocab_size, length, dtype=np.int64)))
        left[c] -= 1
    return system, turns


def longest_request(num_turns: int, decode: int) -> int:
    """Tokens the longest possible request computes into the cache (prompt + decode - 1),
    whatever the seed: every user message at its longest."""
    return SYSTEM_TOKENS + num_turns * USER_TOKENS[1] + (num_turns - 1) * decode + decode - 1
