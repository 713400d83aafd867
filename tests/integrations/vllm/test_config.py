"""Plugin settings, sizing and the serve-vllm command line (no vLLM needed)."""
from __future__ import annotations

import json
import sys

import pytest

from host_pools.memory import HostBudget, HostMemoryError
from hicache import HiCacheConfig
from hicache.cli import main
from hicache.integrations.vllm import kv_transfer_config
from hicache.integrations.vllm.config import SpecConfig
from hicache.integrations.vllm.serve import serve_command


@pytest.mark.parametrize("extra, match", [
    ({"hicache_ratoi": 2}, r"unknown key\(s\) \['hicache_ratoi'\]"),
    ({"hicache_ratio": 0}, r"hicache_ratio \(--hicache-ratio\): must be > 0"),
    ({"hicache_ratio": -1.5}, r"hicache_ratio \(--hicache-ratio\): must be > 0"),
    ({"io_backend": "cuda_magic"}, r"io_backend \(--hicache-io-backend\): must be one of"),
    ({"mem_layout": "rows"}, r"mem_layout \(--hicache-mem-layout\): must be one of"),
    ({"hicache_ratio": "2"}, r"hicache_ratio: must be of type float"),
    ({"ranks_per_host": True}, r"ranks_per_host: must be of type int"),
    ({"canonical_layout": True}, r"canonical_layout: not supported"),
    ({"eviction_policy": "fifo"}, r"eviction_policy \(--hicache-eviction-policy\): must be one of"),
])
def test_bad_extra_config_names_the_key(extra, match):
    with pytest.raises(ValueError, match=match):
        SpecConfig.from_extra(extra)


def test_sizing_by_ratio_and_by_size_and_the_budget():
    cfg = SpecConfig.from_extra({"hicache_ratio": 4, "spec_name": "x", "blocks_per_chunk": 2})
    assert cfg.host_chunks(device_blocks=64, bytes_per_block=1000, blocks_per_chunk=2) == 128
    sized = SpecConfig.from_extra({"hicache_size_gb": 0.001})
    assert sized.host_chunks(64, 1000, 1) == 1000  # 1e6 B / 1000 B per chunk
    with pytest.raises(ValueError, match="hicache_ratio .* or hicache_size_gb .*: sizes the host tier to 0"):
        SpecConfig.from_extra({"hicache_ratio": 0.1}).host_chunks(4, 1000, 1)
    budget = HostBudget(10 << 30, None, 0, 1, 1 << 30)
    assert cfg.check_budget({"vllm_kv": 1 << 29}, 1, budget) is budget
    with pytest.raises(HostMemoryError, match="Lower hicache_ratio"):
        cfg.check_budget({"vllm_kv": 2 << 30}, 1, budget)
    assert SpecConfig.from_extra({}).ranks(world_size=4) == 4  # unset: vLLM's world size
    assert SpecConfig.from_extra({"ranks_per_host": 2}).ranks(world_size=4) == 2


def test_kv_transfer_config_round_trips_through_the_spec_config():
    hi = HiCacheConfig(enable_hierarchical_cache=True, hicache_ratio=3.0, io_backend="copy_engine",
                       host_headroom_gb=1.5)
    cfg = json.loads(kv_transfer_config(hi))
    assert cfg["kv_connector"] == "HiCacheOffloadingConnector"
    assert cfg["kv_connector_module_path"] == "hicache.integrations.vllm"
    extra = cfg["kv_connector_extra_config"]
    assert extra["spec_name"] == "HiCacheOffloadingSpec"
    assert extra["spec_module_path"] == "hicache.integrations.vllm"
    back = SpecConfig.from_extra(extra).hicache
    assert (back.hicache_ratio, back.io_backend, back.host_headroom_gb) == (3.0, "copy_engine", 1.5)
    assert "ranks_per_host" not in extra  # default: the plugin splits by vLLM's world size
    two = json.loads(kv_transfer_config(HiCacheConfig(ranks_per_host=2)))
    assert SpecConfig.from_extra(two["kv_connector_extra_config"]).ranks(world_size=8) == 2
    with pytest.raises(ValueError, match="write_policy .*write_through"):
        kv_transfer_config(HiCacheConfig(write_policy="write_through_selective"))
    # the config's default (the radix tree's write-back) stands for vLLM's only policy
    assert kv_transfer_config(HiCacheConfig()) == kv_transfer_config(HiCacheConfig(write_policy="write_through"))
    assert "eviction_policy" not in extra  # the default (lru) leaves the extra config as it was
    lfu = json.loads(kv_transfer_config(HiCacheConfig(eviction_policy="lfuda")))["kv_connector_extra_config"]
    assert lfu["eviction_policy"] == "lfuda"
    assert SpecConfig.from_extra(lfu).hicache.eviction_policy == "lfuda"


