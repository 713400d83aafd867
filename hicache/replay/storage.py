"""The storage tier of `hicache replay`: flags, the default store, a probe, one store per run.

Every run with a host tier (ratio > 0) gets the storage tier the flags name. Each ratio
has its own namespace (``extra`` = the ratio), so every row of the table starts from
what the same row of the previous replay left in the store, never from another row of
the same sweep:

    replay 1   ratio 1: cold store -> writes its pages      ratio 2: cold -> writes its own
    replay 2   ratio 1: warm (replay 1's ratio-1 pages)     ratio 2: warm (replay 1's ratio-2 pages)

The file store defaults to ``$XDG_CACHE_HOME/hicache/storage`` (``~/.cache/...``), so two
replays in a row share it without a flag; Mooncake keeps pages only while a process that
contributed memory (``--hicache-storage-capacity``) stays connected to the master.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from hicache.config import HiCacheConfig
from hicache.radix.store import TierStore, open_store
from hicache.replay.args import default_storage_dir
from hicache.storage import StorageNamespace, StorageUnavailableError, make_storage


def fill_storage_defaults(args: argparse.Namespace) -> None:
    """The file store's default ``--hicache-storage-dir`` when none is given (changes ``args``)."""
    if args.storage_backend == "file" and not args.storage_dir:
        args.storage_dir = str(default_storage_dir())


def probe_storage(args: argparse.Namespace, stack: Any, config: HiCacheConfig) -> str:
    """Check the store the flags name before the first run; returns what the table says about it.

    With ``--hicache-storage-optional`` an unreachable store turns the tier off (``args``
    changed to ``none``, a warning says why).

    Raises:
        ValueError: the store is unreachable (one line naming the flag to change).
    """
    if args.storage_backend == "none":
        return ""
    probe = StorageNamespace.for_pool(stack, stack.data_pools()[0].name, extra="hicache replay probe")
    try:
        make_storage(dataclasses.replace(_with_storage(config, args), storage_optional=False), probe).close()
    except StorageUnavailableError as exc:
        if not args.storage_optional:
            raise ValueError(str(exc)) from None
        print(f"hicache replay: {exc.__cause__ or exc} -- running without the storage tier "
              "(--hicache-storage-optional)", file=sys.stderr)
        args.storage_backend = "none"
        return ""
    where = args.storage_dir if args.storage_backend == "file" else f"master {args.storage_master}"
    return (f"{args.storage_backend} at {where}, {args.storage_write_policy}, prefetch "
            f"{args.storage_prefetch_policy}; one namespace per ratio")


def _with_storage(config: HiCacheConfig, args: argparse.Namespace) -> HiCacheConfig:
    fields = ("storage_backend", "storage_dir", "storage_master", "storage_capacity_gb", "storage_prefetch_policy",
              "storage_prefetch_timeout_s", "storage_write_policy", "storage_optional")
    return dataclasses.replace(config, **{f: getattr(args, f) for f in fields})


def storage_config(config: HiCacheConfig, args: argparse.Namespace, ratio: float) -> HiCacheConfig:
    """``config`` with the storage flags (none for the device-only baseline, ratio 0).

    Raises:
        ValueError: a storage flag out of range (naming it).
    """
    if ratio == 0:
        return config
    return _with_storage(config, args)


def open_run_store(cache: Any, ratio: float) -> TierStore | None:
    """The storage tier of one run (``None`` without one), in the ratio's own namespace.

    Raises:
        ValueError: the store became unreachable since the probe (naming the flag).
    """
    if ratio == 0 or cache.config.storage_backend == "none":
        return None
    try:
        return open_store(cache, extra=f"hicache replay, ratio {ratio:g}")
    except StorageUnavailableError as exc:
        raise ValueError(str(exc)) from None
