"""Child process of the tree's Mooncake fault test: a tree serving through a master that dies.

    python mooncake_tree_child.py     prints one JSON line:
        before: storage tokens of the request served before the kill (a storage hit)
        after:  [(storage tokens, seconds)] of the requests served after the kill
        warnings: what hicache.storage logged at WARNING or above

It leaves with ``os._exit`` (Mooncake's destructor retries a dead master for ~10 s).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from hicache import HiCacheConfig, build  # noqa: E402
from hicache.models import mha  # noqa: E402
from hicache.radix import HiRadixCache  # noqa: E402
from hicache.replay.content import ContentModel  # noqa: E402
from hicache.storage.mooncake_master import MooncakeMaster  # noqa: E402
from tests.hicache.radix.test_cache import BIG, seq  # noqa: E402
from tests.hicache.radix.storage_env import forget_all, serve  # noqa: E402
from tests.hicache.storage.mooncake_child import Count  # noqa: E402


def main() -> None:
    warnings = Count()
    logging.getLogger("hicache.storage").addHandler(warnings)
    master = MooncakeMaster().start()
    stack = mha(1, 1, 8, page_size=4)
    config = HiCacheConfig(hicache_ratio=2.0, io_backend="torch", write_policy="write_through",
                           storage_backend="mooncake", storage_master=master.address, storage_capacity_gb=0.064, storage_model_id="test/model",
                           storage_prefetch_policy="wait_complete")
    cache = build(stack, 64, config, device="cpu", budget=BIG, backend="torch")
    tree = HiRadixCache(cache)
    content = ContentModel(cache)
    a, b = seq(0, 4, 4), seq(100, 4, 4)
    serve(cache, tree, content, a)
    serve(cache, tree, content, b)
    forget_all(tree)
    report = {"before": serve(cache, tree, content, a).storage}
    master.kill()
    forget_all(tree)
    after = []
    for tokens in (b, a, b, seq(300, 4, 4), a):  # every byte used is still checked
        t0 = time.monotonic()
        got = serve(cache, tree, content, tokens)
        after.append((got.storage, round(time.monotonic() - t0, 3)))
    tree.drain_storage()
    tree.check_integrity()
    report.update(after=after, warnings=warnings.messages, stats=tree.stats()["storage"])
    print(json.dumps(report), flush=True)
    master.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
