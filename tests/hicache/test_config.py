"""`HiCacheConfig` and its server flags: defaults, bad values naming the flag, parse round trip."""
from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.config import FLAGS, MAX_HICACHE_RATIO, MAX_HOST_GB, HiCacheConfig, add_hicache_args
from hicache.fields import FieldKind, field_kinds, parse_annotation
from hicache.models import preset
from hicache.sizing import plan_sizes
from host_pools.memory import HostBudget


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_hicache_args(argparse.ArgumentParser()).parse_args(argv)


def test_defaults():
    c = HiCacheConfig()
    assert dataclasses.asdict(c) == {
        "enable_hierarchical_cache": False, "hicache_ratio": 2.0, "hicache_size_gb": 0.0,
        "write_policy": "write_back", "eviction_policy": "adaptive", "io_backend": "auto", "mem_layout": "page_first",
        "swa_full_tokens_ratio": 0.1, "state_interval": 0, "ranks_per_host": 1, "host_headroom_gb": None,
        "max_copy_programs": None, "storage_backend": "none", "storage_dir": "",
        "storage_master": "127.0.0.1:50051", "storage_capacity_gb": 0.0, "storage_prefetch_policy": "timeout",
        "storage_prefetch_timeout_s": 2.0, "storage_write_policy": "write_through", "storage_admission": 1,
        "storage_optional": False, "storage_model_id": "", "tp_rank": 0, "tp_size": 1, "host_dtype": "auto",
        "max_retained_ratio": 0.5, "max_hint_ttl_s": 86400.0, "load_policy": "cost",
        "device_profile": "h100"}
    assert c.host_headroom_bytes is None
    assert HiCacheConfig.from_args(_parse([])) == c


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HiCacheConfig().hicache_ratio = 3.0  # type: ignore[misc]


BAD = [
    ("hicache_ratio", 0.0, "--hicache-ratio"),
    ("hicache_ratio", -1.5, "--hicache-ratio"),
    ("hicache_ratio", float("nan"), "--hicache-ratio"),
    ("hicache_size_gb", -1.0, "--hicache-size"),
    ("write_policy", "write_around", "--hicache-write-policy"),
    ("eviction_policy", "mru", "--hicache-eviction-policy"),
    ("io_backend", "cuda", "--hicache-io-backend"),
    ("mem_layout", "row_major", "--hicache-mem-layout"),
    ("load_policy", "never", "--hicache-load-policy"),
    ("device_profile", "", "--hicache-device-profile"),
    ("swa_full_tokens_ratio", 0.0, "--swa-full-tokens-ratio"),
    ("swa_full_tokens_ratio", 1.5, "--swa-full-tokens-ratio"),
    ("ranks_per_host", 0, "--hicache-ranks-per-host"),
    ("host_headroom_gb", -2.0, "--hicache-host-headroom"),
    ("max_copy_programs", 0, "--hicache-max-copy-programs"),
    ("storage_backend", "redis", "--hicache-storage-backend"),
    ("storage_prefetch_policy", "eager", "--hicache-storage-prefetch-policy"),
    ("storage_prefetch_timeout_s", 0.0, "--hicache-storage-prefetch-timeout"),
    ("storage_prefetch_timeout_s", float("inf"), "--hicache-storage-prefetch-timeout"),
    ("storage_write_policy", "write_through_selective", "--hicache-storage-write-policy"),
    ("storage_capacity_gb", -1.0, "--hicache-storage-capacity"),
    ("storage_admission", 0, "--hicache-storage-admission"),
    ("storage_admission", 256, "--hicache-storage-admission"),
    # past any machine: products with sizes would overflow to inf, then nan
    ("hicache_ratio", 1e300, "--hicache-ratio"),
    ("hicache_size_gb", 1e300, "--hicache-size"),
    ("host_headroom_gb", 1e300, "--hicache-host-headroom"),
    ("host_headroom_gb", float("inf"), "--hicache-host-headroom"),
    ("hicache_size_gb", float("nan"), "--hicache-size"),
    ("storage_capacity_gb", 1e300, "--hicache-storage-capacity"),
    ("storage_capacity_gb", 1e-12, "--hicache-storage-capacity"),
    ("tp_size", 0, "--hicache-tp-size"),
    ("tp_rank", -1, "--hicache-tp-rank"),
    ("tp_rank", 1, "--hicache-tp-rank"),
    ("max_retained_ratio", 1.5, "--hicache-max-retained-ratio"),
    ("max_retained_ratio", -0.1, "--hicache-max-retained-ratio"),
    ("max_hint_ttl_s", 0.0, "--hicache-max-hint-ttl"),
    ("max_hint_ttl_s", 1e9, "--hicache-max-hint-ttl"),
]


