"""Client hints on the tree: retain (budget, priority, deadline, hits), release, pressure
pushing a retained prefix down a tier, no-ops, every refusal changing nothing, and random
operations with hints keeping every invariant."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache import HiCacheConfig, build
from hicache.config import EVICTION_POLICIES
from hicache.models import mha
from hicache.radix import HiRadixCache
from hicache.radix.hints import MAX_HINTS_PER_STEP, HintState
from hicache.radix.read import child_nodes
from hicache.replay.content import ContentModel
from tests.hicache.radix.test_cache import ALPHABET, BIG, OPS, PAGE, _tokens, seq, serve

PS = 4  # tokens per page


class Clock:
    """The hints' clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(device_pages: int = 8, ratio: float = 2.0, eviction: str = "lru", policy: str = "write_through",
         retained: float = 0.5):
    clock = Clock()
    config = HiCacheConfig(hicache_ratio=ratio or 1e-12, write_policy=policy, io_backend="torch",
                           eviction_policy=eviction, max_retained_ratio=retained, max_hint_ttl_s=3600.0)
    cache = build(mha(1, 1, 8, page_size=PS), device_pages * PS, config, device="cpu", budget=BIG, backend="torch")
    return cache, HiRadixCache(cache, host_tier=ratio > 0, clock=clock), clock


def put(cache, tree, first: int, pages: int) -> np.ndarray:
    """Insert ``pages`` fresh pages (evicting when the device is short) and back them up."""
    tokens = seq(first, pages, PS)
    kv = cache.device_pools["kv"]
    slots = kv.alloc(tokens.size)
    if slots is None:
        tree.evict(tokens.size - kv.available())
        slots = kv.alloc(tokens.size)
    tree.insert(tokens, slots)
    tree.wait()
    return tokens


def on_device(tree, tokens) -> int:
    return tree.match_prefix(tokens).device_hit_length


def state(tree) -> tuple:
    """What a refusal must not change: every node's tiers and the book's retains and marks."""
    nodes, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        nodes.append((n.end, n.num_tokens, n.device is not None, n.host is not None, n.lock_ref))
        stack.extend(child_nodes(n))
    book = tree._hints.book
    return sorted(nodes), {n.id: (r.priority, r.deadline) for n, r in book.retains.items()}, dict(book.released)


@pytest.mark.parametrize("eviction", EVICTION_POLICIES)
def test_a_retained_prefix_survives_pressure_that_evicts_it_without(eviction):
    for hinted in (False, True):
        cache, tree, clock = make(eviction=eviction)
        # 1. A (2 pages), then a retain on it for 60 s (budget: half of 8 device pages)
        a = put(cache, tree, 0, 2)
        if hinted:
            ticket = tree.hint(a, "retain", ttl_s=60, priority=10)
            assert ticket.state is HintState.ACCEPTED and ticket.tokens == 2 * PS
        # 2. newer prefixes fill the device and push past it: 10 pages through 8
        for i in range(5):
            put(cache, tree, 100 * (i + 1), 2)
        # 3. A is on the device only when it was retained (every order drops it first: the
        #    oldest of prefixes hit as often)
        assert (on_device(tree, a) == 2 * PS) == hinted
        tree.check_integrity()


def test_a_retain_ends_at_its_deadline_and_each_hit_restarts_it():
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    ticket = tree.hint(a, "retain", ttl_s=10)
    # 1. t=6: a request hits A; the poll of that step sees it
    clock.now = 6
    tree.match_prefix(a)
    tree.poll()
    # 2. t=12: past the first deadline (10) but not past the hit's (16)
    clock.now = 12
    tree.poll()
    assert ticket.state is HintState.ACCEPTED
    # 3. t=17: expired, and A is an ordinary prefix again
    clock.now = 17
    tree.poll()
    assert ticket.state is HintState.EXPIRED and "expired" in ticket.reason
    assert not tree._hints.book.retains
    tree.check_integrity()


