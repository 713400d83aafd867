"""`run_verify`: the reference models served through tree, controller, host and file storage.

Each workload below is sized (conversations, turns, host ratio, seed) so that, under its
write policy, prefixes come back from the host AND from storage; every run must match the
uninterrupted recompute. The negative control corrupts what loads bring back for one pool
at a time: every pool of each model must be caught.
"""
from __future__ import annotations

import re

import pytest

from hicache.config import EVICTION_POLICIES
from hicache.reference.options import VerifyOptions
from hicache.reference.verify import TOLERANCE, run_verify

# per write policy: a small workload that reaches both the host and the storage tier
WORKLOADS = {
    "write_through": dict(conversations=5, turns=3, hicache_ratio=1.0, seed=0),
    "write_through_selective": dict(conversations=5, turns=4, hicache_ratio=1.0, seed=1),
    "write_back": dict(conversations=6, turns=3, hicache_ratio=1.0, seed=1),
}
POOLS = {"deepseek-v4": ("swa", "c4_kv", "c4_indexer", "c128_kv", "c4_state", "c4_indexer_state"), "mha": ("kv",)}


def options(arch: str, policy: str = "write_through", **kw) -> VerifyOptions:
    # 3 layers: SWA only, CSA, HCA -- every DeepSeek-V4 pool. The small workloads are sized
    # so that LRU sends pages to host and back (the default policy keeps more of these few
    # conversations on the device); every policy has its own test below.
    return VerifyOptions(**{"arch": arch, "layers": 3, "decode_tokens": 2, "write_policy": policy,
                            "eviction_policy": "lru", **WORKLOADS[policy], **kw})


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("policy", list(WORKLOADS))
@pytest.mark.parametrize("arch", list(POOLS))
def test_every_request_matches_the_recompute(tmp_path, arch, policy, layout):
    r = run_verify(options(arch, policy, mem_layout=layout, storage_dir=str(tmp_path)))
    assert r.ok and r.mismatched_requests == 0, r
    assert r.max_abs_logit_diff <= TOLERANCE
    assert r.greedy_identical == r.greedy_total == 2 * r.requests
    assert r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0, r.tokens_from


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("eviction", [e for e in EVICTION_POLICIES if e != "lru"])
def test_every_eviction_policy_matches_the_recompute(tmp_path, eviction, policy):
    r = run_verify(options("deepseek-v4", policy, eviction_policy=eviction, storage_dir=str(tmp_path)))
    assert r.ok and r.mismatched_requests == 0 and r.max_abs_logit_diff <= TOLERANCE, r
    # restores were checked (from which tier depends on what the policy kept where)
    assert r.tokens_from["host"] + r.tokens_from["storage"] > 0, r.tokens_from


@pytest.mark.parametrize("arch", list(POOLS))
def test_the_triton_backend_interpreted_on_cpu(tmp_path, arch):
    r = run_verify(options(arch, io_backend="triton", storage_dir=str(tmp_path)))
    assert r.ok and r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0


@pytest.mark.parametrize("arch", list(POOLS))
def test_without_storage_nothing_comes_from_storage(arch):
    r = run_verify(options(arch, storage_backend="none"))
    assert r.ok and r.tokens_from["storage"] == 0 and r.tokens_from["host"] > 0


def test_sliding_window_layers_alone_through_storage(tmp_path):
    # no page history at all: the window snapshot alone comes back from host and storage
    r = run_verify(options("deepseek-v4", layers=1, storage_dir=str(tmp_path)))
    assert r.ok and r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0, r


def test_sliding_window_layers_alone_without_storage():
    r = run_verify(options("deepseek-v4", layers=1, storage_backend="none", fault="swa"))
    assert r.fault_rows > 0 and not r.ok  # the window ring alone is state that must come back right


@pytest.mark.parametrize("arch, pool", [(a, p) for a, pools in POOLS.items() for p in pools])
def test_a_corrupted_pool_is_caught(tmp_path, arch, pool):
    r = run_verify(options(arch, fault=pool, storage_dir=str(tmp_path)))
    assert r.fault_rows > 0  # loads of the pool happened and were corrupted
    assert not r.ok and r.mismatched_requests > 0
    assert r.max_abs_logit_diff > 100 * TOLERANCE


def test_the_default_storage_directory_is_removed(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = run_verify(options("mha"))
    assert r.ok and r.tokens_from["storage"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw, match", [
    (dict(fault="kv"), r"--fault: 'kv' is not a pool of the deepseek-v4 model; allowed: swa, c4_kv"),
    (dict(storage_backend="mooncake"), "--hicache-storage-backend: must be one of none, file"),
    (dict(decode_tokens=0), re.escape("--decode-tokens: must be in [1, 1,024], got 0")),
    (dict(device_tokens=64), "--device-tokens: the longest request of 3 turns may take"),
    (dict(turns=0), re.escape("--turns: must be in [1, 64], got 0")),
    (dict(conversations=0), re.escape("--conversations: must be in [1, 1,024], got 0")),
    (dict(layers=0), re.escape("--layers: must be in [1, 64], got 0")),
    (dict(arch="gpt"), r"--arch\): must be one of deepseek-v4, mha"),
    (dict(seed=-1), re.escape("--seed: must be in [0, 9,223,372,036,854,775,807], got -1")),
    (dict(device="tpu"), "--device: must be cpu or an available cuda device"),
    (dict(hicache_ratio=0.0), r"--hicache-ratio\): must be > 0"),
])
def test_bad_options_name_their_flag(kw, match):
    with pytest.raises(ValueError, match=match):
        run_verify(options(kw.pop("arch", "deepseek-v4"), **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("io_backend", ["triton", "copy_engine"])
@pytest.mark.parametrize("arch", list(POOLS))
def test_on_cuda(tmp_path, arch, io_backend):
    r = run_verify(options(arch, device="cuda", io_backend=io_backend, storage_dir=str(tmp_path)))
    assert r.ok, r
    assert r.tokens_from["host"] > 0 and r.tokens_from["storage"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("io_backend", ["triton", "copy_engine"])
def test_on_cuda_a_corrupted_state_is_caught(tmp_path, io_backend):
    r = run_verify(options("deepseek-v4", device="cuda", io_backend=io_backend, fault="c4_state",
                           storage_dir=str(tmp_path)))
    assert r.fault_rows > 0 and not r.ok
