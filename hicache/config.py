"""`HiCacheConfig`: the one frozen config of the subsystem, and its server flags.

Flags are named as the ecosystem already names them (``--enable-hierarchical-cache``,
``--hicache-ratio`` ...). A bad value is a ``ValueError`` naming the flag, raised when
the config is built from parsed arguments; a value of the wrong type (a config built in
code: ``"no"`` for a bool, ``"2"`` for a number) is a ``TypeError`` naming the field and
its flag. Every field is type-checked from its annotation (`hicache.fields`: bools are
only True/False, ints never bools, floats take ints and must be finite), so a field added
later is checked without a new line here.

Sizes that are multiplied with other sizes have ceilings far past any machine (`MAX_HOST_GB`,
`MAX_HICACHE_RATIO`), so every product stays a finite float and a 64-bit integer.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from hicache.fields import checked_value, field_kinds

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# chosen by measurement (docs/RESULTS.md, "Write policy and storage admission"): never below
# write-through's hit rate on the shipped trace and every built-in workload at host ratios 1, 2, 4,
# with and without a store (equal to 4 decimals at worst, up to +0.35); its costs (a device eviction
# waits for its leaf's backup, a dead process loses the pages that never left the device): DESIGN 8b
DEFAULT_WRITE_POLICY = "write_back"
# eviction order of the device and host tiers and of the vLLM plugin's host index: the one
# list of names (hicache/radix/policies/ builds them; kept here so the config imports no torch)
EVICTION_POLICIES = ("lru", "lfu", "lfuda", "rf1", "rf4", "rf16", "tiered", "adaptive")
# the candidate that would have hit most on the live traffic (docs/RESULTS.md, "Hits that learn
# the traffic": 2.3x LRU on the sessions workload at ratio 4, +0.05 on chat at ratios 0-1; at
# most 0.0055 below LRU where it loses)
DEFAULT_EVICTION_POLICY = "adaptive"
IO_BACKENDS = ("auto", "triton", "dma", "copy_engine", "torch")  # dma: CUDA only (`build.check_backend_usable`)
MEM_LAYOUTS = ("page_first", "layer_first")
STORAGE_BACKENDS = ("none", "file", "mooncake")
STORAGE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
STORAGE_WRITE_POLICIES = ("write_through", "write_back")
# = host_pools.host_format.HOST_DTYPES (not imported: the config stays free of torch)
HOST_DTYPES = ("auto", "int8")
# load or recompute a matched prefix (hicache.cost): only the part whose load beats recomputing
# it, or everything found
LOAD_POLICIES = ("cost", "always")
# Upper bound of --hicache-max-copy-programs; equals transfer_kernels.tuning.MAX_COPY_PROGRAMS
# (not imported: the config stays free of torch).
MAX_COPY_PROGRAMS = 4096

# 1e9 GB (an exabyte) of host memory per rank; x 1e9 or x 2^30 stays below 2^63 bytes
MAX_HOST_GB = 1e9
# host tokens per device token; x any device token count (< 2^40) stays below 2^63
MAX_HICACHE_RATIO = 1e6
MAX_RANKS = 1 << 16  # --hicache-ranks-per-host, --hicache-tp-size: past any deployment
MAX_STATE_INTERVAL = 1 << 40  # tokens; = hicache.sizing.MAX_DEVICE_TOKENS (past any prompt)
MAX_PREFETCH_TIMEOUT_S = 86400.0  # a day; a thread's wait takes no more than ~2^31 s
MAX_HINT_TTL_CEILING_S = 365 * 86400.0  # --hicache-max-hint-ttl's own bound: a year
# --hicache-storage-admission: requests a prefix must have been in before storage takes its
# pages; = hicache.radix.admission.MAX_COUNT (a one-byte counter; not imported: no numpy here)
MAX_STORAGE_ADMISSION = 255

# field -> flag, so every error names what the user typed
FLAGS = {
    "enable_hierarchical_cache": "--enable-hierarchical-cache",
    "hicache_ratio": "--hicache-ratio",
    "hicache_size_gb": "--hicache-size",
    "write_policy": "--hicache-write-policy",
    "eviction_policy": "--hicache-eviction-policy",
    "io_backend": "--hicache-io-backend",
    "mem_layout": "--hicache-mem-layout",
    "host_dtype": "--hicache-host-dtype",
    "load_policy": "--hicache-load-policy",
    "device_profile": "--hicache-device-profile",
    "swa_full_tokens_ratio": "--swa-full-tokens-ratio",
    "state_interval": "--hicache-state-interval",
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
    "storage_admission": "--hicache-storage-admission",
    "storage_optional": "--hicache-storage-optional",
    "storage_model_id": "--hicache-storage-model-id",
    "tp_rank": "--hicache-tp-rank",
    "tp_size": "--hicache-tp-size",
    "max_retained_ratio": "--hicache-max-retained-ratio",
    "max_hint_ttl_s": "--hicache-max-hint-ttl",
}
# a model id (a weights path, or a hub name and revision): PATH_MAX bytes. Every storage
# namespace carries it, and the file store's marker (namespace.json) must stay within its read limit.
MAX_MODEL_ID_BYTES = 4096
# the largest --hicache-storage-capacity: 2^63 bytes (a byte count is an int64 everywhere)
MAX_STORAGE_CAPACITY_GB = (1 << 63) / 1e9


def _named(field: str) -> str:
    """``field (--flag)``, or the bare field name for a field with no flag."""
    return f"{field} ({FLAGS[field]})" if field in FLAGS else field


def flag_error(field: str, msg: str) -> ValueError:
    """The ``ValueError`` of a bad value of ``field``: ``"field (--flag): msg"``."""
    return ValueError(f"{_named(field)}: {msg}")


_bad = flag_error


def model_id_too_long(model: str) -> str:
    """Why ``model`` is too long to be a model id (the limit and its length), or ``""``."""
    size = len(model.encode("utf-8", "surrogatepass"))
    if size <= MAX_MODEL_ID_BYTES:
        return ""
    return (f"must be at most {MAX_MODEL_ID_BYTES} bytes in UTF-8 (a weights path, or a hub name and "
            f"revision), got {size}")


@dataclass(frozen=True)
class HiCacheConfig:
    """Everything the hierarchical cache is configured with.

    Attributes:
        enable_hierarchical_cache: master switch of the host tier.
        hicache_ratio: host anchor tokens per device anchor token (> 0); SWA host rows
            use the same ratio against device SWA rows.
        hicache_size_gb: host bytes in GB (1e9) per rank; 0 = size by ``hicache_ratio``.
        write_policy: ``write_back`` (default, `DEFAULT_WRITE_POLICY`: a page reaches the host
            when the device evicts it) | ``write_through`` (at insert) | ``write_through_selective``
            (at its second insert).
        eviction_policy: which leaf the device and host tiers evict first, one of
            ``EVICTION_POLICIES`` (`hicache.radix.policies`): ``lru`` least recently used,
            ``lfu`` fewest requests, ``lfuda`` LFU with dynamic aging, ``rf<w>`` recency
            + w-weighted log of the requests, ``tiered`` lfuda on the device and lru on
            the host, ``adaptive`` the candidate that would have hit most on the traffic.
        io_backend: transfer backend, ``auto`` | ``triton`` | ``dma`` (CUDA) | ``copy_engine`` | ``torch``.
        mem_layout: host layout, ``page_first`` | ``layer_first``.
        host_dtype: host format, ``auto`` (the device dtype, byte-exact) | ``int8`` (opt-in:
            bf16/fp16 history pools as int8 + one fp32 scale per token and head, lossy;
            other pools stay exact; `host_pools.host_format`).
        load_policy: ``cost`` (load only the part of a match whose expected load time beats
            recomputing it, `hicache.cost`) | ``always`` (load everything found).
        device_profile: the device whose links and prefill rates ``cost`` weighs: a shipped
            profile (``h100``, ``h200``, ``b200``) or a profile JSON file (`hicache.cost.profile`).
        swa_full_tokens_ratio: device SWA tokens per device full token (DeepSeek-V4), in (0, 1].
        state_interval: tokens between the recurrent-state snapshots a prefill saves (besides
            the prompt's end), a multiple of the page; the device holds one snapshot per
            interval of its tokens (`hicache.sizing.state_interval`). 0 = the default chosen
            by measurement (`hicache.sizing.DEFAULT_STATE_INTERVAL`, rounded up to a page).
        ranks_per_host: ranks sharing this host's memory; the host budget is split among them.
        host_headroom_gb: host memory (GiB) left to the server; ``None`` = min(10 GiB, 10 % of RAM).
        max_copy_programs: grid bound of every Triton copy launch (the SM budget copies may
            take), in [1, MAX_COPY_PROGRAMS]; ``None`` = the tuned value
            (``transfer_kernels.tuning.TRITON_MAX_PROGRAMS``). Honoured by ``triton`` and ``auto``.
        storage_backend: third tier, ``none`` | ``file`` | ``mooncake``.
        storage_dir: directory of the ``file`` backend (required with it).
        storage_master: ``host:port`` of the ``mooncake`` backend's master.
        storage_capacity_gb: GB (1e9); ``file``: bytes the whole directory holds before LRU
            eviction, all processes on it together (0 = unlimited); ``mooncake``: memory this
            process contributes to the store.
        storage_prefetch_policy: ``best_effort`` | ``wait_complete`` | ``timeout``.
        storage_prefetch_timeout_s: seconds a ``timeout`` prefetch may take (> 0).
        storage_write_policy: host -> storage: ``write_through`` | ``write_back`` (on host eviction).
        storage_admission: requests a prefix must have been carried by before the storage tier
            takes its pages, in [1, MAX_STORAGE_ADMISSION]; 1 = every page the host holds
            (`hicache.radix.admission`: a prefix refused is offered again when it leaves the
            host, and its count is remembered when it leaves the tree).
        storage_optional: start without the tier (warning) when the store is unreachable.
        storage_model_id: the served model's identity (weights path or revision) that every
            storage namespace carries; required with a storage backend, so that two models
            (two fine-tunes of one architecture) sharing a store never read each other's pages.
        tp_rank: this process's tensor-parallel rank, 0 <= tp_rank < tp_size (in every
            storage namespace: ranks hold different slices of each page).
        tp_size: tensor-parallel size, >= 1.
        max_retained_ratio: the share of each tier's pages that client hints may retain,
            in [0, 1] (0: no retain is ever accepted; `hicache.radix.hints`).
        max_hint_ttl_s: the longest retain a client may ask for, seconds (> 0, a year at most).
    """

    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0.0
    write_policy: str = DEFAULT_WRITE_POLICY
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    io_backend: str = "auto"
    mem_layout: str = "page_first"
    swa_full_tokens_ratio: float = 0.1
    state_interval: int = 0
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
    storage_admission: int = 1
    storage_optional: bool = False
    storage_model_id: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    host_dtype: str = "auto"
    max_retained_ratio: float = 0.5
    max_hint_ttl_s: float = 86400.0
    load_policy: str = "cost"
    device_profile: str = "h100"

    def __post_init__(self) -> None:
        for field, kind in _FIELD_KINDS.items():
            if kind is not None:  # frozen: the checked value (a float for an int) is set once, here
                object.__setattr__(self, field, checked_value(_named(field), kind, getattr(self, field)))
        if not self.hicache_ratio > 0:
            raise _bad("hicache_ratio", f"must be > 0, got {self.hicache_ratio}")
        if self.hicache_size_gb < 0:
            raise _bad("hicache_size_gb", f"must be >= 0 (0 = use --hicache-ratio), got {self.hicache_size_gb}")
        for field, ceiling, unit in (("hicache_ratio", MAX_HICACHE_RATIO, " host tokens per device token"),
                                     ("hicache_size_gb", MAX_HOST_GB, " GB"), ("host_headroom_gb", MAX_HOST_GB, " GiB"),
                                     ("ranks_per_host", MAX_RANKS, " ranks"), ("tp_size", MAX_RANKS, " ranks"),
                                     ("storage_prefetch_timeout_s", MAX_PREFETCH_TIMEOUT_S, " s")):
            if (getattr(self, field) or 0) > ceiling:
                raise _bad(field, f"must be at most {ceiling:g}{unit} (past any machine), got {getattr(self, field):g}")
        for field, allowed in (("write_policy", WRITE_POLICIES), ("eviction_policy", EVICTION_POLICIES),
                               ("io_backend", IO_BACKENDS),
                               ("mem_layout", MEM_LAYOUTS), ("host_dtype", HOST_DTYPES),
                               ("load_policy", LOAD_POLICIES)):
            if getattr(self, field) not in allowed:
                raise _bad(field, f"must be one of {allowed}, got {getattr(self, field)!r}")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise _bad("swa_full_tokens_ratio", f"must be in (0, 1], got {self.swa_full_tokens_ratio}")
        if not 0 <= self.state_interval <= MAX_STATE_INTERVAL:
            raise _bad("state_interval", f"must be 0 (the default) or a number of tokens in [1, "
                       f"{MAX_STATE_INTERVAL:,}], a multiple of the page, got {self.state_interval:,}")
        if not self.device_profile.strip():
            raise _bad("device_profile", "must name a profile (h100, h200, b200) or a profile JSON file")
        if self.ranks_per_host < 1:
            raise _bad("ranks_per_host", f"must be >= 1, got {self.ranks_per_host}")
        if self.host_headroom_gb is not None and self.host_headroom_gb < 0:
            raise _bad("host_headroom_gb", f"must be >= 0, got {self.host_headroom_gb}")
        self._check_max_copy_programs()
        self._check_storage()
        self._check_hints()

    def _check_hints(self) -> None:
        if not 0 <= self.max_retained_ratio <= 1:
            raise _bad("max_retained_ratio", f"must be in [0, 1] (a share of each tier), got {self.max_retained_ratio}")
        if not 0 < self.max_hint_ttl_s <= MAX_HINT_TTL_CEILING_S:
            raise _bad("max_hint_ttl_s",
                       f"must be in (0, {MAX_HINT_TTL_CEILING_S:g}] seconds, got {self.max_hint_ttl_s}")

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
        self._check_capacity()
        if not 1 <= self.storage_admission <= MAX_STORAGE_ADMISSION:
            raise _bad("storage_admission", f"must be in [1, {MAX_STORAGE_ADMISSION}] (requests a prefix must have "
                       f"been in before storage takes it; 1 = every page), got {self.storage_admission}")
        if not (math.isfinite(self.storage_prefetch_timeout_s) and self.storage_prefetch_timeout_s > 0):
            raise _bad("storage_prefetch_timeout_s", f"must be > 0 seconds, got {self.storage_prefetch_timeout_s}")
        if self.storage_backend == "file" and not self.storage_dir:
            raise _bad("storage_dir", "required with --hicache-storage-backend file")
        if self.storage_backend == "mooncake":
            parse_host_port(self.storage_master)
        if self.storage_backend != "none" and not self.storage_model_id.strip():
            raise _bad("storage_model_id", "required with a storage backend: the served model's weights path or "
                       "revision (pages of models without one could be read by another model)")
        if model_id_too_long(self.storage_model_id):
            raise _bad("storage_model_id", model_id_too_long(self.storage_model_id))
        if self.tp_size < 1:
            raise _bad("tp_size", f"must be >= 1, got {self.tp_size}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise _bad("tp_rank", f"must be in [0, {self.tp_size}) (--hicache-tp-size {self.tp_size}), "
                       f"got {self.tp_rank}")

    def _check_capacity(self) -> None:
        gb = self.storage_capacity_gb
        if not (math.isfinite(gb) and 0 <= gb <= MAX_STORAGE_CAPACITY_GB):
            raise _bad("storage_capacity_gb", f"must be a number of GB in [0, {MAX_STORAGE_CAPACITY_GB:.4g}] "
                       f"(0 = unlimited), got {gb}")
        if gb > 0 and int(gb * 1e9) == 0:
            raise _bad("storage_capacity_gb", f"{gb} GB is less than one byte; give 0 for unlimited or a "
                       "capacity of at least one page object")

    @property
    def storage_capacity_bytes(self) -> int:
        """``storage_capacity_gb`` in bytes (checked to fit an int64 when the config was built)."""
        return min(int(self.storage_capacity_gb * 1e9), (1 << 63) - 1)

    @property
    def host_headroom_bytes(self) -> int | None:
        return None if self.host_headroom_gb is None else int(self.host_headroom_gb * (1 << 30))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "HiCacheConfig":
        """Build from ``add_hicache_args`` flags. Raises ``ValueError`` naming the flag."""
        config = cls(**{f: getattr(args, f) for f in FLAGS})  # a bad value is named first
        check_storage_flags(args)
        return config


_FIELD_KINDS = field_kinds(HiCacheConfig)


def check_storage_flags(args: argparse.Namespace) -> None:
    """Refuse a storage flag given without a storage backend (it would be ignored silently).

    A flag counts as given when its value differs from the default; every ``storage_*``
    field with a flag is covered, also those added later.

    Raises:
        ValueError: one line naming the flag and ``--hicache-storage-backend``.
    """
    if getattr(args, "storage_backend", "none") != "none":
        return
    defaults = HiCacheConfig()
    for field, flag in FLAGS.items():
        if field.startswith("storage_") and field != "storage_backend" and hasattr(args, field) \
                and getattr(args, field) != getattr(defaults, field):
            raise ValueError(f"{flag}: has no effect without --hicache-storage-backend (which is 'none'); "
                             f"add --hicache-storage-backend {'|'.join(STORAGE_BACKENDS[1:])} or drop {flag}")


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
                   help=f"device -> host, one of {', '.join(WRITE_POLICIES)} (default %(default)s)")
    g.add_argument("--hicache-eviction-policy", dest="eviction_policy", default=d.eviction_policy,
                   help=f"which leaf the device and host tiers evict first, one of {', '.join(EVICTION_POLICIES)}")
    g.add_argument("--hicache-io-backend", dest="io_backend", default=d.io_backend,
                   help=f"one of {', '.join(IO_BACKENDS)}")
    g.add_argument("--hicache-mem-layout", dest="mem_layout", default=d.mem_layout,
                   help=f"one of {', '.join(MEM_LAYOUTS)}")
    g.add_argument("--hicache-host-dtype", dest="host_dtype", default=d.host_dtype,
                   help=f"host format, one of {', '.join(HOST_DTYPES)}: auto = the device dtype (byte-exact), "
                        "int8 = bf16/fp16 history KV as int8 + fp32 scale per token and head (~0.52x the bytes, "
                        "lossy; --hicache-ratio stays host tokens per device token, --hicache-size then holds "
                        "~1.9x the tokens)")
    g.add_argument("--hicache-load-policy", dest="load_policy", default=d.load_policy,
                   help=f"one of {', '.join(LOAD_POLICIES)}: cost = load only the part of a matched prefix whose "
                        "expected load time beats recomputing it (on --hicache-device-profile), always = load "
                        "everything found")
    g.add_argument("--hicache-device-profile", dest="device_profile", default=d.device_profile,
                   help="the device the cost policy weighs: h100, h200, b200 or a profile JSON file "
                        "(default %(default)s)")
    g.add_argument("--swa-full-tokens-ratio", dest="swa_full_tokens_ratio", type=float,
                   default=d.swa_full_tokens_ratio, help="device SWA tokens per full token (DeepSeek-V4)")
    g.add_argument("--hicache-state-interval", dest="state_interval", type=int, default=d.state_interval,
                   help="linear-attention hybrids: tokens between recurrent-state snapshots (a multiple of the "
                        "page; also one device snapshot per this many device tokens); 0 = the measured default")
    g.add_argument("--hicache-ranks-per-host", dest="ranks_per_host", type=int, default=d.ranks_per_host,
                   help="ranks sharing this host's memory")
    g.add_argument("--hicache-host-headroom", dest="host_headroom_gb", type=float, default=None,
                   help="GiB of host memory left free (default min(10, 10%% of RAM))")
    g.add_argument("--hicache-max-copy-programs", dest="max_copy_programs", type=int,
                   default=d.max_copy_programs,
                   help=f"grid bound of the Triton copies (the SM budget they may take), 1-{MAX_COPY_PROGRAMS}; "
                        "default: the tuned value")
    g.add_argument("--hicache-tp-rank", dest="tp_rank", type=int, default=d.tp_rank,
                   help="this process's tensor-parallel rank (storage namespaces carry it)")
    g.add_argument("--hicache-tp-size", dest="tp_size", type=int, default=d.tp_size,
                   help="tensor-parallel size (default %(default)s)")
    g.add_argument("--hicache-max-retained-ratio", dest="max_retained_ratio", type=float,
                   default=d.max_retained_ratio,
                   help="share of each tier's pages client hints may retain, 0-1 (default %(default)s)")
    g.add_argument("--hicache-max-hint-ttl", dest="max_hint_ttl_s", type=float, default=d.max_hint_ttl_s,
                   help="longest retain a client may ask for, seconds (default %(default)g: a day)")
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
                   help="GB; file: bytes the whole directory may hold (LRU eviction, 0 = none), shared by every "
                        "process on it (TP ranks, servers): give each the same value; mooncake: memory this "
                        "process contributes")
    g.add_argument("--hicache-storage-prefetch-policy", dest="storage_prefetch_policy",
                   default=d.storage_prefetch_policy, help=f"one of {', '.join(STORAGE_PREFETCH_POLICIES)}")
    g.add_argument("--hicache-storage-prefetch-timeout", dest="storage_prefetch_timeout_s", type=float,
                   default=d.storage_prefetch_timeout_s, help="seconds, for the timeout policy")
    g.add_argument("--hicache-storage-write-policy", dest="storage_write_policy",
                   default=d.storage_write_policy, help=f"one of {', '.join(STORAGE_WRITE_POLICIES)}")
    g.add_argument("--hicache-storage-admission", dest="storage_admission", type=int, default=d.storage_admission,
                   help="requests a prefix must have been in before the storage tier takes its pages "
                        f"(1-{MAX_STORAGE_ADMISSION}; 1 = every page the host holds; default %(default)s)")
    g.add_argument("--hicache-storage-optional", dest="storage_optional", action="store_true",
                   help="run without the storage tier if the store is unreachable at start")
    g.add_argument("--hicache-storage-model-id", dest="storage_model_id", default=d.storage_model_id,
                   help="the served model's weights path or revision (required with a storage backend: "
                        "every stored page carries it)")
