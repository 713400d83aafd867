"""`HiCacheConfig`: the one frozen config of the subsystem, and its server flags.

Flags are named as the ecosystem already names them (``--enable-hierarchical-cache``,
``--hicache-ratio`` ...). A bad value is a ``ValueError`` naming the flag, raised when
the config is built from parsed arguments.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
IO_BACKENDS = ("auto", "triton", "copy_engine", "torch")
MEM_LAYOUTS = ("page_first", "layer_first")
STORAGE_BACKENDS = ("none", "file", "mooncake")
STORAGE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
STORAGE_WRITE_POLICIES = ("write_through", "write_back")
# Upper bound of --hicache-max-copy-programs; equals transfer_kernels.tuning.MAX_COPY_PROGRAMS
# (not imported: the config stays free of torch).
MAX_COPY_PROGRAMS = 4096

# field -> flag, so every error names what the user typed
FLAGS = {
    "enable_hierarchical_cache": "--enable-hierarchical-cache",
    "hicache_ratio": "--hicache-ratio",
    "hicache_size_gb": "--hicache-size",
    "write_policy": "--hicache-write-policy",
    "io_backend": "--hicache-io-backend",
    "mem_layout": "--hicache-mem-layout",
    "swa_full_tokens_ratio": "--swa-full-tokens-ratio",
    "ranks_per_host": "--hicache-ranks-per-host",
    "host_headroom_gb": "--hicache-host-headroom",
    "max_copy_programs": "--hicache-max-copy-programs",
    "storage_backend": "--hicache-storage-backend",
    "storage_dir": "--hicache-storage-dir",
    "storage_master": "--hicache-storage-master",
    "storage_capacity_gb": "--hicache-storage-capacity",
    "storage_prefetch_policy": "--hicache-storage-prefetch-policy",
    "storage_prefetch_timeout_s": "--hicache-storage-prefetch-timeout",
    "storage_write_policy": "--hicache-storage-write-policy",
    "storage_optional": "--hicache-storage-optional",
}


def _bad(field: str, msg: str) -> ValueError:
    return ValueError(f"{field} ({FLAGS[field]}): {msg}")


@dataclass(frozen=True)
class HiCacheConfig:
    """Everything the hierarchical cache is configured with.

    Attributes:
        enable_hierarchical_cache: master switch of the host tier.
        hicache_ratio: host anchor tokens per device anchor token (> 0); SWA host rows
            use the same ratio against device SWA rows.
        hicache_size_gb: host bytes in GB (1e9) per rank; 0 = size by ``hicache_ratio``.
        write_policy: ``write_through`` | ``write_through_selective`` | ``write_back``.
        io_backend: transfer backend, ``auto`` | ``triton`` | ``copy_engine`` | ``torch``.
        mem_layout: host layout, ``page_first`` | ``layer_first``.
        swa_full_tokens_ratio: device SWA tokens per device full token (DeepSeek-V4), in (0, 1].
        ranks_per_host: ranks sharing this host's memory; the host budget is split among them.
        host_headroom_gb: host memory (GiB) left to the server; ``None`` = min(10 GiB, 10 % of RAM).
        max_copy_programs: grid bound of every Triton copy launch (the SM budget copies may
            take), in [1, MAX_COPY_PROGRAMS]; ``None`` = the tuned value
            (``transfer_kernels.tuning.TRITON_MAX_PROGRAMS``). Honoured by ``triton`` and ``auto``.
        storage_backend: third tier, ``none`` | ``file`` | ``mooncake``.
        storage_dir: directory of the ``file`` backend (required with it).
        storage_master: ``host:port`` of the ``mooncake`` backend's master.
        storage_capacity_gb: GB (1e9); ``file``: bytes on disk before LRU eviction (0 =
            unlimited); ``mooncake``: memory this process contributes to the store.
        storage_prefetch_policy: ``best_effort`` | ``wait_complete`` | ``timeout``.
        storage_prefetch_timeout_s: seconds a ``timeout`` prefetch may take (> 0).
        storage_write_policy: host -> storage: ``write_through`` | ``write_back`` (on host eviction).
        storage_optional: start without the tier (warning) when the store is unreachable.
    """

    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0.0
    write_policy: str = "write_through"
    io_backend: str = "auto"
    mem_layout: str = "page_first"
    swa_full_tokens_ratio: float = 0.1
    ranks_per_host: int = 1
    host_headroom_gb: float | None = None
    max_copy_programs: int | None = None
    storage_backend: str = "none"
    storage_dir: str = ""
    storage_master: str = "127.0.0.1:50051"
    storage_capacity_gb: float = 0.0
    storage_prefetch_policy: str = "timeout"
    storage_prefetch_timeout_s: float = 2.0
    storage_write_policy: str = "write_through"
    storage_optional: bool = False

    def __post_init__(self) -> None:
        for field in ("hicache_ratio", "hicache_size_gb", "swa_full_tokens_ratio", "host_headroom_gb"):
            value = getattr(self, field)
            if value is not None and not math.isfinite(value):
                raise _bad(field, f"must be a finite number, got {value}")
        if not self.hicache_ratio > 0:
            raise _bad("hicache_ratio", f"must be > 0, got {self.hicache_ratio}")
        if self.hicache_size_gb < 0:
            raise _bad("hicache_size_gb", f"must be >= 0 (0 = use --hicache-ratio), got {self.hicache_size_gb}")
        for field, allowed in (("write_policy", WRITE_POLICIES), ("io_backend", IO_BACKENDS),
                               ("mem_layout", MEM_LAYOUTS)):
            if getattr(self, field) not in allowed:
                raise _bad(field, f"must be one of {allowed}, got {getattr(self, field)!r}")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise _bad("swa_full_tokens_ratio", f"must be in (0, 1], got {self.swa_full_tokens_ratio}")
        if self.ranks_per_host < 1:
            raise _bad("ranks_per_host", f"must be >= 1, got {self.ranks_per_host}")
        if self.host_headroom_gb is not None and self.host_headroom_gb < 0:
            raise _bad("host_headroom_gb", f"must be >= 0, got {self.host_headroom_gb}")
        self._check_max_copy_programs()
        self._check_storage()

    def _check_max_copy_programs(self) -> None:
        value = self.max_copy_programs
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad("max_copy_programs", f"must be an integer or None, got {value!r}")
        if not 1 <= value <= MAX_COPY_PROGRAMS:
            raise _bad("max_copy_programs", f"must be in [1, {MAX_COPY_PROGRAMS}] (copy programs "
                                            f"of one launch; omit it for the tuned value), got {value}")

    def _check_storage(self) -> None:
        for field, allowed in (("storage_backend", STORAGE_BACKENDS),
                               ("storage_prefetch_policy", STORAGE_PREFETCH_POLICIES),
                               ("storage_write_policy", STORAGE_WRITE_POLICIES)):
            if getattr(self, field) not in allowed:
                raise _bad(field, f"must be one of {allowed}, got {getattr(self, field)!r}")
        if not (math.isfinite(self.storage_capacity_gb) and self.storage_capacity_gb >= 0):
            raise _bad("storage_capacity_gb", f"must be a finite number >= 0, got {self.storage_capacity_gb}")
        if not (math.isfinite(self.storage_prefetch_timeout_s) and self.storage_prefetch_timeout_s > 0):
            raise _bad("storage_prefetch_timeout_s", f"must be > 0 seconds, got {self.storage_prefetch_timeout_s}")
        if self.storage_backend == "file" and not self.storage_dir:
            raise _bad("storage_dir", "required with --hicache-storage-backend file")
        if self.storage_backend == "mooncake":
            parse_host_port(self.storage_master)

    @property
    def storage_capacity_bytes(self) -> int:
        return int(self.storage_capacity_gb * 1e9)

    @property
    def host_headroom_bytes(self) -> int | None:
        return None if self.host_headroom_gb is None else int(self.host_headroom_gb * (1 << 30))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "HiCacheConfig":
        """Build from ``add_hicache_args`` flags. Raises ``ValueError`` naming the flag."""
        return cls(**{f: getattr(args, f) for f in FLAGS})


def parse_host_port(value: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); ``ValueError`` naming ``--hicache-storage-master`` otherwise."""
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise _bad("storage_master", f"need host:port, got {value!r}")
    return host, int(port)


