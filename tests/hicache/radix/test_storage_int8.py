"""The storage tier under an int8 host tier: int8 page objects round-trip through the store
(content checked byte for byte on the device), and live in their own namespace: a bf16
host tier never reads them, nor the reverse."""
from __future__ import annotations

from hicache.models import mha
from hicache.radix.prefetch import PrefetchOutcome
from hicache.radix.store import store_namespace
from hicache.replay.content import ContentModel
from hicache.storage.keys import StorageNamespace
from host_pools.host_format import host_stack
from tests.hicache.radix.storage_env import config, forget_all, make, serve
from tests.hicache.radix.test_cache import seq


def _stack():
    return mha(2, 2, 16, page_size=4)


def test_int8_pages_round_trip_through_storage(tmp_path):
    stack = _stack()
    cache, tree = make(stack, tmp_path, host_dtype="int8")
    content, ps = ContentModel(cache), stack.page_size
    assert content.int8 == {"kv"}
    a = seq(0, 3, ps)
    assert (serve(cache, tree, content, a).storage) == 0
    forget_all(tree)
    again = serve(cache, tree, content, a)  # every page verified on the device
    assert again.prefetch.outcome is PrefetchOutcome.COMPLETE and again.storage == 3 * ps
    tree.check_integrity()
    tree.close()
    cache.close()


def test_int8_and_bf16_host_tiers_never_read_each_others_pages(tmp_path):
    stack = _stack()
    a = seq(0, 3, stack.page_size)
    for writer, reader in (("int8", "auto"), ("auto", "int8")):
        store = tmp_path / writer
        cache, tree = make(stack, store, host_dtype=writer)
        serve(cache, tree, ContentModel(cache), a)
        tree.drain_storage()
        assert tree.counters["storage_write_pages"] == 3
        tree.close()
        cache.close()
        cache, tree = make(stack, store, host_dtype=reader)
        got = serve(cache, tree, ContentModel(cache), a)
        assert got.storage == 0 and got.device == 0 and got.host == 0  # a miss: computed again
        tree.close()
        cache.close()


def test_namespace_digest_carries_the_host_dtype_only_when_int8(tmp_path):
    stack = _stack()
    auto = store_namespace(config(tmp_path), stack, "kv")
    int8 = store_namespace(config(tmp_path, host_dtype="int8"), host_stack(stack, "int8"), "kv")
    assert "host_dtype" not in auto.describe() and int8.describe()["host_dtype"] == "int8"
    assert auto.digest != int8.digest and int8.row_bytes < auto.row_bytes
    # the default's digest is the one from before the flag existed
    legacy = StorageNamespace.for_pool(stack, "kv", model=auto.model, rows_per_object=auto.rows_per_object)
    assert legacy.digest == auto.digest
