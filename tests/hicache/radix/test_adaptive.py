"""The scores, the mini caches and the adaptive default (`hicache.radix.policies`): each
score's order on hand-made items, the mini caches against the ideal LRU of the bounds,
chains of token ids, and the default switching on a workload that changes and holding
on one that does not."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from hicache.radix.policies import EvictionPolicy, make_policy
from hicache.radix.policies.adaptive import Adaptive
from hicache.radix.policies.requests import KeyChains, TokenChains
from hicache.radix.policies.scores import AgedFrequency, Blend, Frequency, Pace, Score
from hicache.radix.policies.shadow import Shadows
from hicache.replay.bounds import lru_hits


def items() -> dict[str, SimpleNamespace]:
    """Four prefixes: (last access, requests) A (100, 1), B (60, 4), C (90, 2), D (20, 8)."""
    rows = {"A": (100, 1), "B": (60, 4), "C": (90, 2), "D": (20, 8)}
    return {n: SimpleNamespace(last_access=last, hit_count=count, end=10, id=i, num_tokens=1, name=n)
            for i, (n, (last, count)) in enumerate(rows.items())}


class FixedPace:
    """A pace of ``ticks`` clock ticks per capacity."""

    def __init__(self, ticks: float) -> None:
        self.ticks = ticks

    def ticks_per_capacity(self) -> float:
        return self.ticks


def order_by(score: Score) -> str:
    victims = EvictionPolicy({"host": score}).victims("host", items().values())
    out = ""
    while victims:
        out += victims.pop().name
    return out


@pytest.mark.parametrize(("score", "expected"), [
    (Score(), "DBCA"),  # last access
    (Frequency(), "ACBD"),  # requests
    # last + W log2(1 + requests): W = 8 follows recency (D 45, B 79, C 103, A 108), W = 32 mixes
    # them (D 121, A 132, B 134, C 141), W = 256 follows the requests (A 356, C 496, B 654, D 831)
    (Blend(1, FixedPace(8)), "DBCA"),
    (Blend(1, FixedPace(30)), "DABC"),  # W rounds to a power of 2: 32
    (Blend(4, FixedPace(64)), "ACBD"),
])
def test_each_score_orders_hand_made_items(score, expected):
    assert order_by(score) == expected


def test_aged_frequency_ages_from_its_victims():
    """L rises to each victim's key; a prefix touched after that starts from it."""
    lfuda = AgedFrequency()
    assert lfuda.key(5, 3) == 3  # nothing evicted yet: L = 0
    lfuda.evicted(3, clock=10)  # L = 3 from clock 11 on
    lfuda.evicted(2, clock=12)  # a lower victim leaves L as it is
    assert lfuda.age_at(10) == 0 and lfuda.age_at(11) == 3
    assert lfuda.key(11, 1) == 4 and lfuda.key(9, 3) == 3  # touched after the victim: above it


def test_a_blend_rekeys_when_its_weight_falls():
    pace = FixedPace(64)
    blend = Blend(1, pace)
    blend.refresh()
    assert blend.key(0, 1) == 64 and blend.version == 0
    pace.ticks = 128  # the traffic slowed down: W rises, keys made before stay lower bounds
    blend.refresh()
    assert blend.version == 0
    pace.ticks = 16  # it sped up: keys made before may be too high
    blend.refresh()
    assert blend.key(0, 1) == 16 and blend.version == 1


def test_pace_counts_ticks_per_capacity():
    clock = [10]
    pace = Pace(100, lambda: clock[0])
    assert pace.ticks_per_capacity() == 1.0
    pace.add(50)  # first request at tick 10
    clock[0] = 20
    pace.add(150)
    assert pace.ticks_per_capacity() == pytest.approx(10 * 100 / 200)


# ---- the mini caches -----------------------------------------------------------------------
def random_chains(seed: int, requests: int = 400) -> list[list[tuple[int, int]]]:
    """Requests as chains of one-token chunks over a small random prefix tree."""
    rng = random.Random(seed)
    paths = [[1]]
    out = []
    for _ in range(requests):
        base = rng.choice(paths)
        path = base + [rng.randrange(10**9) for _ in range(rng.randint(0, 3))] if rng.random() < 0.5 else base
        paths.append(path)
        out.append([(hash(tuple(path[:i + 1])) & 0xFFFFFFFF, 1) for i in range(len(path))])
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_full_size_lru_mini_cache_is_the_ideal_lru(seed):
    """At rate 1 the LRU mini cache hits what the bounds' ideal prefix LRU hits."""
    chains = random_chains(seed)
    for capacity in (8, 30):
        shadows = Shadows([Score()], capacity, 1, max_chunks=10**6)
        for now, chain in enumerate(chains, 1):
            shadows.observe(chain, now)
        ids = {c: i for i, c in enumerate(dict.fromkeys(c for ch in chains for c, _ in ch))}
        runs = np.array([ids[c] for ch in chains for c, _ in ch], dtype=np.int64)
        starts = np.cumsum([0] + [len(ch) for ch in chains])
        expected = lru_hits(runs, np.ones(runs.size, dtype=np.int64), starts, capacity)
        assert shadows.take_hits() == [expected]


