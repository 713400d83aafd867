"""The ``sessions`` workload (`hicache.replay.sessions`): seeded, in the trace's format, each
session's turn a prefix of its next one, and written as a trace that reads back exactly."""
from __future__ import annotations

from hicache.replay.sessions import sessions_workload, write_trace
from hicache.replay.workload import BLOCK_TOKENS, load_trace


def test_sessions_are_seeded_and_turns_extend_each_other():
    reqs = sessions_workload(seed=3, requests=300)
    assert reqs == sessions_workload(seed=3, requests=300)
    assert reqs != sessions_workload(seed=4, requests=300)
    assert len(reqs) == 300
    assert all(a.timestamp <= b.timestamp for a, b in zip(reqs, reqs[1:]))
    for r in reqs:  # the blocks cover the prompt, the last one partial at most
        assert (len(r.hash_ids) - 1) * BLOCK_TOKENS < r.input_length <= len(r.hash_ids) * BLOCK_TOKENS
    chains = [r.hash_ids for r in reqs]
    later = [c for i, c in enumerate(chains) if any(2 < len(p) < len(c) and c[:len(p)] == p for p in chains[:i])]
    assert len(later) > 30  # sessions come back: a later turn extends an earlier one
    firsts = {c[0] for c in chains}
    assert len(firsts) <= 4  # every request starts with one of the system prompts


def test_sessions_round_trip_through_a_trace(tmp_path):
    reqs = sessions_workload(seed=0, requests=120)
    assert load_trace(write_trace(reqs, tmp_path / "s.jsonl")) == reqs
