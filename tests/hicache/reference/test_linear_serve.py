"""The linear-attention toys (Qwen3.5, Nemotron-H) served through the hierarchy: a request
resumed from a snapshot saved in the middle of an earlier prompt, from the device, the
host and storage; `hicache verify-model` through every tier; the negative controls.

Geometry: page 32, snapshots every 64 tokens and at a sequence's last page boundary, so a
70-token prompt + 2 decoded tokens saves snapshots at 64 only, a 100-token one at 64 and 96.
"""
from __future__ import annotations

import numpy as np
import pytest

from hicache.build import build
from hicache.radix import HiRadixCache
from hicache.reference.config import toy_config
from hicache.reference.options import TOLERANCE, WRONG_BOUNDARY, VerifyOptions, verify_config
from hicache.reference.serve import ModelServer
from hicache.reference.verify import Recompute, compare, make_model, run_verify

ARCHS = ("qwen3.5", "nemotron-h")


class Env:
    """A served toy on a 512-token device cache (host ratio 2, file storage under ``tmp``)."""

    def __init__(self, arch: str, tmp, storage: bool = True) -> None:
        self.cfg = toy_config(arch, 4, seed=0)
        opts = VerifyOptions(arch=arch, storage_backend="file" if storage else "none", storage_dir=str(tmp))
        self.cache = build(self.cfg.stack(), 512, verify_config(opts, self.cfg.identity, 64), "cpu")
        self.tree = HiRadixCache(self.cache)
        model = make_model(self.cfg, "cpu")
        self.server = ModelServer(model, self.cache, self.tree, interval=64)
        self.recompute = Recompute(model, self.cfg, "cpu")
        self.rng = np.random.default_rng(5)

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.cfg.vocab_size, n, dtype=np.int64)

    def serve(self, prompt: np.ndarray) -> dict:
        """Serve (2 decoded tokens), check against the recompute; where its tokens came from."""
        served = self.server.serve(prompt, 2)
        c = compare(self.recompute, prompt, served)
        assert c.ok and c.max_abs_logit_diff <= TOLERANCE, c
        self.tree.check_integrity()
        return served.tokens_from

    def close(self) -> None:
        self.tree.close()
        self.cache.close()


@pytest.fixture
def env(request, tmp_path):
    arch, _, tiers = request.param.partition("/")
    e = Env(arch, tmp_path, storage=tiers != "no-storage")
    yield e
    e.close()


@pytest.mark.parametrize("env", ARCHS, indirect=True)
def test_a_snapshot_from_the_middle_of_a_prompt_is_resumed_on_every_tier(env):
    shared = env.tokens(80)  # 2.5 pages: the snapshot at 64 lies inside it, none at 32
    assert env.serve(np.concatenate([shared, env.tokens(20)]))["computed"] == 100  # snapshots at 64 and 96
    # B leaves A at 80: the hit ends at A's mid-prompt snapshot (64), not at the page boundary 32 + 32
    assert env.serve(np.concatenate([shared, env.tokens(30)])) == \
        {"device": 64, "host": 0, "storage": 0, "computed": 46}
    env.tree.evict(1 << 20)  # history and snapshots leave the device as whole nodes
    tiers = env.serve(np.concatenate([shared, env.tokens(12)]))
    assert (tiers["device"], tiers["host"], tiers["storage"]) == (0, 64, 0)
    env.tree.evict(1 << 20)
    env.tree.evict_host(1 << 20)  # and the host: storage alone holds them
    tiers = env.serve(np.concatenate([shared, env.tokens(5)]))
    assert (tiers["device"], tiers["host"], tiers["storage"]) == (0, 0, 64)


@pytest.mark.parametrize("env", [f"{a}/no-storage" for a in ARCHS], indirect=True)
def test_a_boundary_without_a_snapshot_is_not_a_hit(env):
    first = env.tokens(40)
    env.serve(first)  # 40 + 2 tokens: one page, its boundary (32) is the sequence's last: a snapshot
    env.tree.evict_states(1 << 20)  # the snapshot leaves the device; its host copy stays
    assert env.serve(np.concatenate([first, env.tokens(20)]))["host"] == 32  # only the snapshot moved
    env.tree.evict_states(1 << 20)
    env.tree.evict_host_states(1 << 20)  # no tier holds a snapshot at 32: its history alone is no hit
    assert env.tree.match_prefix(first[:32]).device_hit_length == 0
    assert env.serve(np.concatenate([first, env.tokens(30)]))["computed"] == 70


def _options(arch: str, **kw) -> VerifyOptions:
    # sized so that prefixes come back from the host and from storage (LRU, host ratio 1)
    return VerifyOptions(**{"arch": arch, "conversations": 4, "turns": 3, "decode_tokens": 2, "seed": 1,
                            "hicache_ratio": 1.0, "eviction_policy": "lru", **kw})


@pytest.mark.parametrize("arch", ARCHS)
def test_verify_model_matches_through_device_host_and_storage(tmp_path, arch):
    r = run_verify(_options(arch, storage_dir=str(tmp_path)))
    assert r.ok and r.mismatched_requests == 0 and r.max_abs_logit_diff <= 1e-12, r
    assert r.greedy_identical == r.greedy_total == 2 * r.requests
    assert min(r.tokens_from["device"], r.tokens_from["host"], r.tokens_from["storage"]) > 0, r.tokens_from


@pytest.mark.parametrize("fault", ["conv", "recurrent", WRONG_BOUNDARY])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_negative_control_is_caught(tmp_path, arch, fault):
    # the linear layers alone (Qwen3.5's first two, Nemotron-H's first): what the faults touch
    layers = 2 if arch == "qwen3.5" else 1
    r = run_verify(_options(arch, layers=layers, conversations=3, fault=fault, storage_dir=str(tmp_path)))
    assert r.fault_rows > 0 and not r.ok and r.mismatched_requests > 0, r
