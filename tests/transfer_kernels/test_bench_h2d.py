"""Smoke test: the H2D benchmark runs end to end as ``run(argv)`` and writes its JSON."""
from __future__ import annotations

import json

from bench import h2d


def test_bench_runs_and_writes_json(tmp_path):
    out = tmp_path / "h2d_test.json"
    rows = h2d.run(["--pools", "v4_c128_kv,dsa", "--max-rows", "4", "--layers", "1",
                    "--reps", "1", "--backends", "torch,copy_engine,auto",
                    "--out", str(out), "--no-plot"])
    doc = json.loads(out.read_text())
    assert doc["environment"]["torch"] and doc["config"]["pools"] == ["v4_c128_kv", "dsa"]
    backends = {r["backend"] for r in rows}
    assert backends == {"memcpy", "torch", "copy_engine", "auto"}
    # 2 pools x 2 layouts x 2 directions x 2 batch sizes (1, 4) x 4 backends.
    assert len(rows) == 2 * 2 * 2 * 2 * 4
    assert all(r["GBps"] > 0 and r["p20_ms"] <= r["p50_ms"] <= r["p80_ms"] for r in rows)
