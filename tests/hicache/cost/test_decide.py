"""The load gate: the cut that pays, against trying every page, a slow store, backlog, snapshots.

The store reads at 0.5 GB/s; the model is a dense MHA decoder (Llama-3.1-8B's compute, one
128-dim KV head per layer: 16 KiB per token), so a storage hit costs ~33 us a token to
read while recomputing a token costs ~24 us plus attention that grows with its context:
near the start of a prompt recomputing wins, deep into a long one reading does.
"""
from __future__ import annotations

import random

import pytest

from hicache.cost import Footprint, LoadCost, LoadGate, PrefillModel, Store, load_profile
from hicache.cost.links import LinkClocks
from hicache.models.shape import dense_shape

PAGE = 64
H100 = load_profile("h100")
SLOW_STORE = Store(read_gbps=0.5, write_gbps=0.5, read_latency_s=0.001, write_latency_s=0.001)
MHA = dense_shape("mha-1kv", 32, 4096, 32, 1, 128, 14336, 128256)


def gate(backlog=None, hybrid=False, store=SLOW_STORE) -> LoadGate:
    cost = LoadCost(PrefillModel(MHA, H100.prefill), Footprint(32 * 2 * 128 * 2, 5 << 20), H100.h2d, store,
                    hybrid=hybrid)
    return LoadGate(cost, PAGE, backlog or (lambda link: 0.0))


def brute(g: LoadGate, prompt: int, start: int, host_end: int, last: int) -> float:
    return min(g.cost.seconds(prompt, start, k, host_end) for k in range(start, last + 1, PAGE))


def test_the_gate_equals_trying_every_page():
    g, rng = gate(), random.Random(1)
    for _ in range(150):
        pages = rng.randrange(1, 600)
        start = rng.randrange(pages + 1) * PAGE
        host_end = rng.randrange(start // PAGE, pages + 1) * PAGE
        last = rng.randrange(host_end // PAGE, pages + 1) * PAGE
        cut = g.choose(pages * PAGE, start, host_end, last)
        assert cut.seconds == pytest.approx(brute(g, pages * PAGE, start, host_end, last), rel=1e-12)
        assert cut.seconds <= min(cut.always_s, cut.never_s) and start <= cut.end <= last and cut.end % PAGE == 0


def test_the_shortcut_gives_the_same_end_as_weighing_every_candidate():
    rng, waits = random.Random(2), {"h2d": 0.0}
    g = gate(lambda link: waits.get(link, 0.0))
    for _ in range(300):
        pages = rng.randrange(1, 2000)
        start = rng.randrange(pages + 1) * PAGE
        host_end = rng.randrange(start // PAGE, pages + 1) * PAGE
        waits["h2d"] = rng.choice((0.0, 0.0, 0.01, 1.0))
        assert g.end(pages * PAGE, start, host_end) == g.choose(pages * PAGE, start, host_end).end


def test_a_slow_store_is_recomputed_near_the_start_and_read_deep_into_a_long_prompt():
    g = gate()
    short = g.choose(4096, 0, 0, 4096 - PAGE)  # the whole prompt but a page in storage
    assert short.end == 0 and short.never_s < short.always_s
    deep = g.choose(65536 + 4096, 65536, 65536, 65536 + 4096 - PAGE)  # 64k tokens on the device first
    assert deep.end == 65536 + 4096 - PAGE and deep.always_s < deep.never_s
    # the host tier alone (44 GB/s) pays at once
    assert g.choose(4096, 0, 4096 - PAGE).end > 3000


def test_a_backlog_on_the_link_can_turn_a_load_into_a_recompute():
    queued = {"h2d": 0.0}
    g = gate(lambda link: queued.get(link, 0.0))
    assert g.choose(8192, 0, 8192 - PAGE).end > 8000
    queued["h2d"] = 10.0  # ten seconds of loads ahead on the link
    cut = g.choose(8192, 0, 8192 - PAGE)
    assert cut.end == 0 and cut.never_s < cut.always_s


def test_with_snapshot_cuts_only_those_are_chosen():
    g = gate(hybrid=True, store=None)
    allowed = [1024, 2048, 4096]
    for prompt in (4160, 20000, 100000):
        cut = g.choose(prompt, 512, 4096, None, allowed)
        assert cut.end in (512, *allowed)
    # a cut that loads nothing past the device is always allowed; one past what was found never
    assert g.choose(100000, 512, 4096, None, [8192]).end == 512


def test_the_rest_at_its_floor_is_recomputed_rather_than_loaded():
    # a short rest costs the floor (reading the weights once) whatever its length: up to
    # that floor recomputing the tail of a hit is free, loading it is not
    g = gate()
    cut = g.choose(8192, 0, 8192 - PAGE)
    assert 0 < cut.end < 8192 - PAGE and cut.seconds < cut.always_s < cut.never_s
    prefill = g.cost.prefill
    assert prefill.seconds(8192 - cut.end, cut.end) == prefill.floor_s  # the rest at the floor ...
    assert prefill.seconds(8192 - cut.end + PAGE, cut.end - PAGE) > prefill.floor_s  # ... a page more is not


def test_link_clocks_queue_in_arrival_order():
    clocks = LinkClocks()
    assert clocks.occupy("h2d", 0.0, 2.0) == 2.0
    assert clocks.occupy("h2d", 1.0, 1.0) == 3.0  # waits for the first
    clocks.now = 2.5
    assert clocks.backlog("h2d") == 0.5 and clocks.backlog("storage") == 0.0
    assert clocks.occupy("d2h", 1.0, 1.0) == 2.0  # another link: no wait