def test_serve_command_translates_hicache_flags_only_when_enabled(tmp_path):
    py, m = sys.executable, str(tmp_path)  # a model folder
    plain = serve_command(m, HiCacheConfig(), ["--port", "1"], python=py)
    assert plain == [py, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", m,
                     "--host", "127.0.0.1", "--port", "1"]  # not vLLM's 0.0.0.0
    on = serve_command(m, HiCacheConfig(enable_hierarchical_cache=True, hicache_ratio=4),
                       ["--port", "1"], python=py, prefix_tokens=512)
    assert on[:9] == plain and on[9] == "--kv-transfer-config"
    extra = json.loads(on[10])["kv_connector_extra_config"]
    assert extra["hicache_ratio"] == 4.0 and extra["hicache_prefix_tokens"] == 512
    assert SpecConfig.from_extra(extra).prefix_tokens == 512
    exposed = serve_command(m, HiCacheConfig(), ["--host=0.0.0.0"], python=py)
    assert exposed[-1] == "--host=0.0.0.0" and "127.0.0.1" not in exposed
    with pytest.raises(ValueError, match="--kv-transfer-config: hicache sets it"):
        serve_command("m", HiCacheConfig(enable_hierarchical_cache=True),
                      ["--kv-transfer-config", "{}"], python=py)
    with pytest.raises(HostMemoryError, match="not enough host memory"):
        serve_command("m", HiCacheConfig(enable_hierarchical_cache=True, hicache_size_gb=1e9),
                      [], python=py)


def test_serve_vllm_refuses_a_bad_python_and_unknown_hicache_flags_before_starting(capsys, tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexit 0\n")  # never run: the checks come first
    cases = [(["--vllm-python", "/nonexistent/python"], "--vllm-python: /nonexistent/python is not an executable file"),
             (["--vllm-python", str(tmp_path)], "is not an executable file"),
             (["--vllm-python", sys.executable, "--enable-hierarchical-cache", "--hicache-ratoi", "2"],
              "--hicache-ratoi: unknown hicache flag(s)"),
             (["--vllm-python", str(script), "--hicache-sizes=1", "--enable-hierarchical-cach"],
              "--hicache-sizes, --enable-hierarchical-cach: unknown hicache flag(s)"),
             (["--vllm-python", str(script), "--enable-hierarchical-cache", "--hicache-write-policy", "write_back"],
              "--hicache-write-policy: vLLM stores each block when it is computed")]
    script.chmod(0o755)
    for args, message in cases:
        assert main(["serve-vllm", "m", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err


def test_bad_prefix_tokens_is_named():
    with pytest.raises(ValueError, match=r"hicache_prefix_tokens \(--hicache-prefix-tokens\): must be an int >= 1"):
        kv_transfer_config(HiCacheConfig(), prefix_tokens=0)
    with pytest.raises(ValueError, match="hicache_prefix_tokens"):
        SpecConfig.from_extra({"hicache_prefix_tokens": 1.5})
    assert SpecConfig.from_extra({"sync_load_budget_bytes": 1 << 20}).prefix_tokens == 2048


def test_cli_reports_user_mistakes_without_a_traceback(capsys):
    assert main(["serve-vllm", "m", "--vllm-python", sys.executable,
                 "--enable-hierarchical-cache", "--hicache-io-backend", "fast"]) == 2
    err = capsys.readouterr().err
    assert "io_backend (--hicache-io-backend): must be one of" in err and "Traceback" not in err
    assert main(["plan", "--not-a-flag"]) == 2
    assert "unrecognized arguments: --not-a-flag" in capsys.readouterr().err
