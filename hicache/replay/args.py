"""The flags of `hicache replay`, and where its file store lives by default.

Kept free of torch and the cache (only `hicache.config`), so ``hicache replay --help`` is
fast; `hicache.replay.cli` runs the replay.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from bounded_input import STALL_S
from hicache.config import (EVICTION_POLICIES, HOST_DTYPES, IO_BACKENDS, LOAD_POLICIES, MEM_LAYOUTS, WRITE_POLICIES,
                            HiCacheConfig, add_storage_args)

WORKLOAD_NAMES = ("chat", "shared-prompts", "agents", "agents-hinted", "sessions")  # = builtin.WORKLOADS (no numpy here)
HINT_MODES = ("on", "off", "wrong")  # --hints: the trace's hints, none, a bad client's (hicache.replay.hintplay)


DEFAULT_CAPACITY_GB = 16.0  # the README's storage replay (2 ratios of DeepSeek-V4 Flash) writes ~10 GB
FREE_DISK_FRACTION = 0.25  # of the free space where the default store lives, if that is less


def default_storage_dir() -> Path:
    """Where the file store lives when ``--hicache-storage-dir`` is not given."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hicache" / "storage"


def ratios(text: str) -> list[float]:
    """``--hicache-ratio``: ``"1,2,4"`` -> [1.0, 2.0, 4.0], every one finite and > 0."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"need numbers like 1,2,4, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"every ratio must be a finite number > 0, got {text!r}")
    return values


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated list of names, each one of ``allowed``, without repeats."""
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad)) or repr(text)}; "
                                         f"give one or more of {', '.join(allowed)}, comma-separated")
    return names


def policies(text: str) -> list[str]:
    """``--hicache-eviction-policy``: ``"lru,lfu"`` -> ["lru", "lfu"], each one of `EVICTION_POLICIES`."""
    return _names(text, EVICTION_POLICIES, "policy")


def hint_modes(text: str) -> list[str]:
    """``--hints``: ``"off,on"`` -> ["off", "on"], each one of `HINT_MODES`."""
    return _names(text, HINT_MODES, "mode")


