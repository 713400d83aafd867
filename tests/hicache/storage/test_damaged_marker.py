"""A damaged ``namespace.json`` is a miss, whatever the damage (issue 37 item 4): nested
64 KiB deep, a 5,000-digit integer, not UTF-8, the wrong type, cut short, too large. A
shared directory with one such marker still opens in every process (a scan skips that
namespace with one warning naming it); a server's own damaged marker is rebuilt."""
from __future__ import annotations

import dataclasses
import logging
import os

import pytest
import torch

from hicache.config import HiCacheConfig
from hicache.storage import FileBackend, StorageNamespace, make_storage
from hicache.storage.file_layout import MARKER_MAX_BYTES, NAMESPACE_FILE, read_marker
from tests.hicache.storage.conftest import keys_for, llama, pages_of, random_pool

NS = StorageNamespace.for_pool(llama(1), "kv")
OTHER = "ab" * 16  # another namespace's directory under the same root

DAMAGE = {  # marker bytes -> what the refusal says (each was a crash or passed before)
    "deep": (b"[" * MARKER_MAX_BYTES, "line 1: nested deeper than 64 levels"),  # was: RecursionError
    "digits": (b'{"a":\n' + b"9" * 5000 + b"}", "line 2: a number of more than 64 digits"),  # was: ValueError
    "not utf-8": (b'{"model":\n"\xff"}', "line 2: not UTF-8 text (byte 0xff at column 2)"),
    "a list": (b"[1, 2]", "describes another namespace"),
    "wrong types": (b'{"schema_version": [], "pool": {}}', "describes another namespace"),
    "cut short": (b'{"schema_version": 1, "mod', "line 1: not valid JSON"),
    "empty": (b"", "line 1: not valid JSON"),
    "too large": (b" " * (MARKER_MAX_BYTES + 1), f"more than {MARKER_MAX_BYTES:,} bytes"),
}


def _damage(ns_dir, data: bytes) -> str:
    os.makedirs(ns_dir, mode=0o700, exist_ok=True)
    path = os.path.join(ns_dir, NAMESPACE_FILE)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.mark.parametrize("case", list(DAMAGE))
def test_any_damage_is_a_reason_naming_the_file_never_an_exception(tmp_path, case):
    data, why = DAMAGE[case]
    path = _damage(tmp_path / OTHER, data)
    found = read_marker(str(tmp_path / OTHER))
    assert isinstance(found, str) and found.startswith(path) and why in found, found


def _serves(backend: FileBackend, gen: torch.Generator, salt: str = "") -> None:
    """Two random pages (new keys per ``salt``) back up and come back byte for byte."""
    src, out = random_pool(llama(1), "kv", 2, gen), random_pool(llama(1), "kv", 2, gen)
    keys = keys_for(2, 64, salt=salt)
    assert backend.batch_set(keys, pages_of(src, NS, 2)) == [True, True]
    assert backend.batch_get(keys, pages_of(out, NS, 2)) == [True, True]
    assert torch.equal(out.buffer.view(torch.uint8), src.buffer.view(torch.uint8))


def _named(caplog, path: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and path in r.getMessage()]


@pytest.mark.parametrize("case", ["deep", "digits"])
def test_a_shared_directory_with_a_damaged_marker_still_opens_and_serves(tmp_path, gen, caplog, case):
    # was: every process opening the directory crashed in the root scan, even with
    # --hicache-storage-optional (only StorageUnavailableError was caught there)
    path = _damage(tmp_path / OTHER, DAMAGE[case][0])
    config = HiCacheConfig(storage_backend="file", storage_dir=str(tmp_path), storage_model_id=NS.model)
    for optional in (False, True):
        backend = make_storage(dataclasses.replace(config, storage_optional=optional), NS)
        assert isinstance(backend, FileBackend)
        with backend:
            _serves(backend, gen, salt=str(optional))
            backend._index.adopt(backend.dir + "-rescan")  # another scan: no second warning
    # one warning per process's index naming the file and why; the namespace is skipped, not deleted
    named = _named(caplog, path)
    assert len(named) == 2 and all(DAMAGE[case][1] in m and "that namespace is skipped" in m for m in named), named
    assert (tmp_path / OTHER / NAMESPACE_FILE).read_bytes() == DAMAGE[case][0]


def test_a_servers_own_deep_marker_is_rebuilt_with_one_warning(tmp_path, gen, caplog):
    path = _damage(tmp_path / NS.digest_hex[:32], DAMAGE["deep"][0])  # was: RecursionError at open
    with FileBackend(NS, tmp_path) as backend:
        _serves(backend, gen)
    named = _named(caplog, path)
    assert len(named) == 1 and "nested deeper than 64 levels" in named[0] and "rebuilt" in named[0], named
    assert read_marker(str(tmp_path / NS.digest_hex[:32])) == NS.describe()
