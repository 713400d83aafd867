"""Client hints in the vLLM plugin (`HostHints` over `HostBlockIndex`, no vLLM needed): a
request's envelope, retains that keep host chunks through pressure, releases, the budget,
deadlines, and every refusal in one line."""
from __future__ import annotations

import pytest

from hicache.integrations.vllm.hints import HostHints
from hicache.integrations.vllm.index import HostBlockIndex, Lookup
from hicache.radix.hints import HintState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(chunks: int = 8, ratio: float = 0.5):
    index = HostBlockIndex(chunks, 1, lambda key: 0)
    clock = Clock()
    return index, HostHints(index, ratio, 3600.0, clock=clock), clock


def store(index, hints, req: str, keys: list) -> None:
    """A request stores ``keys`` (evicting when the host is full), as the manager does."""
    plan = index.prepare_store(keys)
    assert plan is not None, keys
    hints.saw(req, plan.keys)
    index.complete_store(plan.keys)


def serve(index, hints, req: str, keys: list, envelope: dict | None = None) -> list[dict]:
    hints.start(req, {"hicache": envelope} if envelope is not None else None)
    store(index, hints, req, keys)
    report = hints.report(req)
    hints.finish(req)
    return report


def test_a_retained_request_keeps_its_host_chunks_through_pressure():
    for hinted in (False, True):
        index, hints, clock = make()
        # 1. request A stores 3 chunks; hinted, it asks for a 60 s retain
        report = serve(index, hints, "a", ["a1", "a2", "a3"], {"retain_s": 60, "priority": 5} if hinted else None)
        if hinted:
            assert report == [{"id": report[0]["id"], "action": "retain", "state": "accepted", "tokens": 3}]  # 1 token a chunk here
        # 2. other requests store 8 more chunks through an 8-chunk host
        for i in range(4):
            serve(index, hints, f"o{i}", [f"o{i}a", f"o{i}b"])
        # 3. A's chunks are on the host only when retained
        assert all((index.lookup(k) is Lookup.HIT) == hinted for k in ("a1", "a2", "a3"))
        index.check_integrity()


def test_a_retain_ends_at_its_deadline_unless_hit_and_then_its_chunks_can_go():
    index, hints, clock = make()
    report = serve(index, hints, "a", ["a1", "a2"], {"retain_s": 10})
    clock.now = 8
    hints.saw("b", ["a1"])  # a later request hits A: 10 s from now
    clock.now = 12
    hints.expire()
    assert hints.kept(0) == {"a1", "a2"}
    clock.now = 19
    hints.expire()
    assert hints.kept(0) == () and report[0]["state"] == "accepted"  # the report was the state then


def test_the_budget_refuses_a_retain_or_a_higher_priority_displaces_one():
    index, hints, clock = make()  # budget: 4 of 8 chunks
    serve(index, hints, "a", ["a1", "a2", "a3"], {"retain_s": 60, "priority": 10})
    same = serve(index, hints, "b", ["b1", "b2"], {"retain_s": 60, "priority": 10})
    assert same[0]["state"] == "refused" and "budget" in same[0]["reason"]
    higher = serve(index, hints, "c", ["c1", "c2"], {"retain_s": 60, "priority": 90})
    assert higher[0]["state"] == "accepted" and hints.kept(0) == {"c1", "c2"}


def test_a_release_makes_the_request_s_chunks_first_to_go():
    index, hints, clock = make()
    serve(index, hints, "old", ["o1", "o2"])
    report = serve(index, hints, "a", ["a1", "a2"], {"release": True})
    assert report[0]["state"] == "done"
    # 6 new chunks on a host with 4 free: the 2 released ones go, not the older ones
    plan = index.prepare_store(["n1", "n2", "n3", "n4", "n5", "n6"])
    assert set(plan.evicted) == {"a1", "a2"} and index.lookup("o1") is Lookup.HIT


@pytest.mark.parametrize("envelope,message", [
    ({"demote": True}, "demote: not available in vLLM (vLLM keeps its device blocks itself)"),
    ({"prefetch": "host"}, "prefetch: not available in vLLM"),
    ({"persist": True}, "persist: not available in vLLM (the plugin has no storage tier)"),
    ({"retain_s": 10 ** 5}, "hints.retain_s: must be in (0, 3600]"),
    ({"retian_s": 5}, "hints: unknown key 'retian_s'"),
    ("retain", "hints: must be a JSON object"),
])
def test_every_refusal_is_one_line_in_the_response_and_changes_nothing(envelope, message):
    index, hints, clock = make()
    report = serve(index, hints, "a", ["a1"], envelope)
    refused = [t for t in report if t["state"] == "refused"]
    assert len(refused) == 1 and message in refused[0]["reason"] and "\n" not in refused[0]["reason"]
    assert hints.kept(0) == ()


def test_vllm_kv_hints_envelope_carries_the_same_envelope():
    index, hints, clock = make()

    class Action:
        action_type, payload = "hicache", {"retain_s": 30}

    class Envelope:
        actions = [Action()]
    hints.start("a", None, Envelope())
    store(index, hints, "a", ["a1"])
    assert hints.report("a")[0]["state"] == "accepted" and hints.kept(0) == {"a1"}


def test_capabilities_name_what_vllm_takes():
    index, hints, clock = make()
    caps = hints.capabilities()
    assert caps["actions"] == ["retain", "release"] and set(caps["unavailable"]) == {"demote", "prefetch", "persist"}


def test_the_hint_limits_reach_the_plugin_as_extra_config_keys():
    import json

    from hicache import HiCacheConfig
    from hicache.integrations.vllm.config import SpecConfig, kv_transfer_config
    extra = json.loads(kv_transfer_config(HiCacheConfig(max_retained_ratio=0.25, max_hint_ttl_s=600)))
    extra = extra["kv_connector_extra_config"]
    assert (extra["max_retained_ratio"], extra["max_hint_ttl_s"]) == (0.25, 600)
    hi = SpecConfig.from_extra(extra).hicache
    assert (hi.max_retained_ratio, hi.max_hint_ttl_s) == (0.25, 600.0)
    defaults = json.loads(kv_transfer_config(HiCacheConfig()))["kv_connector_extra_config"]
    assert "max_retained_ratio" not in defaults and "max_hint_ttl_s" not in defaults
    with pytest.raises(ValueError, match=r"max_retained_ratio \(--hicache-max-retained-ratio\)"):
        SpecConfig.from_extra({"max_retained_ratio": 2})
