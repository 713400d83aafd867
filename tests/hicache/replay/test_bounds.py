"""The replay's bounds (`hicache.replay.bounds`): known values on hand-made traces, each bound
against a brute-force oracle on small random traces, block names against the tokens."""
from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest

from hicache.replay.bounds import TraceBounds, block_ids
from hicache.replay.builtin import WORKLOADS
from hicache.replay.content import prefix_hashes
from hicache.replay.workload import BLOCK_TOKENS, Request, request_tokens


def req(*ids: int, tokens: int | None = None) -> Request:
    return Request(0, len(ids) * BLOCK_TOKENS if tokens is None else tokens, 1, ids)


# ---------------------------------------------------------------- hand-made traces, known values


def test_a_one_off_prompt_between_two_reuses():
    # A = [1, 2], B = [3] (used once), A again; capacity 2 blocks of 512 tokens
    trace = [req(1, 2), req(3), req(1, 2)]
    b = TraceBounds(trace, BLOCK_TOKENS).at(2 * BLOCK_TOKENS)
    total = 5 * BLOCK_TOKENS
    # infinite: the second A finds both blocks
    assert b.infinite == 2 * BLOCK_TOKENS / total
    # LRU: B pushes out A's deeper block (a leaf before its parent): the second A finds 1
    assert b.lru == 1 * BLOCK_TOKENS / total
    # Belady: B's block is never used again, so it is not kept: the second A finds both
    assert b.belady == 2 * BLOCK_TOKENS / total


def test_a_cycle_larger_than_the_cache():
    # three one-block prompts in a cycle, twice; capacity 2: LRU always evicts the next one
    trace = [req(1), req(2), req(3)] * 2
    b = TraceBounds(trace, BLOCK_TOKENS).at(2 * BLOCK_TOKENS)
    assert b.infinite == pytest.approx(3 / 6)
    assert b.lru == 0
    assert b.belady == pytest.approx(2 / 6)  # keeps 1 and 2 through the first 3, bypassed


def test_prompts_counted_once_and_partial_pages_never_hit():
    # 700 tokens at page 256: two whole pages (512 tokens) can hit, the last 188 never
    trace = [req(1, 2, tokens=700), req(1, 2, tokens=700)]
    b = TraceBounds(trace, 256).at(1 << 20)
    assert b.infinite == b.lru == b.belady == pytest.approx(512 / 1400)


def test_a_shared_id_under_another_prefix_is_another_block():
    # block 2 after 1 and block 2 after 9 are different prefixes: the second prompt hits nothing
    assert TraceBounds([req(1, 2), req(9, 2)], BLOCK_TOKENS).at(1 << 20).infinite == 0
    # a longer prompt over the same prefix hits the shared part
    assert TraceBounds([req(1, 2), req(1, 2, 5)], BLOCK_TOKENS).at(1 << 20).infinite == pytest.approx(2 / 5)


def test_no_capacity_no_hits_and_an_empty_prompt():
    b = TraceBounds([req(1), req(1, tokens=0), req(1)], BLOCK_TOKENS)
    assert b.at(0).lru == b.at(0).belady == 0 and b.at(BLOCK_TOKENS - 1).belady == 0
    assert b.at(BLOCK_TOKENS).lru == b.at(BLOCK_TOKENS).belady == pytest.approx(1 / 2)


# ---------------------------------------------------------------- oracles


def prefix_pages(trace: list[Request], page_size: int) -> list[tuple]:
    """Each request's pages as the tree names them: the hash of every token up to the page."""
    return [tuple(prefix_hashes(t, page_size)) if (t := request_tokens(r, page_size)).size else ()
            for r in trace]


def optimal_hits(pages: list[tuple], capacity: int) -> int:
    """The most prefix-hit blocks any cache of ``capacity`` blocks gets: after each request it
    may keep any blocks it holds or has just seen, at most ``capacity`` (every choice tried)."""
    @functools.lru_cache(maxsize=None)
    def best(r: int, held: frozenset) -> int:
        if r == len(pages):
            return 0
        hit = next((i for i, p in enumerate(pages[r]) if p not in held), len(pages[r]))
        pool = sorted(held | set(pages[r]))
        keep = max((best(r + 1, frozenset(c)) for n in range(min(capacity, len(pool)) + 1)
                    for c in itertools.combinations(pool, n)), default=0)
        return hit + keep
    return best(0, frozenset())


