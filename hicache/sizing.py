"""Sizing: device and host rows of every pool of a stack, from the config.

Each own-indexed pool is a *root* with its own token space; every pool's rows are its
root's tokens divided by its ``tokens_per_row``:

    root                 device tokens (slots)                  host tokens
    anchor (kv)          device_tokens, whole pages             r x device anchor tokens
    swa (STATE)          swa_full_tokens_ratio x anchor tokens  r x device swa tokens
    conv (recurrent)     anchor tokens / state interval         r x device conv rows

A recurrent root (a linear-attention hybrid's ``conv``: one row is one snapshot of every
linear layer) holds one snapshot per ``--hicache-state-interval`` device tokens, the
interval at which a prefill saves them (`state_interval`).

``r`` is ``--hicache-ratio``; with ``--hicache-size G`` it is derived so the host bytes of
all pools come to G GB (1e9), which splits the bytes between anchor- and SWA-rooted pools
in the same proportion the ratio would.

Host bytes are those of the host format (``--hicache-host-dtype``, `hicache.host_dtype`):
with ``int8`` a ratio keeps its meaning (host tokens per device token) at about half the
host bytes of a bf16 pool, and a size (``--hicache-size``) holds about twice the tokens
(1.94x at head_dim 128, 1.88x at 64).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

from host_pools.memory import HostBudget, host_budget
from host_pools.spec import PoolKind, PoolSpec, Stack
from hicache.config import HiCacheConfig
from hicache.host_dtype import resolve_host_stack

# ~1.1e12 tokens: hundreds of times any device's KV capacity; above it a number is a typo
# (and x MAX_HICACHE_RATIO it stays a 64-bit integer)
MAX_DEVICE_TOKENS = 1 << 40
# tokens between recurrent-state snapshots when --hicache-state-interval is 0, rounded up to the
# page (docs/RESULTS.md, "The state interval": chosen by measurement on the shipped trace)
DEFAULT_STATE_INTERVAL = 2048


def state_interval(stack: Stack, config: HiCacheConfig) -> int:
    """Tokens between the snapshots a prefill saves: ``--hicache-state-interval``, or
    `DEFAULT_STATE_INTERVAL` rounded up to a whole page.

    Raises:
        ValueError: an interval that is not a multiple of the stack's page (naming the flag).
    """
    page = stack.page_size
    if config.state_interval == 0:
        return -(-DEFAULT_STATE_INTERVAL // page) * page
    if config.state_interval % page:
        raise ValueError(f"--hicache-state-interval: must be a multiple of the page ({page} tokens for "
                         f"{stack.model}), got {config.state_interval:,}")
    return config.state_interval


class PoolPlan(NamedTuple):
    """Rows and bytes of one pool on each tier (bytes cover all its layers)."""

    name: str
    kind: str
    source: str | None
    num_layers: int
    row_bytes: int
    device_rows: int
    device_bytes: int
    host_rows: int
    host_bytes: int
    host_row_bytes: int  # bytes of one host row of one layer (row_bytes unless int8)


@dataclass(frozen=True)
class CachePlan:
    """The sizing of one stack: per pool, totals, and the host budget it must fit."""

    stack: Stack
    pools: tuple[PoolPlan, ...]
    effective_ratio: float  # host/device tokens actually used (from --hicache-size if set)
    budget: HostBudget
    host_stack: Stack | None = None  # the host pools' specs (None: the device's, byte-exact)
    interval: int = 0  # tokens between snapshots of a recurrent state root (0: the stack has none)

    @property
    def host(self) -> Stack:
        """The specs the host pools are allocated with."""
        return self.stack if self.host_stack is None else self.host_stack

    @property
    def host_bytes_total(self) -> int:
        return sum(p.host_bytes for p in self.pools)

    @property
    def device_bytes_total(self) -> int:
        return sum(p.device_bytes for p in self.pools)

    @property
    def fits(self) -> bool:
        return self.host_bytes_total <= self.budget.budget_bytes

    def device_rows(self) -> dict[str, int]:
        return {p.name: p.device_rows for p in self.pools}

    def host_rows(self) -> dict[str, int]:
        return {p.name: p.host_rows for p in self.pools}

    def kv_bytes_per_token(self, host: bool = False) -> float:
        """Bytes (all layers) one anchor token costs in the history pools (host format if ``host``)."""
        return (self.host if host else self.stack).row_bytes_per_anchor_page() / self.stack.page_size

    def snapshot_bytes(self, host: bool = False) -> dict[str, int]:
        """Bytes (all layers) of one state snapshot per state root (host format if ``host``)."""
        return (self.host if host else self.stack).snapshot_bytes()

    def to_json(self) -> dict:
        return {"pools": [p._asdict() for p in self.pools], "host_bytes_total": self.host_bytes_total,
                "budget_bytes": self.budget.budget_bytes, "fits": self.fits,
                "kv_bytes_per_token": self.kv_bytes_per_token(), "host_kv_bytes_per_token": self.kv_bytes_per_token(True),
                "state_bytes_per_snapshot": self.snapshot_bytes(), "state_interval": self.interval or None}


def _root_scale(stack: Stack, root: PoolSpec, config: HiCacheConfig) -> float:
    """Device tokens (slots) of ``root`` per device anchor token."""
    if root is stack.anchor or root.kind is not PoolKind.STATE:
        return 1.0
    return 1.0 / state_interval(stack, config) if root.recurrent else config.swa_full_tokens_ratio


def _round(tokens: float, unit: int) -> int:
    return int(tokens // unit) * unit


def _root_unit(stack: Stack, root: PoolSpec) -> int:
    """Allocation unit of a root: a page for the anchor, a row otherwise."""
    return stack.page_size if root is stack.anchor else root.tokens_per_row


def device_root_tokens(stack: Stack, device_tokens: int, config: HiCacheConfig) -> dict[str, int]:
    """Device token slots of every own-indexed pool.

    Raises:
        TypeError: ``device_tokens`` is not an int.
        ValueError: ``device_tokens`` outside [one page, `MAX_DEVICE_TOKENS`], or a state
            root with less than one row (naming ``--swa-full-tokens-ratio`` or
            ``--hicache-state-interval``).
    """
    if not isinstance(device_tokens, numbers.Integral) or isinstance(device_tokens, bool):
        raise TypeError(f"device_tokens: must be an int, got {type(device_tokens).__name__} {device_tokens!r}")
    if device_tokens < stack.page_size:
        raise ValueError(f"device_tokens: need at least one page ({stack.page_size}), got {device_tokens}")
    if device_tokens > MAX_DEVICE_TOKENS:
        raise ValueError(f"device_tokens: at most {MAX_DEVICE_TOKENS:,} (past any device), got {device_tokens:,}")
    tokens = {r.name: _round(device_tokens * _root_scale(stack, r, config), _root_unit(stack, r))
              for r in stack.own_indexed}
    for r in stack.own_indexed:
        if tokens[r.name] == 0 and r.recurrent:
            raise ValueError(f"--hicache-state-interval: {state_interval(stack, config):,} tokens is more than the "
                             f"{device_tokens:,} device tokens, which then hold no {r.name} snapshot; lower it or "
                             "raise the device tokens")
        if tokens[r.name] == 0:  # only a scaled root (SWA) can round down to nothing
            raise ValueError(f"--swa-full-tokens-ratio: {config.swa_full_tokens_ratio:g} x {device_tokens:,} device "
                             f"tokens is less than one {r.name} row ({r.tokens_per_row} tokens); raise it or "
                             "the device tokens")
    return tokens


def _bytes_per_root_token(stack: Stack) -> dict[str, float]:
    out = {r.name: 0.0 for r in stack.own_indexed}
    for p in stack.data_pools():
        out[stack.root_of(p.name).name] += p.row_bytes * p.num_layers / p.tokens_per_row
    return out


def device_tokens_for_bytes(stack: Stack, device_bytes: int, config: HiCacheConfig) -> int:
    """Largest anchor token count whose device pools fit in ``device_bytes`` (``--device-gib``)."""
    per_root = _bytes_per_root_token(stack)
    per_anchor = sum(per_root[r.name] * _root_scale(stack, r, config) for r in stack.own_indexed)
    if per_anchor <= 0:
        raise ValueError("stack: holds no data, size it with --device-tokens")
    return _round(device_bytes / per_anchor, stack.page_size)


def plan_sizes(stack: Stack, device_tokens: int, config: HiCacheConfig,
               budget: HostBudget | None = None) -> CachePlan:
    """Rows and bytes per pool on device and host for ``device_tokens`` anchor tokens.

    Raises:
        TypeError: ``device_tokens`` is not an int.
        ValueError: ``device_tokens`` outside [one page, `MAX_DEVICE_TOKENS`].
    """
    dev = device_root_tokens(stack, device_tokens, config)
    hstack = resolve_host_stack(stack, config)
    per_root = _bytes_per_root_token(hstack)  # host bytes per token of each root at ratio 1
    ratio = config.hicache_ratio
    if config.hicache_size_gb > 0:
        host_data = sum(dev[name] * per_root[name] for name in dev)
        ratio = config.hicache_size_gb * 1e9 / host_data if host_data else ratio
    host = {r.name: _round(dev[r.name] * ratio, _root_unit(stack, r)) for r in stack.own_indexed}
    rows = []
    for p in stack:
        root = stack.root_of(p.name).name
        d_rows, h_rows = dev[root] // p.tokens_per_row, host[root] // p.tokens_per_row
        h_row = hstack.pool(p.name).row_bytes
        rows.append(PoolPlan(p.name, p.kind.value, p.indices_from, p.num_layers, p.row_bytes,
                             d_rows, d_rows * p.row_bytes * p.num_layers, h_rows,
                             h_rows * h_row * p.num_layers, h_row))
    if budget is None:
        budget = host_budget(config.host_headroom_bytes, config.ranks_per_host)
    interval = state_interval(stack, config) if any(r.recurrent for r in stack.own_indexed) else 0
    return CachePlan(stack, tuple(rows), ratio, budget, None if hstack is stack else hstack, interval)
