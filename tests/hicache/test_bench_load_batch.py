"""Smoke test: ``bench/load_batch.py`` quick mode runs end to end and writes its JSON
(tiny models, one batch per case; no timing is asserted)."""
from __future__ import annotations

import json

from bench import load_batch


def test_quick_mode_runs_every_part_and_writes_json(tmp_path):
    out = tmp_path / "load_batch.json"
    rows = load_batch.run(["--quick", "--batches", "1", "--pages", "1,2", "--ops", "1,2",
                           "--models", "deepseek-v4-pro:3,deepseek-v3:1", "--backends", "auto,dma",
                           "--layouts", "page_first", "--host-gib", "0.01", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["environment"]["device_type"] in ("cpu", "cuda") and len(doc["rows"]) == len(rows)
    # 2 models x 2 directions x 3 (pages, ops) cases x 2 backends
    assert len(rows) == 2 * 2 * 3 * 2
    for r in rows:
        assert r["bytes"] == sum(r["bytes_by_pool"].values()) > 0
        assert r["host_us"] > 0 and r["e2e_us"] >= r["host_us"] * (r["e2e_us"] > 0)
        assert r["GBps"] > 0 and r["limit_GBps"] > 0 and r["frac"] > 0
        assert {p["pool"] for p in r["per_pool"]} == set(r["bytes_by_pool"])
    v4 = [r for r in rows if r["model"].startswith("deepseek-v4-pro")]
    assert set(v4[0]["bytes_by_pool"]) >= {"swa", "c4_kv", "c128_kv"}


def test_null_mode_times_the_host_alone(tmp_path):
    out = tmp_path / "null.json"
    rows = load_batch.run(["--null", "--quick", "--batches", "1", "--pages", "2", "--ops", "1,2",
                           "--models", "deepseek-v4-pro:3", "--layouts", "page_first",
                           "--host-gib", "0.01", "--out", str(out)])
    assert {(r["backend"], r["mode"], r["ops"]) for r in rows} == {
        ("null", mode, ops) for mode in ("edge", "trusted") for ops in (1, 2)}
    assert all(r["host_us"] > 0 and "per_pool" not in r for r in rows)