def lru_oracle(pages: list[tuple], capacity: int) -> int:
    """Prefix-block LRU spelled out: every block stamped (request, depth), the oldest
    stamp (deepest first within a request) dropped until ``capacity`` remain."""
    stamp: dict = {}
    hits = 0
    for t, keys in enumerate(pages):
        hits += next((i for i, k in enumerate(keys) if k not in stamp), len(keys))
        for depth, k in enumerate(keys):
            stamp[k] = (t, -depth)
        while len(stamp) > capacity:
            del stamp[min(stamp, key=stamp.get)]
    return hits


def min_oracle(pages: list[tuple], capacity: int) -> int:
    """Belady's MIN block by block, spelled out: on a miss with a full cache, drop whichever of
    the cached blocks and the incoming one is next used furthest away (a linear scan)."""
    flat = [k for keys in pages for k in keys]
    nxt, later = [0] * len(flat), {}
    for i in range(len(flat) - 1, -1, -1):
        nxt[i], later[flat[i]] = later.get(flat[i], len(flat)), i
    due: dict = {}  # cached block -> its next use
    hits = 0
    for i, k in enumerate(flat):
        hits += k in due
        if capacity:
            due[k] = nxt[i]
            if len(due) > capacity:
                del due[max(due, key=due.get)]
    return hits


def infinite_oracle(pages: list[tuple]) -> int:
    seen: set = set()
    hits = 0
    for keys in pages:
        hits += next((i for i, k in enumerate(keys) if k not in seen), len(keys))
        seen.update(keys)
    return hits


def random_trace(rng: random.Random, n: int, ids: int, max_blocks: int) -> list[Request]:
    """Prompts over a few shared prefixes (ids from a small alphabet), lengths cut anywhere."""
    out = []
    for _ in range(n):
        blocks = tuple(rng.randrange(ids) for _ in range(rng.randint(1, max_blocks)))
        out.append(Request(0, rng.randint(1, len(blocks) * BLOCK_TOKENS), 1, blocks))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_belady_is_the_optimum_of_every_policy_on_small_traces(seed):
    rng = random.Random(seed)
    page = rng.choice([256, 512])
    trace = random_trace(rng, rng.randint(3, 6), 3, 2)
    pages = prefix_pages(trace, page)
    total = sum(r.input_length for r in trace)
    bounds = TraceBounds(trace, page)
    for capacity in range(0, 5):
        b = bounds.at(capacity * page)
        assert b.belady == pytest.approx(optimal_hits(pages, capacity) * page / total), (capacity, pages)
        assert b.lru == pytest.approx(lru_oracle(pages, capacity) * page / total), (capacity, pages)
        assert b.lru <= b.belady + 1e-12 and b.belady <= b.infinite + 1e-12
    assert bounds.infinite == pytest.approx(infinite_oracle(pages) * page / total)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("page", [64, 192, 512])
def test_runs_of_blocks_give_the_per_block_figures_on_larger_traces(seed, page):
    # 80 requests, long shared prefixes; 192 does not divide a 512-token block
    rng = random.Random(seed)
    trace = random_trace(rng, 80, 4, 8)
    pages = prefix_pages(trace, page)
    total = sum(r.input_length for r in trace)
    bounds = TraceBounds(trace, page)
    for capacity in (1, 7, 40, 10 ** 6):
        assert bounds.at(capacity * page).lru == pytest.approx(lru_oracle(pages, capacity) * page / total)
        assert bounds.at(capacity * page).belady == pytest.approx(min_oracle(pages, capacity) * page / total)
    assert bounds.infinite == pytest.approx(infinite_oracle(pages) * page / total)
    assert bounds.at(10 ** 6 * page).belady == pytest.approx(bounds.infinite)  # everything fits


@pytest.mark.parametrize("page", [64, 192, 256])
def test_block_ids_name_blocks_as_the_tree_does(page):
    # equal id <=> equal hash of all the tokens up to the page (the tree's key)
    trace = random_trace(random.Random(7), 60, 3, 6)
    ids = np.concatenate(block_ids(trace, page))
    hashes = [h for keys in prefix_pages(trace, page) for h in keys]
    assert len(ids) == len(hashes)
    by_id: dict = {}
    for i, h in zip(ids.tolist(), hashes):
        assert by_id.setdefault(i, h) == h
    assert len(by_id) == len(set(hashes))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_builtin_workloads_keep_the_order_lru_belady_infinite(name):
    bounds = TraceBounds(WORKLOADS[name].make(0), 64)
    rates = [bounds.at(c) for c in (8192, 32768, 131072)]
    assert all(b.lru <= b.belady <= b.infinite for b in rates)
    assert rates[0].belady <= rates[1].belady <= rates[2].belady  # more room never hurts MIN