def add_hicache_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the hierarchical-cache flags to a server's (or tool's) parser; returns it."""
    d = HiCacheConfig()
    g = parser.add_argument_group("hierarchical cache")
    g.add_argument("--enable-hierarchical-cache", dest="enable_hierarchical_cache", action="store_true",
                   help="mirror device KV pools into pinned host pools")
    g.add_argument("--hicache-ratio", dest="hicache_ratio", type=float, default=d.hicache_ratio,
                   help="host tokens per device token (default %(default)s)")
    g.add_argument("--hicache-size", dest="hicache_size_gb", type=float, default=d.hicache_size_gb,
                   help="host pool size in GB per rank; 0 = use --hicache-ratio")
    g.add_argument("--hicache-write-policy", dest="write_policy", default=d.write_policy,
                   help=f"one of {', '.join(WRITE_POLICIES)}")
    g.add_argument("--hicache-io-backend", dest="io_backend", default=d.io_backend,
                   help=f"one of {', '.join(IO_BACKENDS)}")
    g.add_argument("--hicache-mem-layout", dest="mem_layout", default=d.mem_layout,
                   help=f"one of {', '.join(MEM_LAYOUTS)}")
    g.add_argument("--swa-full-tokens-ratio", dest="swa_full_tokens_ratio", type=float,
                   default=d.swa_full_tokens_ratio, help="device SWA tokens per full token (DeepSeek-V4)")
    g.add_argument("--hicache-ranks-per-host", dest="ranks_per_host", type=int, default=d.ranks_per_host,
                   help="ranks sharing this host's memory")
    g.add_argument("--hicache-host-headroom", dest="host_headroom_gb", type=float, default=None,
                   help="GiB of host memory left free (default min(10, 10%% of RAM))")
    g.add_argument("--hicache-max-copy-programs", dest="max_copy_programs", type=int,
                   default=d.max_copy_programs,
                   help=f"grid bound of the Triton copies (the SM budget they may take), 1-{MAX_COPY_PROGRAMS}; "
                        "default: the tuned value")
    add_storage_args(parser.add_argument_group("hierarchical cache: storage tier"))
    return parser


def add_storage_args(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add the ``--hicache-storage-*`` flags (server defaults) to a parser or group (`hicache replay` uses them too)."""
    d = HiCacheConfig()
    g.add_argument("--hicache-storage-backend", dest="storage_backend", default=d.storage_backend,
                   help=f"third tier below host memory, one of {', '.join(STORAGE_BACKENDS)}")
    g.add_argument("--hicache-storage-dir", dest="storage_dir", default=d.storage_dir,
                   help="directory of the file backend (pages survive restarts)")
    g.add_argument("--hicache-storage-master", dest="storage_master", default=d.storage_master,
                   help="mooncake_master host:port (default %(default)s)")
    g.add_argument("--hicache-storage-capacity", dest="storage_capacity_gb", type=float,
                   default=d.storage_capacity_gb,
                   help="GB; file: disk limit with LRU eviction (0 = none); mooncake: memory contributed")
    g.add_argument("--hicache-storage-prefetch-policy", dest="storage_prefetch_policy",
                   default=d.storage_prefetch_policy, help=f"one of {', '.join(STORAGE_PREFETCH_POLICIES)}")
    g.add_argument("--hicache-storage-prefetch-timeout", dest="storage_prefetch_timeout_s", type=float,
                   default=d.storage_prefetch_timeout_s, help="seconds, for the timeout policy")
    g.add_argument("--hicache-storage-write-policy", dest="storage_write_policy",
                   default=d.storage_write_policy, help=f"one of {', '.join(STORAGE_WRITE_POLICIES)}")
    g.add_argument("--hicache-storage-optional", dest="storage_optional", action="store_true",
                   help="run without the storage tier if the store is unreachable at start")
