"""`hicache replay`: real transfers, content checked byte for byte, hit rates, bad traces."""
from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pytest

from hicache import HiCacheConfig, build
from hicache.cli import main
from hicache.models import preset
from hicache.replay import JSON_KEYS
from hicache.replay.content import ReplayMismatch
from hicache.replay.run import Replayer
from hicache.replay.builtin import chat_workload
from hicache.replay.workload import load_trace, parse_line
from host_pools.memory import HostBudget

TRACE = Path(__file__).resolve().parents[3] / "data" / "mooncake_synthetic_trace.jsonl.xz"  # shipped
BIG = HostBudget(1 << 40, None, 0, 1, 1 << 40)
GOOD = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}'


def replay_json(capsys, *argv: str) -> list[dict]:
    assert main(["replay", "--json", "--no-progress", *argv]) == 0
    return json.loads(capsys.readouterr().out)["runs"]


def test_trace_slice_has_no_mismatch_and_hit_rate_rises_with_ratio(tmp_path, capsys):
    # lines 3801-3950: sessions that reuse each other's prefixes (~55% with an infinite cache)
    lines = lzma.decompress(TRACE.read_bytes()).decode().splitlines()[3800:3950]
    trace = tmp_path / "slice.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    plot = tmp_path / "hit.png"
    assert main(["replay", "--trace", str(trace), "--model", "deepseek-v4-flash", "--layers", "4",
                 "--device-tokens", "131072", "--hicache-ratio", "1,2,4", "--json", "--no-progress",
                 "--plot", str(plot)]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["hicache_ratio"] for r in runs] == [0, 1, 2, 4]
    assert all(tuple(r) == JSON_KEYS for r in runs)
    assert all(r["mismatches"] == 0 for r in runs)
    hits = [r["hit_rate"] for r in runs]
    # under write-through a host as large as the device only mirrors it: no gain at ratio 1
    assert hits[0] <= hits[1] < hits[2] < hits[3]
    assert runs[0]["host_hit_rate"] == 0 and runs[0]["bytes_d2h"] == 0
    assert runs[3]["bytes_h2d"] > 0 and plot.stat().st_size > 0
    for r in runs:
        assert r["hit_rate"] == pytest.approx(r["device_hit_rate"] + r["host_hit_rate"])
        assert r["tokens_recomputed"] == round(r["tokens_total"] * (1 - r["hit_rate"]))


@pytest.mark.parametrize("policy,layout,backend", [
    ("write_through", "page_first", "torch"),
    ("write_through_selective", "layer_first", "copy_engine"),
    ("write_back", "page_first", "auto"),
])
def test_chat_workload_every_policy_loads_back_exact_bytes(capsys, policy, layout, backend):
    runs = replay_json(capsys, "--max-requests", "60", "--device-tokens", "8192", "--hicache-ratio", "4",
                       "--hicache-write-policy", policy, "--hicache-mem-layout", layout,
                       "--hicache-io-backend", backend)
    base, hier = runs
    assert base["mismatches"] == hier["mismatches"] == 0
    assert hier["host_hit_rate"] > 0 and hier["bytes_h2d"] > 0
    assert hier["hit_rate"] > base["hit_rate"]


def test_triton_backend_tiny(capsys):
    runs = replay_json(capsys, "--max-requests", "10", "--device-tokens", "2048", "--hicache-ratio", "4",
                       "--layers", "1", "--seed", "3", "--hicache-io-backend", "triton")
    assert runs[1]["mismatches"] == 0 and runs[1]["host_hit_rate"] > 0


def test_corrupted_host_copy_is_caught():
    stack = preset("deepseek-v3", 1)
    cache = build(stack, 4096, HiCacheConfig(hicache_ratio=4, io_backend="torch"), device="cpu", budget=BIG)
    replayer = Replayer(cache, 4.0)
    start_loading = cache.controller.start_loading

    def corrupt_then_load():
        cache.host_group.pools["kv"].buffer.bitwise_not_()  # every host byte flips
        return start_loading()

    cache.controller.start_loading = corrupt_then_load
    with pytest.raises(ReplayMismatch, match=r"request \d+: loaded tokens .* pool 'kv' layer 0"):
        replayer.run(chat_workload(0)[:80])
    assert replayer.stats.mismatches == 1