def add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default=None, help="Mooncake JSONL trace (.jsonl, .jsonl.xz or .jsonl.gz; a line over "
                                                 "1 MiB or a file over 256 MiB is refused; default: --workload)")
    p.add_argument("--workload", default=None, choices=WORKLOAD_NAMES,
                   help="a built-in workload instead of --trace (default chat): chat (multi-turn conversations), "
                        "shared-prompts (many users on a few long system prompts, short private tails), agents "
                        "(agents re-reading a growing context), agents-hinted (agent sessions between tool calls, "
                        "with other traffic, carrying an agent framework's hints), sessions (multi-turn sessions back "
                        "after heavy-tailed gaps among one-off prompts, in the Mooncake trace's format)")
    p.add_argument("--model", default="deepseek-v3", help="preset name (default %(default)s)")
    p.add_argument("--layers", type=int, default=None,
                   help="use only the first N layers (default: the fewest that hold every pool family of the "
                        "model, at least 2; 4 for deepseek-v4-*, 4 for qwen3.5 / qwen3-next, 8 for nemotron-h)")
    p.add_argument("--device-tokens", type=int, default=None,
                   help="device anchor tokens (default 32768; 1048576 with --trace)")
    p.add_argument("--hicache-ratio", type=ratios, default=[1.0, 2.0, 4.0],
                   help="host/device ratio, or a list to sweep (default 1,2,4)")
    default_policy = HiCacheConfig().eviction_policy
    p.add_argument("--hicache-eviction-policy", dest="eviction_policies", type=policies, default=[default_policy],
                   help=f"which leaf the device and host tiers evict first, or a list to sweep side by side: "
                        f"{', '.join(EVICTION_POLICIES)} (default {default_policy})")
    p.add_argument("--hints", dest="hint_modes", type=hint_modes, default=["on"],
                   help="the trace's client hints (a line's optional 'hints'): on (sent), off (ignored), wrong (a "
                        "bad client's: retains and releases swapped), or a list to sweep side by side (default on)")
    p.add_argument("--hicache-max-retained-ratio", dest="max_retained_ratio", type=float,
                   default=HiCacheConfig().max_retained_ratio,
                   help="share of each tier client hints may retain, 0-1 (default %(default)s)")
    p.add_argument("--hicache-write-policy", dest="write_policy", default=HiCacheConfig().write_policy,
                   help=f"{', '.join(WRITE_POLICIES)} (default %(default)s)")
    p.add_argument("--hicache-io-backend", dest="io_backend", default="auto", help=", ".join(IO_BACKENDS))
    p.add_argument("--hicache-mem-layout", dest="mem_layout", default="page_first", help=", ".join(MEM_LAYOUTS))
    p.add_argument("--hicache-host-dtype", dest="host_dtype", default="auto",
                   help=f"host format, one of {', '.join(HOST_DTYPES)} (int8: bf16/fp16 history pools as int8 + "
                        "fp32 scales, ~0.53x the host bytes per token; the content replayed is then exact in int8)")
    p.add_argument("--swa-full-tokens-ratio", type=float, default=0.1, help="DeepSeek-V4 device SWA share")
    p.add_argument("--hicache-state-interval", dest="state_interval", type=int, default=0,
                   help="hybrid stacks: tokens between the state snapshots a prefill saves (a multiple of the page); "
                        "0 = the measured default for recurrent state, the last 512-token boundary for DeepSeek-V4")
    defaults = HiCacheConfig()
    p.add_argument("--device-profile", dest="device_profile", default=defaults.device_profile, metavar="NAME|FILE",
                   help="the device whose time to first token is estimated: h100, h200, b200 or a profile JSON "
                        "file (hicache/cost/profiles/; default %(default)s); the estimates are of the whole model "
                        "(every layer, whatever --layers replays)")
    p.add_argument("--hicache-load-policy", dest="load_policy", default=defaults.load_policy, choices=LOAD_POLICIES,
                   help="cost (default): load only the part of a match whose estimated load time beats "
                        "recomputing it on --device-profile; always: load everything found")
    p.add_argument("--copy-rates", action="store_true",
                   help="also show the replay's own copy GB/s (this machine's copies, launch to completion)")
    p.add_argument("--hicache-host-headroom", dest="host_headroom_gb", type=float, default=None,
                   help="GiB of host memory left free, as a server's flag (default min(10 GiB, 10%% of RAM)); "
                        "lower it to replay on a small machine")
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                   help="refuse a trace whose input_length passes N tokens, or what the sweep's largest cache "
                        "(device + host + storage) holds, before anything is allocated (default 1,048,576)")
    p.add_argument("--trace-stall-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"refuse a trace that gives no request for this long: a FIFO with no writer, a pipe gone "
                        f"quiet, only blank lines (default {STALL_S:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in workload")
    p.add_argument("--allow-device-only", action="store_true",
                   help="accept a replay in which nothing came back from host or storage (default: exit 1, "
                        "as no restore was checked; the verdict says NOT CHECKED)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine more threads stall)")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also plot hit rate vs ratio, with the bounds, to FILE (.png, .pdf, .svg...: any format "
                        "matplotlib writes; needs matplotlib; default: no plot); its folder must exist; the format, "
                        "matplotlib and the path are checked before the first run")
    p.add_argument("--json", action="store_true", help="print only the JSON results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.epilog = ("exit status: 0 done, 1 a byte mismatch, a run whose every transfer failed, a run that could not "
                "get its memory, or nothing restored from host or storage (unless --allow-device-only), "
                "2 a bad flag or input, 130 Ctrl-C, 143 SIGTERM")
    add_replay_storage_args(p)


def add_replay_storage_args(p: argparse.ArgumentParser) -> None:
    """The ``--hicache-storage-*`` flags, with the replay's defaults (capacity: unset, so
    that the default store gets `default_capacity_gb` and an explicit 0 means unlimited)."""
    add_storage_args(p.add_argument_group(
        "storage tier (every run with a host tier; needs --hicache-storage-backend, the other storage "
        f"flags are refused without it; the file store defaults to {default_storage_dir()}, capped at "
        f"min({DEFAULT_CAPACITY_GB:g} GB, {FREE_DISK_FRACTION:.0%} of the free disk); the model id "
        "defaults to one derived from --model and --layers)"))
    p.set_defaults(storage_capacity_gb=None)
