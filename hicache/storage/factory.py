"""`make_storage`: the storage backend a `HiCacheConfig` asks for, for one pool namespace."""
from __future__ import annotations

from hicache.config import HiCacheConfig
from hicache.storage.base import StorageBackend, StorageUnavailableError, log
from hicache.storage.keys import StorageNamespace


def make_storage(config: HiCacheConfig, namespace: StorageNamespace) -> StorageBackend | None:
    """Open the configured backend for ``namespace`` (call once per data pool at start-up).

    Args:
        config: ``--hicache-storage-*`` flags.
        namespace: the pool's `StorageNamespace`.

    Returns:
        The backend; ``None`` when ``--hicache-storage-backend none``, or when the store is
        unreachable and ``--hicache-storage-optional`` is set (a warning says why).

    Raises:
        StorageUnavailableError: the store is unreachable (message names the flag to change).
    """
    try:
        if config.storage_backend == "file":
            from hicache.storage.file_backend import FileBackend
            return FileBackend(namespace, config.storage_dir, config.storage_capacity_bytes)
        if config.storage_backend == "mooncake":
            from hicache.storage.mooncake_backend import MooncakeBackend
            return MooncakeBackend(namespace, config.storage_master, config.storage_capacity_bytes)
    except StorageUnavailableError as e:
        if not config.storage_optional:
            raise StorageUnavailableError(
                f"{e}; pass --hicache-storage-optional to run without the storage tier") from e
        log.warning("%s -- running without the storage tier (--hicache-storage-optional)", e)
    return None
