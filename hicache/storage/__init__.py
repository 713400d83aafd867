"""The storage tier below host memory: page objects shared across processes and restarts."""
from hicache.storage.base import StorageBackend, StorageStats, StorageUnavailableError
from hicache.storage.factory import config_namespace, make_storage
from hicache.storage.file_backend import FileBackend
from hicache.storage.io_pool import IOKind, IOResult, StorageIO, StorageOp
from hicache.storage.keys import StorageNamespace, page_hashes
from hicache.storage.page import PageCheck, page_view

__all__ = [
    "FileBackend", "IOKind", "IOResult", "PageCheck", "StorageBackend", "StorageIO", "StorageNamespace",
    "StorageOp", "StorageStats", "StorageUnavailableError", "config_namespace", "make_storage", "page_hashes", "page_view",
]
