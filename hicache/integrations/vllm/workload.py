"""Multi-turn conversations for the end-to-end test and ``bench/vllm_multiturn.py``.

Each conversation opens with its own long document (the shared prefix that returning
turns reuse); every turn appends a question, then the model's answer, so turn ``t``'s
prompt extends turn ``t-1``'s. Requests go turn by turn across conversations, which is
what pushes a small device cache to evict a conversation's prefix before it returns.
"""
from __future__ import annotations

import random
from typing import Callable

WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "iris",
         "juniper", "kelp", "lagoon", "meadow", "nickel", "orchid", "pewter", "quartz", "raven",
         "saffron", "tundra", "umber", "violet", "willow", "xenon", "yarrow", "zephyr")


def document(conversation: int, sentences: int, seed: int = 0) -> str:
    """A deterministic pseudo-text of ``sentences`` short facts about one conversation."""
    rng = random.Random(seed * 1_000_003 + conversation)
    facts = [f"Fact {i} of dossier {conversation}: the {rng.choice(WORDS)} {rng.choice(WORDS)} "
             f"is near the {rng.choice(WORDS)}." for i in range(sentences)]
    return f"Dossier {conversation}.\n" + " ".join(facts) + "\n"


def question(conversation: int, turn: int) -> str:
    return f"User: In dossier {conversation}, what is near fact {3 * turn + 1}?\nAssistant:"


def run_turns(num_conversations: int, num_turns: int, sentences: int,
              ask: Callable[[int, int, str], str], seed: int = 0) -> None:
    """Drive the workload: ``ask(conversation, turn, prompt)`` returns the answer text.

    Turn-major order (all conversations' turn 0, then turn 1 ...).
    """
    history = [document(c, sentences, seed) for c in range(num_conversations)]
    for turn in range(num_turns):
        for c in range(num_conversations):
            prompt = history[c] + question(c, turn)
            answer = ask(c, turn, prompt)
            history[c] = prompt + answer + "\n"
