"""Storage admission (``--hicache-storage-admission N``): a prefix's pages go to the storage
tier only once ``N`` requests carried it; a refused prefix's count outlives its eviction
(the doorkeeper), and what is stored comes back byte for byte."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from hicache.models import mha
from hicache.radix.admission import MAX_COUNT, Doorkeeper, StorageAdmission
from hicache.radix.hints import HintState
from hicache.replay.content import ContentModel
from tests.hicache.radix.storage_env import forget_all, make, serve
from tests.hicache.radix.test_cache import seq

PS = 4


def _tree(tmp_path, write_policy: str = "write_through"):
    cache, tree = make(mha(1, 1, 8, page_size=PS), tmp_path, storage_admission=2, storage_write_policy=write_policy)
    return cache, tree, ContentModel(cache)


def _served_once(tmp_path, write_policy: str):
    """A tree over a store admitting prefixes of two requests, with two prefixes served once each."""
    cache, tree, content = _tree(tmp_path, write_policy)
    a, b = seq(0, 3, PS), seq(500, 3, PS)
    for tokens in (a, b):
        serve(cache, tree, content, tokens)
    return cache, tree, content, a, b


def _forget(tree) -> None:
    forget_all(tree)  # device and host emptied: every leaf offered to storage as it leaves
    tree.drain_storage()


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_a_prefix_of_two_requests_is_stored_one_of_one_request_is_not(tmp_path, write_policy):
    cache, tree, content, a, b = _served_once(tmp_path, write_policy)
    serve(cache, tree, content, np.concatenate([b, seq(900, 1, PS)]))  # b's 2nd request, one page more
    tree.drain_storage()
    _forget(tree)
    # b's 3 pages were written; a's 3 and b's one-request tail were not
    assert tree.counters["storage_write_pages"] == 3
    assert tree.counters["storage_refused_pages"] == 4
    assert tree.storage.stats()["bytes_written"] > 0
    got = serve(cache, tree, content, b)  # every byte of the prefix checked on the device
    assert (got.device, got.host, got.storage) == (0, 0, 3 * PS)
    assert serve(cache, tree, content, a).storage == 0
    tree.check_integrity()
    tree.close()
    cache.close()


def test_a_refused_prefix_keeps_its_count_and_is_stored_when_it_returns(tmp_path):
    cache, tree, content = _tree(tmp_path)
    a = seq(0, 3, PS)
    serve(cache, tree, content, a)
    _forget(tree)  # refused: one request; the doorkeeper remembers it
    assert tree.counters["storage_write_pages"] == 0 and tree.counters["storage_refused_pages"] == 3
    assert serve(cache, tree, content, a).storage == 0  # a miss: computed again, now its 2nd request
    tree.drain_storage()  # admitted at its backup's ack (write-through), not only when it leaves
    assert tree.counters["storage_write_pages"] == 3
    _forget(tree)
    assert serve(cache, tree, content, a).storage == 3 * PS
    tree.check_integrity()
    tree.close()
    cache.close()


def test_admitting_every_page_is_the_tier_as_before(tmp_path):
    cache, tree = make(mha(1, 1, 8, page_size=PS), tmp_path)  # storage_admission=1, the default
    content = ContentModel(cache)
    serve(cache, tree, content, seq(0, 3, PS))
    _forget(tree)
    assert tree.counters["storage_write_pages"] == 3 and tree.counters["storage_refused_pages"] == 0
    tree.close()
    cache.close()


def test_the_doorkeeper_keeps_the_largest_count_halves_and_is_bounded():
    keeper = Doorkeeper(width_bits=8, sample=6)
    keys = [hashlib.sha256(bytes([i])).hexdigest() for i in (1, 2, 3)]  # page hashes are SHA-256
    assert keeper.nbytes == 4 * 256 and keeper.count(keys[0]) == 0
    keeper.record(keys[:2], 3)
    keeper.record(keys[:1], 2)  # a smaller count never lowers one
    assert keeper.count(keys[0]) == 3 and keeper.count(keys[1]) == 3 and keeper.count(keys[2]) == 0
    keeper.record(keys[2:], 400)  # capped at one byte
    assert keeper.count(keys[2]) == MAX_COUNT
    keeper.record(keys[:3], 1)  # the 6th record: every counter halves (old counts fade)
    assert [keeper.count(k) for k in keys] == [1, 1, MAX_COUNT // 2]


def test_admission_counts_the_tree_and_the_doorkeeper():
    class Node:
        hit_count = 1
    key = ["ab" * 32]
    admission = StorageAdmission(3, hashes=lambda node: key)
    node = Node()
    assert not admission.admits(node)
    admission.refuse(node)  # remembered: 1
    node.hit_count = 2
    assert admission.count(node) == 3 and admission.admits(node)
    for bad in (1, MAX_COUNT + 1):
        with pytest.raises(ValueError, match="threshold"):
            StorageAdmission(bad, hashes=lambda node: key)
    with pytest.raises(ValueError, match="width_bits"):
        Doorkeeper(width_bits=40)


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_a_clients_persist_and_retain_pass_the_admission(tmp_path, write_policy):
    cache, tree, content, a, b = _served_once(tmp_path, write_policy)
    tree.drain_storage()
    assert tree.counters["storage_write_pages"] == 0  # one request each: the admission refuses both
    ticket = tree.hint(a, "persist")  # a client asked: written whatever the count
    assert ticket.wait(timeout_s=30) is HintState.DONE
    assert tree.counters["storage_write_pages"] == 3
    retain = tree.hint(b, "retain", ttl_s=3600.0)  # retained: it only goes down, to storage here
    _forget(tree)
    assert tree.counters["storage_write_pages"] == 6 and tree.counters["storage_refused_pages"] == 0
    assert retain.state is HintState.EXPIRED and "went down to storage" in retain.reason
    for tokens in (a, b):  # both come back from storage, every byte checked on the device
        assert serve(cache, tree, content, tokens).storage == 3 * PS
    tree.check_integrity()
    tree.close()
    cache.close()