def test_mismatch_exits_nonzero_with_a_clear_message(monkeypatch, capsys):
    import hicache.replay.cli as replay_mod

    def broken(*args, **kwargs):
        raise ReplayMismatch("request 7: loaded tokens [0, 64): pool 'kv' layer 0 buffer 'kv': unit 0 ...")

    monkeypatch.setattr(replay_mod, "replay_one", broken)
    assert main(["replay", "--max-requests", "2", "--no-progress"]) == 1
    assert "MISMATCH: request 7" in capsys.readouterr().err


BAD_LINES = {
    "missing field": ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field"),
    "string length": ('{"timestamp": 0, "input_length": "12", "output_length": 1, "hash_ids": [1]}',
                      "'input_length' must be an integer"),
    "float length": ('{"timestamp": 0, "input_length": 12.5, "output_length": 1, "hash_ids": [1]}',
                     "'input_length' must be an integer"),
    "negative length": ('{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}',
                        "'output_length' must be >= 0"),
    "blocks too short": ('{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
                         "2 hash_ids cover 1024 tokens, fewer than input_length=1025"),
    "bad hash_ids": ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}',
                     "'hash_ids' must be a list of integers in [0, 2^64)"),
    "not json": ("{timestamp: 0", "not valid JSON"),
    # 2^64 used to pass the parser and crash the replay in numpy (OverflowError)
    "hash id 2^64": ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [18446744073709551616]}',
                     "'hash_ids' must be a list of integers in [0, 2^64)"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_trace_line_names_its_line_and_replays_nothing(tmp_path, capsys, case):
    line, message = BAD_LINES[case]
    trace = tmp_path / "bad.jsonl"
    trace.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the bad line is line 3 (a blank line 2)
    assert main(["replay", "--trace", str(trace), "--json", "--no-progress"]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # nothing replayed, no partial results
    assert "line 3" in out.err and message in out.err


def test_parse_line_accepts_a_good_line():
    req = parse_line(GOOD, 1)
    assert (req.input_length, req.output_length, req.hash_ids) == (700, 5, (1, 2))


def test_shipped_trace_is_whole_and_compressed_traces_read_like_plain_ones(tmp_path):
    # issue 23 item 10: the trace ships in the repository (a clone needs nothing outside it)
    requests = load_trace(TRACE)
    assert len(requests) == 3993 and requests[0].input_length == 40160
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(f"{GOOD}\n{GOOD}\n".encode()))
    (tmp_path / "t.jsonl").write_text(f"{GOOD}\n{GOOD}\n")
    assert load_trace(tmp_path / "t.jsonl.gz") == load_trace(tmp_path / "t.jsonl")


@pytest.mark.parametrize("name, data", [("cut.jsonl.xz", lzma.compress(GOOD.encode())[:-9]),
                                        ("not.jsonl.xz", b"plain text"), ("not.jsonl.gz", b"plain text")])
def test_a_damaged_compressed_trace_is_one_line_naming_the_flag(tmp_path, capsys, name, data):
    (tmp_path / name).write_bytes(data)
    assert main(["replay", "--trace", str(tmp_path / name), "--json", "--no-progress"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "--trace" in out.err, out.err


@pytest.mark.gpu
@pytest.mark.parametrize("model, layers, backend", [
    ("deepseek-v3", "1", "auto"),
    ("deepseek-v4-flash", "4", "triton"),  # every pool family, hybrid snapshots
    ("llama-3.1-8b-int8", "2", "copy_engine"),  # a separate scale buffer
])
def test_cuda_replay_loads_back_exact_bytes(capsys, model, layers, backend):
    # pools on the GPU, slots from the tree on the CPU: fills and checks must run on the
    # pools' device (index_copy_ / index_select / equal used to mix devices and raise)
    runs = replay_json(capsys, "--device", "cuda", "--model", model, "--layers", layers,
                       "--hicache-io-backend", backend, "--max-requests", "40", "--device-tokens", "8192",
                       "--hicache-ratio", "4")
    base, hier = runs
    assert base["mismatches"] == hier["mismatches"] == 0
    # the same deterministic workload on CPU gives these hit rates (host hits > 0.1)
    assert hier["host_hit_rate"] > 0.1 and hier["bytes_h2d"] > 0 and hier["hit_rate"] > base["hit_rate"]
