"""A file store with random bytes written over 10 % of its files (issue 18, item 19): a
damaged ``namespace.json`` is rebuilt with one warning naming it, a damaged page is a
miss, every other page is still served byte for byte. The damage is a fixed-seed one."""
from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from hicache.storage import FileBackend, StorageNamespace
from tests.hicache.storage.conftest import dsv4, keys_for, pages_of, random_pool

PAGES = 6


def corrupt(root: Path, fraction: float, seed: int) -> list[Path]:
    """Write random bytes over a random 16-byte run of ``fraction`` of the files under ``root``
    (at least one), chosen with ``seed``; plus, as in the report, byte 0x80 at position 84
    of the first ``namespace.json``. Returns the files changed."""
    rng = random.Random(seed)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    hit = rng.sample(files, max(1, round(fraction * len(files))))
    for path in hit:
        data = bytearray(path.read_bytes())
        start = rng.randrange(len(data))
        data[start:start + 16] = rng.randbytes(len(data[start:start + 16]))
        path.write_bytes(bytes(data))
    marker = sorted(root.rglob("namespace.json"))[0]
    data = bytearray(marker.read_bytes())
    data[84] = 0x80  # not UTF-8 any more: 'utf-8' codec can't decode byte 0x80 in position 84
    marker.write_bytes(bytes(data))
    return sorted(set(hit) | {marker})


def _fill(root: Path, gen: torch.Generator) -> dict[str, tuple[StorageNamespace, object]]:
    """Every DeepSeek-V4 data pool backs up ``PAGES`` random pages; returns each pool's namespace and source."""
    stack, out = dsv4(), {}
    for spec in stack.data_pools():
        ns = StorageNamespace.for_pool(stack, spec.name)
        src = random_pool(stack, spec.name, PAGES * ns.rows_per_object, gen)
        with FileBackend(ns, root) as b:
            assert b.batch_set(keys_for(PAGES, 256), pages_of(src, ns, PAGES)) == [True] * PAGES
        out[spec.name] = (ns, src)
    return out


def test_a_store_with_random_bytes_over_a_tenth_of_its_files_keeps_serving(tmp_path, gen, caplog):
    caplog.set_level(logging.WARNING, "hicache.storage")
    stored = _fill(tmp_path, gen)
    damaged = corrupt(tmp_path, 0.10, seed=18)
    markers = [p for p in damaged if p.name == "namespace.json"]
    keys = keys_for(PAGES, 256)
    for name, (ns, src) in stored.items():
        # 1. every namespace opens: a damaged marker is rebuilt, with one warning naming it (an
        #    earlier open, whose scan met it damaged, said once that it skipped it)
        with FileBackend(ns, tmp_path) as b:
            marker = Path(b.dir) / "namespace.json"
            named = [r for r in caplog.records if str(marker) in r.getMessage() and "rebuilt" in r.getMessage()]
            assert len(named) == (marker in markers), (name, [r.getMessage() for r in named])
            # 2. every page is its exact bytes or a miss; only damaged files miss
            out = random_pool(dsv4(), name, PAGES * ns.rows_per_object, gen)
            ok = b.batch_get(keys, pages_of(out, ns, PAGES))
            for i, (key, good) in enumerate(zip(keys, ok)):
                assert good or Path(b.path(key)) in damaged, (name, i)
                if good:
                    assert torch.equal(pages_of(out, ns, 1, first=i)[0], pages_of(src, ns, 1, first=i)[0])
        # 3. reopened, the rebuilt marker needs no second warning
        caplog.clear()
        with FileBackend(ns, tmp_path):
            assert not [r for r in caplog.records if str(marker) in r.getMessage()]
    assert markers  # the scenario did damage metadata
