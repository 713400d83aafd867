"""Storage identity (issue 18, item 1): a server that opens storage the documented way
(`HiRadixCache(cache)`) gets namespaces carrying its model identity and TP rank and size,
so two ranks, or two models of one architecture, sharing a directory never read each
other's pages; a storage backend without a model identity is refused at config time."""
from __future__ import annotations

import pytest

from hicache import HiCacheConfig, build
from hicache.models import mha
from hicache.radix import HiRadixCache
from hicache.radix.prefetch import PrefetchOutcome
from hicache.radix.store import open_store
from hicache.replay.content import ContentModel
from hicache.storage import FileBackend, StorageNamespace, config_namespace, make_storage
from tests.hicache.radix.storage_env import make, serve
from tests.hicache.radix.test_cache import BIG, seq
from tests.hicache.storage.conftest import llama

WRITER = dict(storage_model_id="org/model-a@rev1", tp_rank=0, tp_size=2)


@pytest.mark.parametrize("reader, found", [
    (WRITER, True),                                                       # the same server again
    ({**WRITER, "tp_rank": 1}, False),                                    # the other rank
    ({**WRITER, "storage_model_id": "org/model-a-finetune@rev1"}, False),  # a fine-tune of one preset
    ({**WRITER, "tp_size": 1}, False),                                    # the same model without TP
])
def test_ranks_and_models_sharing_a_directory_never_read_each_others_pages(tmp_path, reader, found):
    stack = mha(1, 1, 8, page_size=4)
    a = seq(0, 3, 4)
    # 1. a server (model A, rank 0 of 2) serves a prompt; its pages reach the store
    cache, tree = make(stack, tmp_path, **WRITER)
    serve(cache, tree, ContentModel(cache), a)
    tree.close()
    cache.close()
    # 2. another server on the same directory looks the prompt up: only the same identity finds it
    cache, tree = make(stack, tmp_path, **reader)
    got = serve(cache, tree, ContentModel(cache), a)
    want = PrefetchOutcome.COMPLETE if found else PrefetchOutcome.NOT_FOUND
    assert got.prefetch.outcome is want and got.storage == (12 if found else 0)
    tree.check_integrity()
    tree.close()
    cache.close()


@pytest.mark.parametrize("backend", ["file", "mooncake"])
def test_a_storage_backend_needs_a_model_identity(tmp_path, backend):
    kw = dict(storage_backend=backend, storage_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--hicache-storage-model-id"):
        HiCacheConfig(**kw)
    with pytest.raises(ValueError, match="--hicache-storage-model-id"):
        HiCacheConfig(**kw, storage_model_id="   ")
    HiCacheConfig()  # no storage backend: no identity needed


def test_namespaces_opened_through_a_config_carry_its_identity(tmp_path):
    config = HiCacheConfig(storage_backend="file", storage_dir=str(tmp_path), storage_model_id="org/m@1",
                           tp_rank=3, tp_size=4)
    ns = config_namespace(config, llama(1), "kv")
    assert (ns.model, ns.tp_rank, ns.tp_size) == ("org/m@1", 3, 4)
    with make_storage(config, ns) as backend:
        assert backend.namespace == ns
    # a namespace built without the config's identity (the preset's name, rank 0) is refused
    with pytest.raises(ValueError, match="--hicache-storage-model-id"):
        make_storage(config, StorageNamespace.for_pool(llama(1), "kv"))


def test_mooncake_ranks_and_models_never_read_each_others_pages(request, mooncake_master, mooncake_anchor):
    stack = mha(1, 1, 8, page_size=4)
    a = seq(0, 3, 4)

    def server(**identity):
        config = HiCacheConfig(hicache_ratio=2.0, io_backend="torch", write_policy="write_through",
                               storage_backend="mooncake", storage_master=mooncake_master.address, storage_prefetch_policy="wait_complete",
                               **{**WRITER, **identity})
        cache = build(stack, 32, config, device="cpu", budget=BIG, backend="torch")
        return cache, HiRadixCache(cache, storage=open_store(cache, extra=request.node.nodeid))
    # 1. rank 0 of model A stores the prompt's pages in Mooncake (the anchor's segment)
    cache, tree = server()
    serve(cache, tree, ContentModel(cache), a)
    tree.close()
    cache.close()
    # 2. rank 1, and model B's rank 0, find nothing; rank 0 of model A again finds every page
    for identity, want in (({"tp_rank": 1}, PrefetchOutcome.NOT_FOUND),
                           ({"storage_model_id": "org/model-b@rev1"}, PrefetchOutcome.NOT_FOUND),
                           ({}, PrefetchOutcome.COMPLETE)):
        cache, tree = server(**identity)
        assert serve(cache, tree, ContentModel(cache), a).prefetch.outcome is want, identity
        tree.close()
        cache.close()


def test_a_model_id_too_long_for_the_marker_is_refused_in_the_config_and_the_store(tmp_path, caplog):
    """Issue 23, item 7: a model id past the marker's read limit made ``namespace.json``
    "damaged" on every open; it is refused in one line naming the flag and the limit."""
    kw = dict(storage_backend="file", storage_dir=str(tmp_path))
    longest = "m" * 4096
    for model_id in ("m" * 70_000, "é" * 2049):  # past the limit in characters, and in UTF-8 bytes
        with pytest.raises(ValueError, match=r"^storage_model_id \(--hicache-storage-model-id\): .*at most "
                                             r"4096 bytes"):
            HiCacheConfig(**kw, storage_model_id=model_id)
        with pytest.raises(ValueError, match=r"^model \(--hicache-storage-model-id\): must be at most 4096 bytes"):
            StorageNamespace.for_pool(llama(1), "kv", model=model_id)
    # the longest accepted id opens the same directory twice without rebuilding its marker
    config = HiCacheConfig(**kw, storage_model_id=longest)
    ns = config_namespace(config, llama(1), "kv")
    for _ in range(2):
        with caplog.at_level("WARNING", logger="hicache.storage"), make_storage(config, ns):
            pass
    assert not [r for r in caplog.records if "rebuilt" in r.getMessage()]
    with pytest.raises(ValueError, match=r"^namespace: its namespace\.json would be .* B, over the 65,536 B limit"):
        FileBackend(StorageNamespace.for_pool(llama(1), "kv", extra="x" * 70_000), tmp_path)
