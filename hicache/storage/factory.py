"""`make_storage`: the storage backend a `HiCacheConfig` asks for, for one pool namespace;
`config_namespace`: that namespace, carrying the serving identity the config names."""
from __future__ import annotations

from host_pools.spec import Stack
from hicache.config import FLAGS, HiCacheConfig
from hicache.storage.base import StorageBackend, StorageUnavailableError, log
from hicache.storage.keys import StorageNamespace


def config_namespace(config: HiCacheConfig, stack: Stack, pool: str, *, rows_per_object: int | None = None,
                     extra: str = "") -> StorageNamespace:
    """The namespace of ``pool`` for the server ``config`` describes: its model identity
    (``--hicache-storage-model-id``), TP rank and size (``--hicache-tp-rank`` / ``--hicache-tp-size``)
    and host format (``--hicache-host-dtype``; ``stack`` is then the host stack, whose int8
    pools' bytes the page objects hold).

    Args:
        config: a config with a storage backend (which requires the model identity).
        stack, pool, rows_per_object, extra: as `StorageNamespace.for_pool`.

    Raises:
        ValueError: no model identity in ``config`` (naming the flag), or a bad pool.
    """
    if not config.storage_model_id.strip():
        raise ValueError(f"storage_model_id ({FLAGS['storage_model_id']}): required to open storage")
    return StorageNamespace.for_pool(stack, pool, model=config.storage_model_id, tp_rank=config.tp_rank,
                                     tp_size=config.tp_size, rows_per_object=rows_per_object, extra=extra,
                                     host_dtype=config.host_dtype)


def _check_identity(config: HiCacheConfig, namespace: StorageNamespace) -> None:
    """A namespace opened through ``config`` carries the identity ``config`` names."""
    want = (config.storage_model_id, config.tp_rank, config.tp_size)
    got = (namespace.model, namespace.tp_rank, namespace.tp_size)
    if got != want:
        raise ValueError(f"namespace: model / tp_rank / tp_size {got} differ from the config's "
                         f"{FLAGS['storage_model_id']} / {FLAGS['tp_rank']} / {FLAGS['tp_size']} {want}; "
                         "build it with config_namespace")


def make_storage(config: HiCacheConfig, namespace: StorageNamespace) -> StorageBackend | None:
    """Open the configured backend for ``namespace`` (call once per data pool at start-up).

    Args:
        config: ``--hicache-storage-*`` flags.
        namespace: the pool's `StorageNamespace`, from `config_namespace`.

    Returns:
        The backend; ``None`` when ``--hicache-storage-backend none``, or when the store is
        unreachable and ``--hicache-storage-optional`` is set (a warning says why).

    Raises:
        StorageUnavailableError: the store is unreachable (message names the flag to change).
        ValueError: ``namespace`` lacks the config's identity, or a capacity below the
            smallest useful one (naming ``--hicache-storage-capacity``).
    """
    if config.storage_backend == "none":
        return None
    _check_identity(config, namespace)
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
