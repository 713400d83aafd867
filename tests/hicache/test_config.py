"""`HiCacheConfig` and its server flags: defaults, bad values naming the flag, parse round trip."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from hicache.config import FLAGS, HiCacheConfig, add_hicache_args


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_hicache_args(argparse.ArgumentParser()).parse_args(argv)


def test_defaults():
    c = HiCacheConfig()
    assert dataclasses.asdict(c) == {
        "enable_hierarchical_cache": False, "hicache_ratio": 2.0, "hicache_size_gb": 0.0,
        "write_policy": "write_through", "io_backend": "auto", "mem_layout": "page_first",
        "swa_full_tokens_ratio": 0.1, "ranks_per_host": 1, "host_headroom_gb": None,
        "max_copy_programs": None, "storage_backend": "none", "storage_dir": "",
        "storage_master": "127.0.0.1:50051", "storage_capacity_gb": 0.0, "storage_prefetch_policy": "timeout",
        "storage_prefetch_timeout_s": 2.0, "storage_write_policy": "write_through", "storage_optional": False}
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
    ("io_backend", "cuda", "--hicache-io-backend"),
    ("mem_layout", "row_major", "--hicache-mem-layout"),
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
            "--hicache-ranks-per-host", "8", "--hicache-host-headroom", "6",
            "--hicache-max-copy-programs", "16",
            "--hicache-storage-backend", "mooncake", "--hicache-storage-dir", "/tmp/pages",
            "--hicache-storage-master", "10.0.0.2:50051", "--hicache-storage-capacity", "64",
            "--hicache-storage-prefetch-policy", "wait_complete", "--hicache-storage-prefetch-timeout", "0.5",
            "--hicache-storage-write-policy", "write_back", "--hicache-storage-optional"]
    c = HiCacheConfig.from_args(_parse(argv))
    assert c == HiCacheConfig(enable_hierarchical_cache=True, hicache_ratio=3.5, hicache_size_gb=40.0,
                              write_policy="write_through_selective", io_backend="triton",
                              mem_layout="layer_first", swa_full_tokens_ratio=0.25, ranks_per_host=8,
                              host_headroom_gb=6.0, max_copy_programs=16, storage_backend="mooncake",
                              storage_dir="/tmp/pages", storage_master="10.0.0.2:50051", storage_capacity_gb=64.0,
                              storage_prefetch_policy="wait_complete", storage_prefetch_timeout_s=0.5,
                              storage_write_policy="write_back", storage_optional=True)
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
