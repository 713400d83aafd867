"""Smoke test: the storage benchmark runs end to end for the file backend and writes its JSON."""
from __future__ import annotations

import json

from bench import storage


def test_bench_runs_and_writes_json(tmp_path):
    out = tmp_path / "storage_test.json"
    assert storage.main(["--backends", "file", "--pools", "dsv4:c128_kv,dsv4:c4_indexer", "--batch-pages", "2",
                         "--budget-mb", "1", "--dir", str(tmp_path / "scratch"), "--out", str(out),
                         "--profile-out", str(tmp_path / "profile.json")]) == 0  # the profile too: in tmp_path
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert doc["config"]["layout"] == "page_first" and len(rows) == 2 * 2  # 2 pools x (set, get)
    assert {(r["pool"], r["op"]) for r in rows} == {(p, o) for p in ("dsv4:c128_kv", "dsv4:c4_indexer") for o in ("set", "get")}
    assert all(r["GBps"] > 0 and r["raw_GBps"] > 0 and r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert all(10 <= r["reps"] <= 50 for r in rows)
