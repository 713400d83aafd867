"""Sizing and `hicache plan`: per-pool rows and bytes, --hicache-size, --device-gib, CLI errors."""
from __future__ import annotations

import json

import pytest

from hicache.cli import main
from hicache.config import HiCacheConfig
from hicache.models import preset
from hicache.sizing import device_tokens_for_bytes, plan_sizes
from host_pools.memory import HostBudget
from host_pools.spec import PoolKind, PoolSpec, Stack

GIB = 1 << 30
PRO = ["plan", "--model", "deepseek-v4-pro", "--device-tokens", "1048576"]
POOL_KEYS = {"name", "kind", "source", "num_layers", "row_bytes", "device_rows", "device_bytes", "host_rows",
             "host_bytes", "host_row_bytes"}


def _budget(n: int = 1 << 50) -> HostBudget:
    return HostBudget(n, None, 0, 1, n)


def _json_plan(capsys, argv: list[str]) -> dict:
    code = main([*argv, "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == (0 if plan["fits"] else 1)  # whether it fits depends on this machine's memory
    return plan


def _root_unit_bytes(stack) -> int:
    """Host bytes of one allocation unit of every root together: an anchor page plus one SWA row."""
    total = 0
    for p in stack.data_pools():
        root = stack.root_of(p.name)
        unit = stack.page_size if root is stack.anchor else root.tokens_per_row
        total += p.row_bytes * p.num_layers * unit // p.tokens_per_row
    return total


# ---------------------------------------------------------------- the table


def test_plan_table_host_gib_add_up_to_the_total(capsys):
    code = main([*PRO, "--hicache-ratio", "2"])
    out = capsys.readouterr().out.splitlines()
    assert code == (0 if out[-1] == "host pools fit" else 1)
    # the pool rows sit between the two dashed rules, the total right after the second
    rules = [i for i, line in enumerate(out) if line and set(line) == {"-"}]
    assert len(rules) == 2
    rows = [line.split() for line in out[rules[0] + 1:rules[1]]]
    assert [r[0] for r in rows] == ["kv", "swa", "c4_kv", "c4_indexer", "c128_kv", "c4_state",
                                    "c4_indexer_state"]
    total = out[rules[1] + 1].split()
    assert total[0] == "total"
    host_gib = [float(r[-1]) for r in rows]
    # each figure is rounded to 3 decimals: the sum may drift by half a unit per row
    assert sum(host_gib) == pytest.approx(float(total[-1]), abs=0.0005 * (len(rows) + 1))
    assert float(total[-1]) > 0
    assert out[0].startswith("model deepseek-v4-pro, page 256 tokens, host/device ratio 2.000")
    assert "host budget:" in out[-2] and out[-1].startswith("host pools ")


# ---------------------------------------------------------------- --json


def test_plan_json_keys_and_totals(capsys):
    plan = _json_plan(capsys, [*PRO, "--hicache-ratio", "2"])
    assert set(plan) == {"pools", "host_bytes_total", "budget_bytes", "fits", "kv_bytes_per_token",
                         "host_kv_bytes_per_token", "state_bytes_per_snapshot", "state_interval"}
    assert plan["state_interval"] is None and set(plan["state_bytes_per_snapshot"]) == {"swa"}
    assert all(set(p) == POOL_KEYS for p in plan["pools"])
    assert plan["host_bytes_total"] == sum(p["host_bytes"] for p in plan["pools"])
    assert plan["fits"] == (plan["host_bytes_total"] <= plan["budget_bytes"])
    by_name = {p["name"]: p for p in plan["pools"]}
    assert by_name["kv"]["source"] is None and by_name["c4_state"]["source"] == "swa"
    for p in plan["pools"]:
        assert p["host_bytes"] == p["host_rows"] * p["num_layers"] * p["row_bytes"]
        assert p["device_bytes"] == p["device_rows"] * p["num_layers"] * p["row_bytes"]


@pytest.mark.parametrize("ratio", [2, 3])
def test_swa_host_rows_are_ratio_times_device_rows(capsys, ratio):
    by_name = {p["name"]: p for p in _json_plan(capsys, [*PRO, "--hicache-ratio", str(ratio)])["pools"]}
    # device: 1 Mi anchor tokens = 4096 pages; SWA gets 10 % of the tokens in rows of 128
    assert by_name["kv"]["device_rows"] == 1 << 20 and by_name["c4_kv"]["device_rows"] == 4096
    assert by_name["swa"]["device_rows"] == int(0.1 * (1 << 20)) // 128
    # host: the same ratio on both roots, sidecars follow their roots
    assert by_name["kv"]["host_rows"] == ratio << 20
    assert by_name["swa"]["host_rows"] == ratio * by_name["swa"]["device_rows"]
    for name in ("c4_kv", "c4_indexer", "c128_kv"):
        assert by_name[name]["host_rows"] == ratio * 4096
    for name in ("c4_state", "c4_indexer_state"):
        assert by_name[name]["host_rows"] == by_name["swa"]["host_rows"]


@pytest.mark.parametrize("model", ["qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "nemotron-h-8b"])
def test_hybrid_plan_shows_state_bytes_per_snapshot_beside_kv_bytes_per_token(capsys, model):
    argv = ["plan", "--model", model, "--device-tokens", "65536", "--hicache-state-interval", "4096",
            "--hicache-host-dtype", "int8"]
    code = main(argv)
    out = capsys.readouterr().out.splitlines()
    assert code in (0, 1)
    assert "int8 + fp32 scales: attn_kv; exact: conv, recurrent" in out[0]
    kv = next(line for line in out if line.startswith("KV "))
    snap = next(line for line in out if line.startswith("state snapshot (conv, recurrent): "))
    assert "B per token (history pools, all layers;" in kv and "on the int8 host" in kv
    assert "(exact on every tier) = the KV of" in snap and "one per 4,096 tokens" in snap
    plan = _json_plan(capsys, argv)
    rows = {p["name"]: p for p in plan["pools"]}
    assert rows["conv"]["device_rows"] == 65536 // 4096 and plan["state_interval"] == 4096
    assert rows["recurrent"]["host_row_bytes"] == rows["recurrent"]["row_bytes"]  # state stays exact
    assert rows["attn_kv"]["host_row_bytes"] < rows["attn_kv"]["row_bytes"]  # only the KV is int8


def test_swa_full_tokens_ratio_flag_sizes_the_swa_root(capsys):
    by_name = {p["name"]: p for p in _json_plan(capsys, [*PRO, "--swa-full-tokens-ratio", "0.25"])["pools"]}
    assert by_name["swa"]["device_rows"] == (1 << 20) // 4 // 128


@pytest.mark.parametrize("model, size_gb", [("deepseek-v4-pro", 100), ("deepseek-v4-flash", 7.5),
                                            ("llama-3.1-8b", 12), ("deepseek-v3.2", 3)])
def test_hicache_size_sets_the_host_bytes(capsys, model, size_gb):
    plan = _json_plan(capsys, ["plan", "--model", model, "--device-tokens", "1048576",
                               "--hicache-size", str(size_gb)])
    target = int(size_gb * 1e9)
    # rounded down to whole pages (anchor) and rows (swa): within one unit of each root
    slack = _root_unit_bytes(preset(model))
    assert target - slack < plan["host_bytes_total"] <= target


def test_hicache_size_keeps_the_ratio_split_between_roots():
    stack = preset("deepseek-v4-pro")
    by_ratio = plan_sizes(stack, 1 << 20, HiCacheConfig(hicache_ratio=2.0), _budget())
    by_size = plan_sizes(stack, 1 << 20, HiCacheConfig(hicache_size_gb=by_ratio.host_bytes_total / 1e9),
                         _budget())
    # the size the ratio produces gives back (up to rounding) the same rows
    assert by_size.effective_ratio == pytest.approx(2.0, rel=1e-3)
    for a, b in zip(by_ratio.pools, by_size.pools):
        assert abs(a.host_rows - b.host_rows) <= max(1, a.host_rows // 1000), a.name


@pytest.mark.parametrize("model, gib", [("deepseek-v4-pro", 40), ("llama-3.1-8b", 40), ("deepseek-v3", 7.5)])
def test_device_gib_fills_but_does_not_exceed_the_device_bytes(capsys, model, gib):
    plan = _json_plan(capsys, ["plan", "--model", model, "--device-gib", str(gib)])
    stack = preset(model)
    device_bytes = sum(p["device_bytes"] for p in plan["pools"])
    # whole anchor pages (whose cost includes their SWA share), then SWA rows rounded down:
    # the loss is under one anchor page plus one SWA row, i.e. under two root units
    assert int(gib * GIB) - _root_unit_bytes(stack) * 2 < device_bytes <= int(gib * GIB)
    tokens = device_tokens_for_bytes(stack, int(gib * GIB), HiCacheConfig())
    assert plan["pools"][0]["device_rows"] * stack.anchor.tokens_per_row == tokens


def test_device_tokens_for_bytes_rejects_data_less_stack():
    stack = Stack((PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1),), page_size=16)
    with pytest.raises(ValueError, match="--device-tokens"):
        device_tokens_for_bytes(stack, GIB, HiCacheConfig())


def test_plan_sizes_rejects_less_than_a_page():
    with pytest.raises(ValueError, match="device_tokens"):
        plan_sizes(preset("deepseek-v4-flash", 2), 255, HiCacheConfig(), _budget())


def test_plan_fits_against_the_given_budget():
    stack = preset("deepseek-v3", 4)
    plan = plan_sizes(stack, 4096, HiCacheConfig(), _budget(1))
    assert not plan.fits
    assert plan_sizes(stack, 4096, HiCacheConfig(), _budget(plan.host_bytes_total)).fits


# ---------------------------------------------------------------- exit status


def test_plan_that_does_not_fit_exits_1_and_one_that_fits_exits_0(capsys):
    # 1 PB of host pools fits no machine; a 1-layer model with 4096 device tokens fits any
    assert main(["plan", "--model", "llama-3.1-8b", "--device-tokens", "4096", "--hicache-size", "1000000"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[-1].startswith("host pools do NOT fit") and out.err == ""
    assert main(["plan", "--model", "llama-3.1-8b", "--device-tokens", "4096", "--hicache-size", "1000000",
                 "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False
    assert main(["plan", "--model", "llama-3.1-8b", "--layers", "1", "--device-tokens", "4096",
                 "--hicache-ratio", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "host pools fit"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv, flag", [
    (["--hicache-ratio", "0"], "--hicache-ratio"),
    (["--hicache-ratio", "-2"], "--hicache-ratio"),
    (["--hicache-size", "-1"], "--hicache-size"),
    (["--device-gib", "-3"], "--device-gib"),
    (["--hicache-mem-layout", "rows"], "--hicache-mem-layout"),
])
def test_bad_flag_exits_2_naming_the_flag(capsys, argv, flag):
    assert main(["plan", "--model", "deepseek-v4-flash", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("hicache plan: error:") and flag in captured.err
    assert "Traceback" not in captured.err


def test_unknown_model_exits_2_listing_the_presets(capsys):
    assert main(["plan", "--model", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'gpt-5'" in err and "deepseek-v4-pro" in err and "llama-3.1-8b" in err


@pytest.mark.parametrize("argv, flag", [
    (["--model", "gpt-5"], "--model"),
    (["--model", "qwen3.5-27b", "--hicache-state-interval", "100"], "--hicache-state-interval"),
    (["--model", "qwen3.5-27b", "--hicache-state-interval", "-64"], "--hicache-state-interval"),
    (["--layers", "0"], "--layers"),
    (["--device-tokens", "-5"], "--device-tokens"),
])
def test_bad_plan_flag_names_the_flag(capsys, argv, flag):
    assert main(["plan", *argv]) == 2
    assert flag in capsys.readouterr().err
