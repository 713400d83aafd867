"""Storage fixtures: small real stacks, random host pools, and one real mooncake_master per session."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hicache.models import preset
from hicache.storage import StorageNamespace, page_hashes, page_view
from host_pools.pools import HostPool
from host_pools.spec import Stack
from tests.set_up import require


def dsv4() -> Stack:
    return preset("deepseek-v4-flash", 4)  # ratios 0,0,4,128: every DeepSeek-V4 pool present


def llama(num_layers: int = 2, quant: str = "") -> Stack:
    return preset("llama-3.1-8b" + quant, num_layers)


def random_pool(stack: Stack, pool: str, num_rows: int, gen: torch.Generator,
                layout: str = "page_first") -> HostPool:
    """A host pool of ``num_rows`` rows filled with random bytes (never zeros)."""
    hp = HostPool(stack.pool(pool), num_rows, layout=layout)
    hp.buffer.copy_(torch.randint(0, 256, hp.buffer.shape, dtype=torch.uint8, generator=gen))
    return hp


def pages_of(pool: HostPool, ns: StorageNamespace, num_pages: int, first: int = 0) -> list[torch.Tensor]:
    """Views of ``num_pages`` consecutive objects of ``ns`` in ``pool``, from object ``first``."""
    r = ns.rows_per_object
    return [page_view(pool, (first + i) * r, r) for i in range(num_pages)]


def keys_for(num_pages: int, page_size: int, salt: str | None = None, start: int = 0) -> list[str]:
    ids = torch.arange(start, start + num_pages * page_size) % 32000
    return page_hashes(ids, page_size, cache_salt=salt)


def mooncake_or_skip() -> None:
    """Skip without the Mooncake client, except in CI, where set-up must have installed it."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        require(str(e), "Mooncake client", "scripts/setup.sh installs it")


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory):
    """One real mooncake_master on 127.0.0.1 for the session, stopped at the end."""
    mooncake_or_skip()
    from hicache.storage.mooncake_master import MooncakeMaster
    master = MooncakeMaster(log_dir=tmp_path_factory.mktemp("mooncake")).start()
    yield master
    master.stop()


@pytest.fixture(scope="session")
def mooncake_anchor(mooncake_master):
    """Holds the session's Mooncake client open (closing a client costs ~2 s inside Mooncake)."""
    from hicache.storage.mooncake_backend import MooncakeBackend
    ns = StorageNamespace.for_pool(llama(1), "kv", extra="session anchor")
    backend = MooncakeBackend(ns, mooncake_master.address, 512 << 20)
    yield backend
    backend.close()


@pytest.fixture
def mooncake(request, mooncake_master, mooncake_anchor):
    """Open MooncakeBackends on the session master (closed after the test). The store outlives
    the test, so each test's namespaces get the test's id folded into ``extra``."""
    from hicache.storage.mooncake_backend import MooncakeBackend
    opened = []

    def make(ns: StorageNamespace) -> MooncakeBackend:
        ns = dataclasses.replace(ns, extra=f"{ns.extra}|{request.node.nodeid}")
        b = MooncakeBackend(ns, mooncake_master.address, 512 << 20)
        opened.append(b)
        return b
    yield make
    for b in opened:
        b.close()


@pytest.fixture(params=["file", "mooncake"])
def open_backend(request, tmp_path):
    """``open_backend(ns)`` for each backend kind: a FileBackend on one directory per test,
    or a MooncakeBackend on the session master."""
    if request.param == "mooncake":
        yield request.getfixturevalue("mooncake")
        return
    from hicache.storage import FileBackend
    opened = []

    def make(ns: StorageNamespace) -> FileBackend:
        b = FileBackend(ns, tmp_path / "store")
        opened.append(b)
        return b
    yield make
    for b in opened:
        b.close()
