"""Client hints in `hicache replay`: the trace field, the agents-hinted workload, and a
sweep with and without hints (and wrong ones), byte-checked like any replay."""
from __future__ import annotations

import json

import pytest

from hicache.cli import main
from hicache.radix.hints import parse_envelope
from hicache.replay.hinted import agents_hinted_workload
from hicache.replay.hintplay import wrong_envelope
from hicache.replay.workload import TraceHint, load_trace

LINE = {"timestamp": 61250, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}


def write(tmp_path, *lines) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_a_trace_line_carries_envelopes_before_and_after_its_request(tmp_path):
    hinted = {**LINE, "hints": [{"when": "before", "prefetch": "device"}, {"retain_s": 45, "priority": 60}]}
    (req,) = load_trace(write(tmp_path, hinted))
    assert req.hints == (TraceHint("before", {"prefetch": "device"}),
                         TraceHint("after", {"retain_s": 45, "priority": 60}))
    (plain,) = load_trace(write(tmp_path, LINE))
    assert plain.hints == ()


@pytest.mark.parametrize("hints,message", [
    ({"retian_s": 5}, "line 1: hints: unknown key 'retian_s'"),
    ([{"when": "later", "release": True}], "line 1: hints.when: must be one of after, before"),
    ([{"release": True}] * 9, "line 1: hints: give one envelope or a list of 1 to 8, got 9"),
    (["release"], "line 1: hints: each must be a JSON object"),
])
def test_a_bad_hint_in_a_trace_is_one_line_naming_it(tmp_path, capsys, hints, message):
    path = write(tmp_path, {**LINE, "hints": hints})
    assert main(["replay", "--trace", path, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_the_agents_hinted_workload_sends_what_an_agent_framework_would():
    reqs = agents_hinted_workload(0)
    assert reqs == agents_hinted_workload(0) and [r.timestamp for r in reqs] == sorted(r.timestamp for r in reqs)
    envelopes = [h for r in reqs for h in r.hints]
    for h in envelopes:
        parse_envelope(h.envelope, max_ttl_s=86400)
    actions = {k for h in envelopes for k in h.envelope}
    assert {"retain_s", "priority", "demote", "prefetch", "persist", "release", "tokens"} <= actions
    assert sum(1 for h in envelopes if h.envelope.get("release")) == 40  # one per session
    assert any(not r.hints for r in reqs)  # other traffic, unhinted


def test_wrong_hints_swap_retains_and_releases():
    assert wrong_envelope({"retain_s": 9, "priority": 80, "demote": True}, 30) == {"release": True}
    assert wrong_envelope({"release": True}, 30) == {"retain_s": 30}
    assert wrong_envelope({"prefetch": "device"}, 30) == {"prefetch": "device"}


def test_a_sweep_with_without_and_with_wrong_hints(capsys):
    argv = ["replay", "--workload", "agents-hinted", "--max-requests", "40", "--device-tokens", "4096", "--layers",
            "1", "--hicache-ratio", "1", "--hicache-eviction-policy", "lru", "--hints", "off,on,wrong",
            "--no-progress", "--json"]
    assert main(argv) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["hicache_ratio"], r["hints"]) for r in runs] == [(0.0, "off"), (0.0, "on"), (0.0, "wrong"),
                                                                 (1.0, "off"), (1.0, "on"), (1.0, "wrong")]
    assert all(r["mismatches"] == 0 for r in runs)
    assert [r["hints_sent"] > 0 for r in runs] == [False, True, True] * 2
    on = runs[4]["hint_states"]
    assert on.get("done", 0) > 0 and on.get("refused", 0) > 0  # persists: no storage tier