def test_over_the_budget_refuses_or_displaces_a_lower_priority():
    cache, tree, clock = make()  # budget: 4 device pages, 8 host pages
    a, b, c = put(cache, tree, 0, 3), put(cache, tree, 100, 3), put(cache, tree, 200, 2)
    first = tree.hint(a, "retain", ttl_s=60, priority=20)
    # 1. B at the same priority does not fit beside A: refused, nothing changes
    before = state(tree)
    same = tree.hint(b, "retain", ttl_s=60, priority=20)
    assert same.state is HintState.REFUSED and "budget" in same.reason and "\n" not in same.reason
    assert state(tree) == before
    # 2. at a higher priority B displaces A (its ticket says by which hint)
    higher = tree.hint(b, "retain", ttl_s=60, priority=70)
    assert higher.state is HintState.ACCEPTED
    assert first.state is HintState.EXPIRED and f"hint {higher.id}" in first.reason
    # 3. a later hint changes A's priority: now it displaces B in turn
    again = tree.hint(a, "retain", ttl_s=60, priority=90)
    assert again.state is HintState.ACCEPTED and higher.state is HintState.EXPIRED
    # 4. C (2 pages) does not fit beside A's 3 at any lower priority
    assert tree.hint(c, "retain", ttl_s=60, priority=89).state is HintState.REFUSED
    tree.check_integrity()


def test_a_retain_replaced_by_a_later_one_of_the_same_prefix():
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    old = tree.hint(a, "retain", ttl_s=60, priority=5)
    new = tree.hint(a, "retain", ttl_s=5, priority=50)
    assert old.state is HintState.EXPIRED and "replaced" in old.reason and new.state is HintState.ACCEPTED
    clock.now = 6
    tree.poll()
    assert new.state is HintState.EXPIRED  # the later one's deadline holds


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective"])
def test_a_retained_page_a_running_request_needs_goes_down_a_tier(policy):
    cache, tree, clock = make(policy=policy, retained=1.0)  # everything may be retained
    prefixes = [put(cache, tree, 100 * i, 2) for i in range(4)]  # the device is full
    tickets = [tree.hint(p, "retain", ttl_s=60, priority=10 * (i + 1)) for i, p in enumerate(prefixes)]
    assert all(t.state is HintState.ACCEPTED for t in tickets)
    # 1. a request needs 2 pages: the lowest priority's pages go to the host (backed up
    #    first where the policy had not), never dropped; its ticket says so
    assert tree.evict(2 * PS) == 2 * PS
    m = tree.match_prefix(prefixes[0])
    assert (m.device_hit_length, m.host_hit_length) == (0, 2 * PS)
    assert tickets[0].state is HintState.ACCEPTED and "went down from the device to the host" in tickets[0].notes[0]
    assert all(on_device(tree, p) == 2 * PS for p in prefixes[1:])
    tree.check_integrity()


def test_without_a_tier_below_a_retained_page_is_never_dropped():
    cache, tree, clock = make(ratio=0, retained=1.0)
    prefixes = [put(cache, tree, 100 * i, 2) for i in range(4)]
    for p in prefixes:
        tree.hint(p, "retain", ttl_s=60)
    assert tree.evict(2 * PS) == 0  # the device stays short; the retained pages stay
    assert all(on_device(tree, p) == 2 * PS for p in prefixes)


def test_a_released_prefix_goes_first_until_it_is_hit():
    cache, tree, clock = make(ratio=0)
    a, b, c = put(cache, tree, 0, 2), put(cache, tree, 100, 2), put(cache, tree, 200, 2)
    # 1. C, the most recent, is released: it goes before A (the least recent)
    assert tree.hint(c, "release").state is HintState.DONE
    assert tree.evict(2 * PS) == 2 * PS
    assert on_device(tree, c) == 0 and on_device(tree, a) == 2 * PS
    # 2. B is released, then hit: the hit clears the release (LRU again: A goes first)
    tree.hint(b, "release")
    tree.match_prefix(b)
    tree.evict(2 * PS)
    assert on_device(tree, a) == 0 and on_device(tree, b) == 2 * PS
    tree.check_integrity()


def test_a_release_ends_the_retains_through_its_prefix_and_stops_below_a_shorter_one():
    cache, tree, clock = make(ratio=0)
    system = put(cache, tree, 0, 1)
    a = np.concatenate([system, seq(50, 2, PS)])
    tree.insert(a, np.concatenate([tree.match_prefix(a).device_slots.numpy(),
                                   cache.device_pools["kv"].alloc(2 * PS).numpy()]))
    kept = tree.hint(system, "retain", ttl_s=60, priority=1)  # the system prompt, kept
    retain = tree.hint(a, "retain", ttl_s=60)
    # 1. the release ends A's retain, not the system prompt's; only A's own pages are marked
    release = tree.hint(a, "release")
    assert retain.state is HintState.EXPIRED and f"hint {release.id}" in retain.reason
    assert kept.state is HintState.ACCEPTED and tree.counters["hints_released_tokens"] == 2 * PS
    # 2. pressure: A's pages go, the system prompt stays
    put(cache, tree, 100, 7)
    assert on_device(tree, a) == PS


