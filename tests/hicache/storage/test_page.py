"""Page objects: header checks name what differs; page views give page_first order for both layouts."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.storage.keys import StorageNamespace
from hicache.storage.page import (HEADER, HEADER_BYTES, PageCheck, check_header, check_pages, check_payload,
                                  encode_header, page_view)
from tests.hicache.storage.conftest import dsv4, keys_for, llama, random_pool


@pytest.fixture
def obj(gen):
    ns = StorageNamespace.for_pool(llama(2), "kv")
    payload = torch.randint(0, 256, (ns.object_bytes,), dtype=torch.uint8, generator=gen)
    key = keys_for(1, 64)[0]
    return ns, key, payload, encode_header(ns, key, payload)


def test_header_round_trip(obj):
    ns, key, payload, header = obj
    assert len(header) == HEADER_BYTES == 64
    assert check_header(header, ns, key) is PageCheck.OK
    assert check_payload(header, payload) is PageCheck.OK


def _patched(header: bytes, index: int, value) -> bytes:
    fields = list(HEADER.unpack(header))
    fields[index] = value
    return HEADER.pack(*fields)


def test_each_header_mismatch_is_named(obj):
    ns, key, payload, header = obj
    other_key = keys_for(1, 64, start=7)[0]
    assert check_header(header[:40], ns, key) is PageCheck.TRUNCATED
    assert check_header(_patched(header, 0, b"XXXX"), ns, key) is PageCheck.BAD_MAGIC
    assert check_header(_patched(header, 1, 99), ns, key) is PageCheck.BAD_VERSION
    assert check_header(header, dataclasses.replace(ns, tp_rank=1, tp_size=2), key) is PageCheck.WRONG_NAMESPACE
    assert check_header(header, ns, other_key) is PageCheck.WRONG_KEY
    assert check_header(_patched(header, 3, ns.object_bytes - 1), ns, key) is PageCheck.BAD_LENGTH


@pytest.mark.parametrize("where", [0, 4097, -1])
def test_one_flipped_payload_byte_fails_the_checksum(obj, where):
    ns, key, payload, header = obj
    bad = payload.clone()
    bad[where] ^= 0x01
    assert check_payload(header, bad) is PageCheck.BAD_CHECKSUM


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_page_view_is_page_first_order(gen, layout):
    stack = dsv4()
    pool = random_pool(stack, "swa", 5, gen, layout=layout)
    v = page_view(pool, 1, 3)
    assert v.shape == (3, pool.spec.num_layers, pool.spec.row_bytes)
    assert v.is_contiguous() == (layout == "page_first")
    # reference: row r of layer l, built from the per-layer row views the transfers use
    for r in range(3):
        for layer in range(pool.spec.num_layers):
            assert torch.equal(v[r, layer], pool.row_views()[layer][0][1 + r])


def test_page_view_bounds(gen):
    pool = random_pool(llama(1), "kv", 4, gen)
    for first, n in [(-1, 1), (0, 0), (3, 2)]:
        with pytest.raises(ValueError, match="first_row, num_rows"):
            page_view(pool, first, n)


def test_check_pages_names_the_buffer():
    good = torch.empty(8, dtype=torch.uint8)
    check_pages([good], 1, 8, writable=True)
    with pytest.raises(ValueError, match="one buffer per key"):
        check_pages([good], 2, 8, writable=True)
    with pytest.raises(TypeError, match=r"pages\[0\]"):
        check_pages([b"x" * 8], 1, 8, writable=False)
    with pytest.raises(ValueError, match=r"pages\[1\].*uint8"):
        check_pages([good, torch.empty(8, dtype=torch.int8)], 2, 8, writable=True)
    with pytest.raises(ValueError, match=r"pages\[0\]: need 8 bytes"):
        check_pages([torch.empty(9, dtype=torch.uint8)], 1, 8, writable=True)