@pytest.mark.parametrize("field, value, flag", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_bad_value_names_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        HiCacheConfig(**{field: value})


@pytest.mark.parametrize("field, value, flag", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_bad_flag_value_from_the_command_line_names_the_flag(field, value, flag):
    args = _parse([flag, str(value)])
    with pytest.raises(ValueError, match=flag):
        HiCacheConfig.from_args(args)


def test_boundary_values_are_accepted():
    c = HiCacheConfig(hicache_ratio=0.5, hicache_size_gb=0.0, swa_full_tokens_ratio=1.0,
                      host_headroom_gb=0.0, write_policy="write_back", io_backend="copy_engine",
                      mem_layout="layer_first")
    assert c.host_headroom_bytes == 0


def test_every_flag_round_trips():
    argv = ["--enable-hierarchical-cache", "--hicache-ratio", "3.5", "--hicache-size", "40",
            "--hicache-write-policy", "write_through_selective", "--hicache-io-backend", "triton",
            "--hicache-mem-layout", "layer_first", "--swa-full-tokens-ratio", "0.25",
            "--hicache-state-interval", "4096", "--hicache-ranks-per-host", "8", "--hicache-host-headroom", "6",
            "--hicache-max-copy-programs", "16",
            "--hicache-storage-backend", "mooncake", "--hicache-storage-dir", "/tmp/pages",
            "--hicache-storage-master", "10.0.0.2:50051", "--hicache-storage-capacity", "64",
            "--hicache-storage-prefetch-policy", "wait_complete", "--hicache-storage-prefetch-timeout", "0.5",
            "--hicache-storage-write-policy", "write_back", "--hicache-storage-admission", "3",
            "--hicache-storage-optional",
            "--hicache-storage-model-id", "org/model@rev", "--hicache-tp-rank", "1", "--hicache-tp-size", "2",
            "--hicache-host-dtype", "int8", "--hicache-eviction-policy", "lfu",
            "--hicache-max-retained-ratio", "0.25", "--hicache-max-hint-ttl", "600", "--hicache-load-policy", "always",
            "--hicache-device-profile", "b200"]
    c = HiCacheConfig.from_args(_parse(argv))
    assert c == HiCacheConfig(enable_hierarchical_cache=True, hicache_ratio=3.5, hicache_size_gb=40.0,
                              write_policy="write_through_selective", io_backend="triton",
                              mem_layout="layer_first", swa_full_tokens_ratio=0.25, state_interval=4096,
                              ranks_per_host=8,
                              host_headroom_gb=6.0, max_copy_programs=16, storage_backend="mooncake",
                              storage_dir="/tmp/pages", storage_master="10.0.0.2:50051", storage_capacity_gb=64.0,
                              storage_prefetch_policy="wait_complete", storage_prefetch_timeout_s=0.5,
                              storage_write_policy="write_back", storage_admission=3, storage_optional=True,
                              storage_model_id="org/model@rev", tp_rank=1, tp_size=2,
                              host_dtype="int8", eviction_policy="lfu", max_retained_ratio=0.25,
                              max_hint_ttl_s=600.0, load_policy="always", device_profile="b200")
    assert c.host_headroom_bytes == 6 << 30 and c.storage_capacity_bytes == 64 * 10 ** 9
    # every field has a flag, and every flag was given above
    assert set(FLAGS) == {f.name for f in dataclasses.fields(HiCacheConfig)}
    assert all(flag in argv for flag in FLAGS.values())


def test_add_hicache_args_returns_the_parser_and_keeps_its_other_flags():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path")
    assert add_hicache_args(parser) is parser
    args = parser.parse_args(["--model-path", "m", "--hicache-ratio", "4"])
    assert args.model_path == "m" and HiCacheConfig.from_args(args).hicache_ratio == 4.0


# ---------------------------------------------------------------- types (a config built in code)

WRONG_TYPES = [
    ("enable_hierarchical_cache", "no", "a bool"),  # a non-empty string is truthy: was taken as True
    ("enable_hierarchical_cache", "false", "a bool"),
    ("enable_hierarchical_cache", 1, "a bool"),
    ("storage_optional", "no", "a bool"),
    ("storage_optional", None, "a bool"),
    ("hicache_ratio", "2", "a number"),
    ("hicache_ratio", True, "a number"),
    ("hicache_ratio", None, "a number"),
    ("host_headroom_gb", "4", "a number (int or float) or None"),
    ("ranks_per_host", 2.0, "an int"),
    ("ranks_per_host", True, "an int"),
    ("ranks_per_host", "8", "an int"),
    ("max_copy_programs", 16.5, "an int"),
    ("write_policy", 3, "a str"),
    ("storage_dir", None, "a str"),
]


@pytest.mark.parametrize("field, value, expected", WRONG_TYPES, ids=[f"{f}={v!r}" for f, v, _ in WRONG_TYPES])
def test_wrong_type_is_a_type_error_naming_the_field_its_flag_and_the_type(field, value, expected):
    with pytest.raises(TypeError) as info:
        HiCacheConfig(**{field: value})
    msg = str(info.value)
    assert msg.startswith(f"{field} ({FLAGS[field]}): must be {expected}") and repr(value) in msg


def test_numbers_are_stored_as_their_field_type():
    c = HiCacheConfig(hicache_ratio=4, hicache_size_gb=np.float32(1.5), host_headroom_gb=3,
                      ranks_per_host=np.int64(2), max_copy_programs=np.int32(8))
    assert type(c.hicache_ratio) is float and c.hicache_ratio == 4.0
    assert type(c.hicache_size_gb) is float and type(c.host_headroom_gb) is float
    assert type(c.ranks_per_host) is int and type(c.max_copy_programs) is int
    assert c == HiCacheConfig(hicache_ratio=4.0, hicache_size_gb=1.5, host_headroom_gb=3.0, ranks_per_host=2,
                              max_copy_programs=8)


def test_an_int_too_large_for_a_float_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--hicache-size"):
        HiCacheConfig(hicache_size_gb=10 ** 400)


def test_every_field_has_a_checked_type():
    # a field added later with an annotation the checker does not know would go unchecked
    assert all(kind is not None for kind in field_kinds(HiCacheConfig).values()), field_kinds(HiCacheConfig)


def test_annotations_the_checker_reads():
    assert parse_annotation("float | None") == FieldKind("float", True)
    assert parse_annotation("None | int") == FieldKind("int", True) and parse_annotation(bool) == FieldKind("bool", False)
    assert parse_annotation("tuple[int, ...]") is None and parse_annotation("int | str") is None


def test_wrong_type_in_parsed_arguments_names_the_flag():
    # a server whose own parser declared the flag as a string
    args = _parse([])
    args.enable_hierarchical_cache = "false"
    with pytest.raises(TypeError, match="--enable-hierarchical-cache"):
        HiCacheConfig.from_args(args)


@pytest.mark.parametrize("flag, value", [("--hicache-ranks-per-host", "1.5"), ("--hicache-ratio", "two"),
                                         ("--hicache-max-copy-programs", "x")])
def test_flag_of_the_wrong_type_is_refused_by_the_parser_naming_it(capsys, flag, value):
    with pytest.raises(SystemExit):
        _parse([flag, value])
    assert f"argument {flag}: invalid" in capsys.readouterr().err


# ---------------------------------------------------------------- storage flags need a backend

STORAGE_ONLY = [("--hicache-storage-dir", "/tmp/pages"), ("--hicache-storage-master", "10.0.0.2:50051"),
                ("--hicache-storage-capacity", "8"), ("--hicache-storage-prefetch-policy", "best_effort"),
                ("--hicache-storage-prefetch-timeout", "5"), ("--hicache-storage-write-policy", "write_back"),
                ("--hicache-storage-optional",), ("--hicache-storage-model-id", "org/model@rev"),
                ("--hicache-storage-admission", "2")]


@pytest.mark.parametrize("argv", STORAGE_ONLY, ids=[a[0] for a in STORAGE_ONLY])
def test_storage_flag_without_a_backend_is_refused_naming_both_flags(argv):
    with pytest.raises(ValueError) as info:
        HiCacheConfig.from_args(_parse(list(argv)))
    assert str(info.value).startswith(f"{argv[0]}: has no effect without --hicache-storage-backend")
    # with a backend the same flags are taken
    HiCacheConfig.from_args(_parse([*argv, "--hicache-storage-backend", "file", "--hicache-storage-dir", "/tmp/p",
                                    "--hicache-storage-model-id", "org/model@rev"]))


def test_every_storage_flag_is_covered_by_the_backend_rule():
    given = {a[0] for a in STORAGE_ONLY}
    assert given == {flag for field, flag in FLAGS.items()
                     if field.startswith("storage_") and field != "storage_backend"}


# ---------------------------------------------------------------- fuzz: huge, tiny, nan, inf, -0.0

FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308, 1e9, 1e6]),
                   st.integers(min_value=-(10 ** 400), max_value=10 ** 400))
