"""Smoke tests of ``bench/load_batch.py``: every mode runs end to end and writes its JSON
(tiny models, one batch per case; no timing is asserted). The same tests run with and
without CUDA; the CUDA-only columns are ``None`` on CPU."""
from __future__ import annotations

import json

import pytest
import torch

from bench import host_only, load_batch
from tests.transfer_kernels.pools import assert_unchanged, make_pool, snapshot
from transfer_kernels import AutoBackend, CopyEngineBackend, make_plan
from transfer_kernels.backends import auto_table, torch_ref

CUDA = torch.cuda.is_available()
SMALL = ["--quick", "--batches", "1", "--layouts", "page_first", "--host-gib", "0.01"]
DEVICE_ONLY = ("cmp_ratio", "compute_slowdown", "cmp_alone_GBps", "cmp_together_GBps", "bidir_x",
               "bidir_GBps")


def test_quick_mode_runs_every_part_and_writes_json(tmp_path):
    out = tmp_path / "load_batch.json"
    rows = load_batch.run(SMALL + ["--pages", "1,2", "--ops", "1,2", "--models",
                                   "deepseek-v4-pro:3,deepseek-v3:1", "--backends", "auto,dma",
                                   "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["environment"]["device_type"] == ("cuda" if CUDA else "cpu")
    assert len(doc["rows"]) == len(rows)
    # 2 models x 2 directions x 3 (pages, ops) cases x 2 backends, on CPU and CUDA alike
    assert len(rows) == 2 * 2 * 3 * 2
    for r in rows:
        assert r["bytes"] == sum(r["bytes_by_pool"].values()) > 0
        assert r["host_us"] > 0 and r["e2e_us"] >= r["host_us"]
        assert r["GBps"] > 0 and r["limit_GBps"] > 0 and r["oneshot_us"] > 0
        assert r["frac"] == pytest.approx(r["oneshot_us"] / r["e2e_us"])
        assert {p["pool"] for p in r["per_pool"]} == set(r["bytes_by_pool"])
        for key in DEVICE_ONLY:  # columns of every row: measured on CUDA, not applicable on CPU
            assert (isinstance(r[key], float) if CUDA else r[key] is None), key
    v4 = [r for r in rows if r["model"].startswith("deepseek-v4-pro")]
    assert set(v4[0]["bytes_by_pool"]) >= {"swa", "c4_kv", "c128_kv"}


def test_null_mode_times_the_host_alone(tmp_path):
    out = tmp_path / "null.json"
    rows = load_batch.run(["--null"] + SMALL + ["--pages", "2", "--ops", "1,2", "--models",
                                                "deepseek-v4-pro:3", "--out", str(out)])
    assert {(r["backend"], r["mode"], r["ops"]) for r in rows} == {
        ("null", mode, ops) for mode in ("edge", "trusted") for ops in (1, 2)}
    assert all(r["host_us"] > 0 and "per_pool" not in r and r["frac"] is None for r in rows)


def test_host_only_mode_prepares_without_device_calls(tmp_path, monkeypatch):
    def copied(*args, **kwargs):
        raise AssertionError("a device call (or its CPU stand-in) ran")

    monkeypatch.setattr(CopyEngineBackend, "_copy_job_cpu", copied)
    monkeypatch.setattr(torch_ref, "copy_rows_ref", copied)
    rows = load_batch.run(["--host-only"] + SMALL + ["--pages", "2", "--ops", "1,2", "--models",
                                                     "deepseek-v4-pro:3", "--out", str(tmp_path / "h.json")])
    names = ("auto", "triton", "dma", "copy_engine")
    assert {(r["backend"], r["mode"], r["ops"], r["dir"]) for r in rows} == {
        (n, mode, ops, d) for n in names for mode in ("edge", "trusted") for ops in (1, 2)
        for d in ("h2d", "d2h")}
    assert all(r["host_us"] > 0 and r["frac"] is None for r in rows)
    assert CopyEngineBackend._copy.__name__ == "_copy"  # the shim is gone after the run


@pytest.mark.parametrize("name", ["auto", "triton", "dma", "copy_engine", "torch"])
def test_host_only_shim_prepares_and_moves_nothing(gen, name):
    pool = make_pool(gen, 3, 12, [((40000,), torch.uint8), ((8,), torch.bfloat16)], "page_first",
                     device="cpu", pin=False)
    backend = host_only.make_backends([name])[name]
    before = snapshot(pool.device_table)
    plan = make_plan([(pool.host_table, pool.device_table, [1, 5, 6], [0, 2, 9])])
    with host_only.host_only():
        prepared = backend.prepare(plan, [[(0, 0)], [(0, 1), (0, 2)]])
        for g in range(prepared.num_groups):
            prepared.launch(g)
    assert_unchanged(pool.device_table, before)
    if name in ("dma", "copy_engine"):  # the pieces were built, the runtime call left out
        assert backend.pieces > 0 and backend.copies > 0
    if name == "auto":  # the seed's CUDA rule: 120 KB page spans are staged
        assert backend.inner["dma"].pieces > 0


def test_calibrate_writes_a_table_auto_can_load(tmp_path, monkeypatch):
    table = tmp_path / "table.json"
    rows = load_batch.run(["--calibrate"] + SMALL + ["--pages", "1", "--models", "deepseek-v4-pro:3",
                                                      "--out", str(tmp_path / "c.json"),
                                                      "--table-out", str(table),
                                                      "--profile-out", str(tmp_path / "profile.json")])
    got = auto_table.load(table)
    assert got.rules[len(got.rules) - len(auto_table.SEED.rules):] == auto_table.SEED.rules
    measured = got.rules[:len(got.rules) - len(auto_table.SEED.rules)]
    assert measured and {r.use for r in measured} <= set(auto_table.CHOICES["cuda" if CUDA else "cpu"])
    assert all(r["use"] in r["idle_us"] for r in rows)
    monkeypatch.setenv(auto_table.ENV, str(table))
    assert AutoBackend().table == got


@pytest.mark.gpu
def test_cuda_end_to_end_is_measured_to_completion(tmp_path):
    rows = load_batch.run(SMALL + ["--pages", "16", "--ops", "1", "--models", "deepseek-v4-pro:8",
                                   "--backends", "auto,triton", "--directions", "h2d",
                                   "--out", str(tmp_path / "g.json")])
    for r in rows:
        assert r["e2e_us"] >= r["host_us"] and ("gpu_us" not in r or r["gpu_frac"] > 0)
        assert r["bidir_x"] > 0 and r["cmp_ratio"] > 0


def test_int8_host_dtype_runs_and_host_only_converts_nothing(tmp_path, monkeypatch):
    """``--hicache-host-dtype int8``: every backend loads and backs up int8 pages (rows say
    so); with ``--host-only`` no conversion runs (the quant kernel's launches are left out
    at ``runtime.launch``, torch's reference conversion is patched out)."""
    from transfer_kernels.backends import quant_torch
    int8 = ["--hicache-host-dtype", "int8", "--pages", "1", "--ops", "1", "--models", "deepseek-v3:1"]
    rows = load_batch.run(SMALL + int8 + ["--no-extra", "--out", str(tmp_path / "q.json")])
    assert {r["host_dtype"] for r in rows} == {"int8"} and {r["dir"] for r in rows} == {"h2d", "d2h"}
    assert all(r["bytes"] > 0 for r in rows)

    def converted(*args, **kwargs):
        raise AssertionError("a conversion ran")
    monkeypatch.setattr(quant_torch, "convert_job", converted)
    monkeypatch.setattr("transfer_kernels.cuda.quant_kernel.run", converted)
    rows = load_batch.run(["--host-only"] + SMALL + int8 + ["--out", str(tmp_path / "h.json")])
    assert {r["backend"] for r in rows} == {"auto", "triton", "dma", "copy_engine"}


@pytest.mark.parametrize("flags, why", [
    (["--hicache-host-dtype", "int8", "--models", "deepseek-v4-pro:3"], "nothing to quantize"),
    (["--hicache-host-dtype", "int8", "--calibrate", "--models", "deepseek-v3:1"], "--calibrate"),
    (["--hicache-host-dtype", "fp8"], "invalid choice")])
def test_int8_mistakes_are_one_line(flags, why, capsys):
    with pytest.raises(SystemExit) as e:
        load_batch.run(SMALL + flags)
    assert e.value.code == 2 and why in capsys.readouterr().err
