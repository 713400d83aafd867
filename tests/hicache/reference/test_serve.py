"""`ModelServer` in narrated scenarios: what the tree holds, where each prompt token comes
from, and the logits against an uninterrupted recompute after every request.

Geometry: page 32, window 16, CSA ratio 4, HCA ratio 16 (3 layers: SWA, CSA, HCA), so a
snapshot is one 16-slot swa row (and its c4_state / c4_indexer_state rows).
"""
from __future__ import annotations

import numpy as np
import pytest

from hicache.build import build
from hicache.radix import HiRadixCache
from hicache.reference.config import toy_config
from hicache.reference.options import VerifyOptions, verify_config
from hicache.reference.serve import ModelServer
from hicache.reference.verify import Recompute, compare, make_model

ARCHS = ("deepseek-v4", "mha")


class Env:
    """A served model on a 512-token device cache (host ratio 2, file storage under ``tmp``)."""

    def __init__(self, arch: str, tmp, storage: bool = True) -> None:
        self.cfg = toy_config(arch, 3, seed=0)
        opts = VerifyOptions(arch=arch, storage_backend="file" if storage else "none", storage_dir=str(tmp))
        self.cache = build(self.cfg.stack(), 512, verify_config(opts, self.cfg.identity), "cpu")
        self.tree = HiRadixCache(self.cache)
        model = make_model(self.cfg, "cpu")
        self.server, self.recompute = ModelServer(model, self.cache, self.tree), Recompute(model, self.cfg, "cpu")
        self.rng = np.random.default_rng(3)

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.cfg.vocab_size, n, dtype=np.int64)

    def serve(self, prompt: np.ndarray, decode: int = 2) -> tuple[dict, np.ndarray]:
        """Serve, check against the recompute; (tokens_from, the conversation after it)."""
        served = self.server.serve(prompt, decode)
        c = compare(self.recompute, prompt, served)
        assert c.ok, c
        self.tree.check_integrity()
        return served.tokens_from, np.concatenate([prompt, np.asarray(served.generated, np.int64)])

    def close(self) -> None:
        self.tree.close()
        self.cache.close()


@pytest.fixture
def env(request, tmp_path):
    e = Env(request.param, tmp_path)
    yield e
    e.close()


@pytest.mark.parametrize("env", ARCHS, indirect=True)
def test_a_request_matching_part_of_a_page_resumes_at_the_page_boundary(env):
    system = env.tokens(40)  # a page and a quarter
    tiers, _ = env.serve(np.concatenate([system, env.tokens(30)]))  # A: 70 tokens, all computed
    assert tiers == {"device": 0, "host": 0, "storage": 0, "computed": 70}
    # B shares 40 tokens with A, i.e. page 0 and 8 tokens of page 1: it matches page 0 only
    # (DeepSeek-V4: A left a snapshot at 32) and computes from there
    tiers, _ = env.serve(np.concatenate([system, env.tokens(20)]))
    assert tiers == {"device": 32, "host": 0, "storage": 0, "computed": 28}


@pytest.mark.parametrize("env", ARCHS, indirect=True)
def test_evicted_at_a_page_boundary_mid_conversation_then_everywhere(env):
    system = env.tokens(40)
    env.serve(np.concatenate([system, env.tokens(10)]))  # another conversation caches page 0 alone
    # turn 1: 70 prompt tokens + 2 decoded -> pages [0, 64) in two nodes (DSV4: snapshots at 32, 64)
    _, conv = env.serve(np.concatenate([system, env.tokens(30)]))
    # evict one page: the LRU leaf [32, 64) leaves the device (its host copy stays)
    assert env.tree.evict(32) == 32
    # turn 2: [0, 32) is a device hit, [32, 64) comes back from the host, the rest is computed
    tiers, conv = env.serve(np.concatenate([conv, env.tokens(25)]))
    assert (tiers["device"], tiers["host"], tiers["storage"]) == (32, 32, 0)
    # everything leaves device and host: turn 3 comes back from storage alone
    env.tree.evict(1 << 20)
    env.tree.evict_host(1 << 20)
    tiers, conv = env.serve(np.concatenate([conv, env.tokens(20)]))  # 99 + 20 tokens: [0, 96) cached
    assert tiers["device"] == tiers["host"] == 0 and tiers["storage"] == 96
    tiers, _ = env.serve(np.concatenate([conv, env.tokens(10)]))  # and it is on the device again
    assert tiers["device"] == 96 and tiers["host"] == tiers["storage"] == 0


@pytest.mark.parametrize("env", ["deepseek-v4"], indirect=True)
def test_a_snapshot_evicted_alone_comes_back_from_the_host(env):
    _, conv = env.serve(env.tokens(70))
    # drop every device snapshot: the history stays on the device, the snapshots on the host
    env.tree.evict_states(1 << 20)
    assert env.tree.match_prefix(conv[:64]).device_hit_length == 0
    # turn 2: the load moves the snapshot at 64 only; its pages count as host hits
    tiers, _ = env.serve(np.concatenate([conv, env.tokens(25)]))
    assert (tiers["device"], tiers["host"]) == (0, 64)
    assert env.cache.controller.stats()["h2d"]["tokens"].get("kv", 0) == 0  # no history page moved
