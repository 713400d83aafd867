"""The storage tier on a real Mooncake master: the tree's round trip through the store, and
`hicache replay` twice (the second starts warm: the pages live in this process's segment)."""
from __future__ import annotations

import json

from hicache import HiCacheConfig, build
from hicache.cli import main
from hicache.models import deepseek_v4
from hicache.radix import HiRadixCache
from hicache.radix.prefetch import PrefetchOutcome
from hicache.radix.store import open_store
from hicache.replay.content import ContentModel
from tests.hicache.radix.storage_env import MODEL_ID, forget_all, serve
from tests.hicache.radix.test_cache import BIG, seq


def test_tree_round_trip_through_mooncake(request, mooncake_master, mooncake_anchor):
    stack = deepseek_v4([4, 128, 0, 4])
    config = HiCacheConfig(hicache_ratio=2.0, io_backend="torch", write_policy="write_through",
                           swa_full_tokens_ratio=0.5, storage_backend="mooncake", storage_master=mooncake_master.address,
                           storage_prefetch_policy="wait_complete", storage_model_id=MODEL_ID)
    cache = build(stack, 8 * 256, config, device="cpu", budget=BIG, backend="torch")
    tree = HiRadixCache(cache, storage=open_store(cache, extra=request.node.nodeid))
    content = ContentModel(cache)
    a = seq(0, 3, 256)
    serve(cache, tree, content, a)
    forget_all(tree)
    # every pool's pages and the snapshot come back through Mooncake, byte-checked on the device
    got = serve(cache, tree, content, a)
    assert got.prefetch.outcome is PrefetchOutcome.COMPLETE and got.storage == 3 * 256
    assert tree.stats()["storage"]["objects_read"] == 3 * 3 + 3  # 3 history pools x 3 pages + 3 state pools
    tree.check_integrity()
    tree.close()
    cache.close()


def test_replay_twice_on_mooncake_the_second_starts_warm(mooncake_master, mooncake_anchor, capsys):
    argv = ["replay", "--json", "--no-progress", "--max-requests", "40", "--device-tokens", "8192",
            "--hicache-ratio", "4", "--seed", "7", "--hicache-storage-backend", "mooncake",
            "--hicache-storage-master", mooncake_master.address]
    runs = []
    for _ in range(2):
        assert main(argv) == 0
        runs.append(json.loads(capsys.readouterr().out)["runs"][1])
    first, second = runs
    assert first["mismatches"] == second["mismatches"] == 0
    assert first["bytes_storage_written"] > 0
    assert second["storage_hit_rate"] > first["storage_hit_rate"] and second["bytes_storage_read"] > 0