FLOAT_FIELDS = ("hicache_ratio", "hicache_size_gb", "swa_full_tokens_ratio", "host_headroom_gb")
SIZING_BUDGET = HostBudget(1 << 40, None, 0, 1, 1 << 40)


@settings(derandomize=True, deadline=None, max_examples=300)
@given(field=st.sampled_from(FLOAT_FIELDS), value=FLOATS)
def test_float_fields_are_taken_or_refused_by_name_and_sizing_never_overflows(field, value):
    try:
        c = HiCacheConfig(**{field: value})
    except ValueError as exc:
        assert str(exc).startswith(f"{field} ({FLAGS[field]}):")
        return
    assert math.isfinite(getattr(c, field))
    assert c.host_headroom_bytes is None or 0 <= c.host_headroom_bytes <= MAX_HOST_GB * (1 << 30)
    assert c.hicache_ratio <= MAX_HICACHE_RATIO
    # every product with a size stays a finite, whole number (a tiny SWA share is refused by flag)
    stack = preset("deepseek-v4-flash", 4)
    try:
        plan = plan_sizes(stack, 1 << 20, c, SIZING_BUDGET)
    except ValueError as exc:
        assert field == "swa_full_tokens_ratio" and str(exc).startswith("--swa-full-tokens-ratio:")
        return
    assert all(isinstance(n, int) and n >= 0 for p in plan.pools for n in (p.host_rows, p.host_bytes))
