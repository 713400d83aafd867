"""`bench/host_dtype_replay.py`: at the same host bytes the int8 tier holds ~1.9x the tokens
of the bf16 one, and on a trace that returns to old prefixes it hits more, every loaded
page checked."""
from __future__ import annotations

import json

from bench import host_dtype_replay


def write_trace(path, prefixes=2, rounds=3):
    # each round revisits every prefix (4 blocks of 512 tokens): reuse at a long distance
    lines = []
    for r in range(rounds):
        for p in range(prefixes):
            hashes = [p * 10 + b for b in range(4)] + [1000 + r * 100 + p]
            lines.append(json.dumps({"timestamp": 0, "input_length": 5 * 512, "output_length": 1,
                                     "hash_ids": hashes}))
    path.write_text("\n".join(lines) + "\n")


def test_equal_host_bytes_int8_holds_more_and_hits_more(tmp_path, capsys):
    trace, out = tmp_path / "trace.jsonl", tmp_path / "replay.json"
    write_trace(trace)
    # a request is 2560 tokens; device: 1 of them; host (a mirror of the device, plus): 2 MB = 3904
    # bf16 tokens (1.5 requests) or 7552 int8 ones (3): a cycle of 2 prefixes fits only the int8 host
    argv = ["--trace", str(trace), "--device-tokens", "2560", "--hicache-size", "0.002",
            "--head-dim", "128", "--out", str(out)]
    assert host_dtype_replay.main(argv) == 0
    rows = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    bf16, int8 = rows["bf16 host"], rows["int8 host"]
    assert bf16["host_capacity_bytes"] <= 2_000_000 and int8["host_capacity_bytes"] <= 2_000_000
    assert 1.85 < int8["host_tokens"] / bf16["host_tokens"] < 1.95
    assert all(r["mismatches"] == 0 and r["transfers_failed"] == 0 for r in rows.values())
    assert rows["device only"]["host_hit_rate"] == 0
    assert int8["host_hit_rate"] > bf16["host_hit_rate"] and int8["hit_rate"] > bf16["hit_rate"]
    assert out.with_suffix(".png").exists() and "int8 host" in capsys.readouterr().out
