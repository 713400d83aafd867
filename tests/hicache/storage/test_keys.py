"""Page hashes and namespaces: chained, salted, and disjoint for everything that changes bytes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hicache.storage.keys import StorageNamespace, chain_seed, check_keys, page_hashes
from tests.hicache.storage.conftest import dsv4, llama


def test_known_answer_pins_the_derivation():
    # A change here changes every stored key: bump keys.SCHEMA_VERSION with it.
    assert chain_seed().hex() == "58abcc07a2d654b682517ec3604e654bc17d28d79d37fd779dfe79c028429da4"
    h = page_hashes([1, 2, 3, 4], 2)
    assert h[0] == "f2a045ea5b8f3b81b8553b54c94d3e3c6f173b2e67c0e769784fe4d225ff452f"
    assert h == page_hashes(np.array([1, 2, 3, 4], dtype=np.int32), 2) == page_hashes(torch.tensor([1, 2, 3, 4]), 2)


def test_chain_prefix_property(gen):
    ids = torch.randint(0, 128000, (5 * 64 + 17,), generator=gen)
    full = page_hashes(ids, 64)
    assert len(full) == 5  # the partial trailing page has no hash
    changed = ids.clone()
    changed[2 * 64 + 3] += 1  # a token in page 2
    other = page_hashes(changed, 64)
    assert other[:2] == full[:2] and all(a != b for a, b in zip(other[2:], full[2:]))
    # continuing a chain from a prior hash gives the same keys as hashing the whole prefix
    assert page_hashes(ids[128:], 64, prior_hash=full[1]) == full[2:]


@pytest.mark.parametrize("ids", [np.full(4, 2**63, np.uint64), torch.full((4,), 2**64 - 1, dtype=torch.uint64),
                                 [2**63, 1, 2, 3], [2**64, 1, 2, 3], [-1, 2**63, 1, 2]])
def test_ids_beyond_int64_are_refused_not_wrapped(ids):
    # 2**64 - 1 as uint64 has the bits of -1: hashing it as int64 would alias the two
    with pytest.raises(ValueError, match="token_ids.*int64"):
        page_hashes(ids, 2)
    assert page_hashes(np.full(4, -1, np.int64), 2) != page_hashes(np.full(4, 2**63 - 1, np.int64), 2)


def test_salt_separates_tenants(gen):
    ids = torch.randint(0, 1000, (3 * 16,), generator=gen)
    plain, a, b = (page_hashes(ids, 16, cache_salt=s) for s in (None, "tenant-a", "tenant-b"))
    assert len({*plain, *a, *b}) == 9
    assert page_hashes(ids, 16, cache_salt="tenant-a") == a
    assert page_hashes(ids, 16, cache_salt=b"tenant-a") == a


@pytest.mark.parametrize("kwargs, match", [
    ({"token_ids": [1, 2], "page_size": 0}, "page_size"),
    ({"token_ids": [[1, 2]], "page_size": 1}, "token_ids"),
    ({"token_ids": [1.5, 2.0], "page_size": 1}, "token_ids"),
    ({"token_ids": [1, 2], "page_size": 1, "prior_hash": "xyz"}, "prior_hash"),
    ({"token_ids": [1, 2], "page_size": 1, "prior_hash": "0" * 64, "cache_salt": "s"}, "cache_salt"),
])
def test_bad_hash_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        page_hashes(**kwargs)


def test_check_keys():
    check_keys(["a" * 64])
    with pytest.raises(TypeError, match="keys"):
        check_keys("a" * 64)
    for bad in ["A" * 64, "a" * 63, 7, "g" * 64]:
        with pytest.raises(ValueError, match=r"keys\[0\]"):
            check_keys([bad])


def test_bf16_and_fp8_of_the_same_model_never_share_a_namespace():
    # Same model id on purpose: only the dtypes (and the fp8 scale buffers) differ.
    bf16 = StorageNamespace.for_pool(llama(2), "kv", model="llama-3.1-8b")
    fp8 = StorageNamespace.for_pool(llama(2, "-fp8"), "kv", model="llama-3.1-8b")
    assert bf16.digest != fp8.digest
    assert [b[2] for b in fp8.buffers] == ["float8_e4m3fn", "float32", "float8_e4m3fn", "float32"]
    assert bf16.object_key("a" * 64) != fp8.object_key("a" * 64)


def test_two_ranks_never_share_a_namespace():
    r0, r1 = (StorageNamespace.for_pool(llama(2), "kv", tp_rank=r, tp_size=2) for r in (0, 1))
    assert r0.digest != r1.digest
    assert StorageNamespace.for_pool(llama(2), "kv", tp_rank=0, tp_size=1).digest != r0.digest


CHANGES = {
    "model": "other-model", "pool": "other", "kind": "state", "tokens_per_row": 32, "page_size": 128,
    "rows_per_object": 2, "layer_ids": (4, 5), "row_bytes": 1, "tp_rank": 1, "tp_size": 4,
    "extra": "weights@rev2", "schema_version": 2,
    "buffers": (("k", (64, 8, 128), "float16"), ("v", (64, 8, 128), "bfloat16")),
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_every_field_changes_the_digest(field):
    base = StorageNamespace.for_pool(llama(2), "kv", tp_size=2)
    assert base.digest != dataclasses.replace(base, **{field: CHANGES[field]}).digest
    assert base.digest == StorageNamespace.for_pool(llama(2), "kv", tp_size=2).digest  # stable


def test_dsv4_pools_and_object_sizes():
    stack = dsv4()
    spaces = {p.name: StorageNamespace.for_pool(stack, p.name) for p in stack.data_pools()}
    assert len({ns.digest for ns in spaces.values()}) == 6
    # history pools store a whole page; state pools the trailing window snapshot (one 128-token row)
    assert spaces["c4_kv"].rows_per_object == 1 and spaces["swa"].rows_per_object == 1
    assert spaces["swa"].object_bytes == 4 * 74880
    with pytest.raises(ValueError, match="no data"):
        StorageNamespace.for_pool(stack, "kv")


@pytest.mark.parametrize("kwargs, match", [({"tp_rank": 2, "tp_size": 2}, "tp_rank"),
                                           ({"tp_size": 0}, "tp_size"), ({"model": ""}, "model"),
                                           ({"rows_per_object": 0}, "rows_per_object")])
def test_bad_namespace(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StorageNamespace.for_pool(llama(1), "kv", **kwargs)