@pytest.mark.parametrize("action,kw", [("retain", {"ttl_s": 5}), ("release", {}), ("demote", {}),
                                       ("prefetch", {"to": "host"}), ("prefetch", {})])
def test_a_hint_on_an_unknown_prefix_is_a_reported_noop(action, kw):
    cache, tree, clock = make()
    put(cache, tree, 0, 2)
    before = state(tree)
    ticket = tree.hint(seq(900, 2, PS), action, **kw)
    assert ticket.state is HintState.DONE and ticket.noop and "no-op" in ticket.reason
    assert state(tree) == before


REFUSALS = [
    (("bogus",), {}, "action: must be one of retain, demote, prefetch, persist, release"),
    (("retain",), {}, "ttl_s: a retain needs one"),
    (("retain",), {"ttl_s": 3601}, "ttl_s: must be in (0, 3600] seconds (--hicache-max-hint-ttl)"),
    (("retain",), {"ttl_s": -1}, "ttl_s: must be in (0, 3600]"),
    (("retain",), {"ttl_s": float("nan")}, "ttl_s: must be in"),
    (("retain",), {"ttl_s": True}, "ttl_s: must be a number of seconds"),
    (("retain",), {"ttl_s": 5, "priority": 101}, "priority: must be an integer in [0, 100]"),
    (("retain",), {"ttl_s": 5, "priority": 2.5}, "priority: must be an integer"),
    (("retain",), {"ttl_s": 5, "to": "host"}, "to: a retain takes ttl_s, priority"),
    (("demote",), {"ttl_s": 5}, "ttl_s: a demote takes no argument"),
    (("prefetch",), {"to": "disk"}, "to: must be one of device, host"),
    (("persist",), {}, "persist: not available here (no storage tier)"),
]


@pytest.mark.parametrize("args,kw,message", REFUSALS)
def test_every_refused_hint_says_why_in_one_line_and_changes_nothing(args, kw, message):
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    tree.hint(put(cache, tree, 100, 2), "retain", ttl_s=5)
    before = state(tree)
    ticket = tree.hint(a, *args, **kw)
    assert ticket.state is HintState.REFUSED and message in ticket.reason and "\n" not in ticket.reason
    assert ticket.as_dict()["reason"] == ticket.reason
    assert state(tree) == before
    tree.check_integrity()


ENVELOPES = [
    ([1, 2], "hints: must be a JSON object"),
    ({"retian_s": 5}, "hints: unknown key 'retian_s'; allowed: version, retain_s"),
    ({"version": 2, "release": True}, "hints.version: this server speaks version 1"),
    ({"retain_s": 5, "release": True}, "retain_s and release contradict"),
    ({"demote": True, "prefetch": "device"}, "demote and prefetch \"device\" contradict"),
    ({"release": "yes"}, "hints.release: must be true or false"),
    ({"priority": 5}, "hints.priority: goes with retain_s"),
    ({"retain_s": 10 ** 6}, "hints.retain_s: must be in (0, 3600]"),
    ({"tokens": 0, "release": True}, "hints.tokens: must be an integer >= 1"),
    ({}, "hints: no action"),
]


@pytest.mark.parametrize("envelope,message", ENVELOPES)
def test_a_malformed_envelope_is_one_refusal_and_changes_nothing(envelope, message):
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    before = state(tree)
    tickets = tree.hint_envelope(a, envelope)
    assert len(tickets) == 1 and tickets[0].state is HintState.REFUSED and message in tickets[0].reason
    assert state(tree) == before


