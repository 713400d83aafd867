"""The storage tier of `hicache replay`: flags, the default store, a probe, one store per run.

Every run with a host tier (ratio > 0) gets the storage tier the flags name. Each ratio
and eviction policy has its own namespace (``extra`` = both), so every row of the table
starts from what the same row of the previous replay left in the store, never from
another row of the same sweep (two policies at one ratio never share pages):

    replay 1   ratio 1: cold store -> writes its pages      ratio 2: cold -> writes its own
    replay 2   ratio 1: warm (replay 1's ratio-1 pages)     ratio 2: warm (replay 1's ratio-2 pages)

The file store defaults to ``$XDG_CACHE_HOME/hicache/storage`` (``~/.cache/...``), so two
replays in a row share it without a flag, capped by default at min(16 GB, a quarter of
the free disk) (`default_capacity_gb`; an explicit ``--hicache-storage-capacity``, 0 =
unlimited, wins). The replay's pages hold synthetic content that depends only on the
preset and the layer count, so its model identity (``--hicache-storage-model-id``)
defaults to one derived from ``--model`` and ``--layers`` (`replay_model_id`). Mooncake
keeps pages only while a process that contributed memory (``--hicache-storage-capacity``)
stays connected to the master.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from hicache.config import HiCacheConfig
from hicache.radix.store import TierStore, open_store, store_namespace
from hicache.replay.args import DEFAULT_CAPACITY_GB, FREE_DISK_FRACTION, default_storage_dir
from hicache.storage import StorageUnavailableError, make_storage


def replay_model_id(stack: Any) -> str:
    """The model identity of the replay's pages: its preset and layer count (the content is synthetic)."""
    return f"hicache-replay/{stack.model}/{stack.num_model_layers}-layers"


def default_capacity_gb(where: Path) -> float:
    """min(`DEFAULT_CAPACITY_GB`, `FREE_DISK_FRACTION` of the free space at ``where``) in GB."""
    existing = where
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    return min(DEFAULT_CAPACITY_GB, FREE_DISK_FRACTION * free / 1e9)


def fill_storage_defaults(args: argparse.Namespace, stack: Any) -> None:
    """The replay's storage defaults (changes ``args``): the file store's folder and its
    capacity when neither is given, and the model identity from ``stack``."""
    if args.storage_capacity_gb is None:
        args.storage_capacity_gb = 0.0
        if args.storage_backend == "file" and not args.storage_dir:
            args.storage_capacity_gb = default_capacity_gb(default_storage_dir())
    if args.storage_backend == "file" and not args.storage_dir:
        args.storage_dir = str(default_storage_dir())
    if args.storage_backend != "none" and not args.storage_model_id:
        args.storage_model_id = replay_model_id(stack)


def probe_storage(args: argparse.Namespace, cache_stack: Any, config: HiCacheConfig) -> str:
    """Open every pool's backend the flags name before the first run (and say so on
    stderr); returns what the table says about the store.

    With ``--hicache-storage-optional`` an unreachable store turns the tier off (``args``
    changed to ``none``, a warning says why).

    Raises:
        ValueError: the store is unreachable or its capacity too small (one line naming the flag).
    """
    if args.storage_backend == "none":
        return ""
    probe = dataclasses.replace(_with_storage(config, args), storage_optional=False)
    try:
        _open_every_pool(probe, cache_stack)
    except StorageUnavailableError as exc:
        if not args.storage_optional:
            raise ValueError(str(exc)) from None
        print(f"hicache replay: {exc.__cause__ or exc} -- running without the storage tier "
              "(--hicache-storage-optional)", file=sys.stderr)
        args.storage_backend = "none"
        return ""
    where = args.storage_dir if args.storage_backend == "file" else f"master {args.storage_master}"
    cap = f"{args.storage_capacity_gb:.3g} GB" if args.storage_capacity_gb else "unlimited"
    print(f"hicache replay: storage tier {args.storage_backend} at {where}, capacity {cap} "
          f"(--hicache-storage-capacity), model id {args.storage_model_id!r} (--hicache-storage-model-id)",
          file=sys.stderr)
    admission = "every page" if args.storage_admission == 1 else f"prefixes of >= {args.storage_admission} requests"
    return (f"{args.storage_backend} at {where}, {args.storage_write_policy}, admits {admission}, prefetch "
            f"{args.storage_prefetch_policy}; one namespace per ratio and policy; capacity {cap}; "
            f"model id {args.storage_model_id}")


def _open_every_pool(config: HiCacheConfig, stack: Any) -> None:
    """Open (and close) a backend per data pool in a probe namespace: reachability and a
    capacity that holds one page of every pool are checked before anything runs."""
    opened = []
    try:
        for spec in stack.data_pools():
            opened.append(make_storage(config, store_namespace(config, stack, spec.name, "hicache replay probe")))
    finally:
        for backend in opened:
            if backend is not None:
                backend.close()


def _with_storage(config: HiCacheConfig, args: argparse.Namespace) -> HiCacheConfig:
    fields = ("storage_backend", "storage_dir", "storage_master", "storage_capacity_gb", "storage_prefetch_policy",
              "storage_prefetch_timeout_s", "storage_write_policy", "storage_admission", "storage_optional",
              "storage_model_id")
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
    """The storage tier of one run (``None`` without one), in its ratio and policy's own namespace.

    Raises:
        ValueError: the store became unreachable since the probe (naming the flag).
    """
    if ratio == 0 or cache.config.storage_backend == "none":
        return None
    try:
        return open_store(cache, extra=f"hicache replay, ratio {ratio:g}, {cache.config.eviction_policy}")
    except StorageUnavailableError as exc:
        raise ValueError(str(exc)) from None