def test_mini_caches_are_bounded_by_what_they_hold():
    shadows = Shadows([Score(), AgedFrequency()], 64, 1, max_chunks=16)
    assert shadows.rate == 16 / 64 and shadows.capacity == 16
    for now, chain in enumerate(random_chains(2, 3000), 1):
        shadows.observe(chain, now)
        assert all(m.tokens <= 16 and len(m.heap) == len(m.held) for m in shadows.minis)
    assert shadows.entries() <= 2 * 16 + 16 + 4 * 16 + 16  # held by each, counts of held + ghosts
    assert shadows.nbytes() > 0


def test_token_chains_name_prefixes_and_sample_below_the_first_chunk():
    chains = TokenChains(page_size=64)  # 512-token chunks
    rng = np.random.default_rng(0)
    system, a, b = (rng.integers(0, 1 << 20, n) for n in (512, 1024, 1024))
    first, second = np.concatenate([system, a[:600]]), np.concatenate([system, a])
    other = np.concatenate([system, b])
    c1, c2, c3 = chains.chain(first), chains.chain(second), chains.chain(other)
    assert [t for _, t in c2] == [512, 512, 512] and [t for _, t in c1] == [512, 512, 88]
    assert c1[:2] == c2[:2] and c1[2] != c2[2]  # a partial chunk is named with its length
    assert c3[0] == c2[0] and c3[1] != c2[1]  # the shared system prompt, then another session
    # a session's turns sample together; another session sharing the system prompt need not
    assert chains.heard(first)[1] == chains.heard(second)[1] != chains.heard(other)[1]
    assert chains.heard(other) is None  # the same request heard again (a match after a load)


# ---- the adaptive default ----------------------------------------------------------------
CAPACITY = 64


def frequency_phase(rng: random.Random, fresh, steps: int):
    """16 hot keys among a scan of one-offs: the scan flushes LRU, counts keep the hot keys."""
    for _ in range(steps):
        yield [f"hot{rng.randrange(16)}"]
        for _ in range(8):
            yield [next(fresh)]


def recency_phase(rng: random.Random, fresh, steps: int):
    """Each request takes a key of the last 40 new ones or a new one: what was hot before is
    never asked again, and recency keeps the recent keys."""
    recent: list[str] = []
    for _ in range(steps):
        if recent and rng.random() < 0.6:
            yield [rng.choice(recent[-40:])]
        else:
            recent.append(next(fresh))
            yield [recent[-1]]


def drive(policy: Adaptive, requests, clock: list[int]) -> list[str]:
    lives = []
    for keys in requests:
        clock[0] += 1
        policy.requested(keys)
        lives.append(policy.live)
    return lives


def adaptive(clock: list[int]) -> Adaptive:
    return make_policy("adaptive", {"host": CAPACITY}, lambda: clock[0], ghost_key=lambda c: c.key,
                       chains=KeyChains(1))


def test_the_default_switches_when_the_workload_changes():
    rng, clock = random.Random(0), [0]
    fresh = (f"new{i}" for i in range(10**9))
    policy = adaptive(clock)
    assert policy.live == "rf1" and policy.shadows.rate == 1.0  # the first candidate
    lives = drive(policy, frequency_phase(rng, fresh, 400), clock)
    assert lives[-1] not in ("lru", "rf1") and policy.switches >= 1  # counts: keep the hot keys
    switched = policy.switches
    lives = drive(policy, recency_phase(rng, fresh, 3000), clock)
    assert lives[-1] in ("lru", "rf1") and policy.switches > switched  # recency again
    stats = policy.stats()
    assert stats["live"] == lives[-1] and set(stats["why"]) == {"lru", "lfuda", "rf1", "rf4", "rf16"}


@pytest.mark.parametrize(("phase", "steps"), [(frequency_phase, 1500), (recency_phase, 8000)])
def test_the_default_does_not_flap_on_a_steady_workload(phase, steps):
    """Hysteresis: on traffic that does not change, a score left is never taken again, and
    the switches stop (near-equal candidates do not trade places)."""
    rng, clock = random.Random(1), [0]
    fresh = (f"new{i}" for i in range(10**9))
    policy = adaptive(clock)
    lives = drive(policy, phase(rng, fresh, steps), clock)
    chosen = [a for a, b in zip([None, *lives], lives) if a != b]
    assert len(chosen) == len(set(chosen)) <= 4  # no score chosen twice (no A -> B -> A)
    assert len(set(lives[len(lives) // 2:])) == 1  # none in the second half