def test_an_envelope_applies_each_action_to_its_tokens():
    cache, tree, clock = make()
    a = np.concatenate([put(cache, tree, 0, 2), seq(50, 1, PS)])
    more = cache.device_pools["kv"].alloc(PS).numpy()
    tree.insert(a, np.concatenate([tree.match_prefix(a).device_slots.numpy(), more]))
    tree.wait()
    # 1. the first 5 tokens: one page (the partial one is dropped), in use below: not demoted
    retain, demote = tree.hint_envelope(a, {"retain_s": 30, "priority": 7, "demote": True, "tokens": 5})
    assert (retain.action, retain.tokens, demote.action, demote.state) == ("retain", PS, "demote", HintState.REFUSED)
    # 2. all 3 pages: retained, then off the device, on the host, but for the first page
    #    (still retained on its own: a demote stops below a shorter retained prefix)
    retain, demote = tree.hint_envelope(a, {"retain_s": 30, "priority": 7, "demote": True})
    assert retain.tokens == 3 * PS and demote.wait() is HintState.DONE
    m = tree.match_prefix(a)
    assert (m.device_hit_length, m.host_hit_length) == (PS, 2 * PS) and retain.state is HintState.ACCEPTED
    tree.check_integrity()


def test_a_flood_of_hints_is_refused_past_the_step_allowance():
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    tickets = [tree.hint(a, "release") for _ in range(MAX_HINTS_PER_STEP + 3)]
    assert [t.state for t in tickets[-3:]] == [HintState.REFUSED] * 3 and "scheduler step" in tickets[-1].reason
    tree.poll()  # the next step: a new allowance
    assert tree.hint(a, "release").state is HintState.DONE


def test_callbacks_hear_every_change_and_a_raising_one_does_not_stop_the_tree():
    cache, tree, clock = make()
    a = put(cache, tree, 0, 2)
    seen = []
    ticket = tree.hint(a, "retain", ttl_s=1)
    ticket.add_callback(lambda t: seen.append(t.state))
    ticket.add_callback(lambda t: 1 / 0)  # logged, never the scheduler's failure
    assert ticket.wait() is HintState.ACCEPTED  # a retain is in force at once
    clock.now = 2
    tree.poll()
    assert seen == [HintState.EXPIRED] and not tree._hints.book.retains
    late = []
    ticket.add_callback(late.append)  # a final ticket calls back at once
    assert late == [ticket]


def test_capabilities_list_the_actions_and_the_limits():
    cache, tree, clock = make(ratio=0)
    caps = tree.capabilities()
    assert caps["actions"] == ["retain", "release"]
    assert set(caps["unavailable"]) == {"demote", "prefetch", "persist"}
    assert caps["limits"]["max_retained_ratio"] == 0.5 and caps["limits"]["max_ttl_s"] == 3600.0


HINT_OPS = st.one_of(
    OPS,
    st.tuples(st.just("retain"), st.tuples(st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=6),
                                           st.integers(1, 20), st.integers(0, 100))),
    st.tuples(st.sampled_from(["release", "demote", "prefetch"]),
              st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=6)),
    st.tuples(st.just("tick"), st.integers(1, 15)),
)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
       eviction=st.sampled_from(EVICTION_POLICIES), ops=st.lists(HINT_OPS, min_size=1, max_size=14))
def test_random_operations_with_hints_keep_every_invariant(policy, eviction, ops):
    clock = Clock()
    config = HiCacheConfig(hicache_ratio=2.0, write_policy=policy, io_backend="torch", eviction_policy=eviction)
    cache = build(mha(1, 1, 2, page_size=PAGE), 6 * PAGE, config, device="cpu", budget=BIG, backend="torch")
    tree = HiRadixCache(cache, clock=clock)
    content, book = ContentModel(cache), tree._hints.book
    for op, arg in ops:
        if op == "retain":
            tree.hint(_tokens(arg[0]), "retain", ttl_s=arg[1], priority=arg[2])
        elif op in ("release", "demote", "prefetch"):
            tree.hint(_tokens(arg), op).wait(timeout_s=30)
        elif op == "tick":
            clock.now += arg
            tree.poll()
        elif op == "serve":  # every byte of a served prefix is checked
            serve(cache, tree, content, _tokens(arg))
        elif op in ("evict", "evict_host"):
            getattr(tree, op)(arg * PAGE)
        tree.wait()
        tree.check_integrity()
        used = book.allotment().used
        assert all(used[t] <= book.budget[t] for t in used), (used, book.budget)
        assert not tree._hints.work.jobs  # every async hint ended (DONE or REFUSED)
        stack = [tree.root]
        while stack:  # no lock left behind (the root's own one aside)
            n = stack.pop()
            assert n.lock_ref == (1 if n.is_root else 0), n
            stack.extend(child_nodes(n))
