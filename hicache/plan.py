"""`hicache plan`: per-pool device and host sizes for a model, and whether they fit this host.

Exit status: 0 when the host pools fit this host's budget, 1 when they do not (the table
or the JSON says by how much), 2 for a bad flag. Only `run_plan` imports torch and the
pool specs, so ``hicache plan --help`` is fast.
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from hicache.config import HiCacheConfig, add_hicache_args

if TYPE_CHECKING:
    from hicache.sizing import CachePlan

GIB = 1 << 30


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="deepseek-v4-pro", help="preset name (default %(default)s)")
    p.add_argument("--layers", type=int, default=None, help="use only the first N layers")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--device-tokens", type=int, default=None, help="device anchor tokens")
    cap.add_argument("--device-gib", type=float, default=None, help="device GiB for the KV pools")
    p.add_argument("--json", action="store_true", help="print only the JSON plan")
    p.epilog = "exit status: 0 the host pools fit, 1 they do not, 2 a bad flag"
    add_hicache_args(p)


def format_plan(plan: CachePlan) -> str:
    int8 = plan.host_stack is not None
    head = (f"{'pool':<18}{'kind':<9}{'source':<8}{'layers':>7}{'row B/layer':>13}"
            f"{'dev rows':>11}{'dev GiB':>10}" + (f"{'host B/layer':>14}" if int8 else "")
            + f"{'host rows':>11}{'host GiB':>10}")
    host = f", host dtype int8 ({_int8_split(plan)})" if int8 else ""
    lines = [f"model {plan.stack.model}, page {plan.stack.page_size} tokens, "
             f"host/device ratio {plan.effective_ratio:.3f}{host}", head, "-" * len(head)]
    for p in plan.pools:
        lines.append(f"{p.name:<18}{p.kind:<9}{p.source or '-':<8}{p.num_layers:>7}{p.row_bytes:>13,}"
                     f"{p.device_rows:>11,}{p.device_bytes / GIB:>10.3f}"
                     + (f"{p.host_row_bytes:>14,}" if int8 else "")
                     + f"{p.host_rows:>11,}{p.host_bytes / GIB:>10.3f}")
    lines.append("-" * len(head))
    lines.append(f"{'total':<42}{'':>13}{'':>11}{plan.device_bytes_total / GIB:>10.3f}"
                 + ("" if not int8 else f"{'':>14}") + f"{'':>11}{plan.host_bytes_total / GIB:>10.3f}")
    lines += _state_lines(plan)
    verdict = "fit" if plan.fits else "do NOT fit (lower --hicache-ratio / --hicache-size)"
    lines.append(f"host budget: {plan.budget.describe()}\nhost pools {verdict}")
    return "\n".join(lines)


def _int8_split(plan: CachePlan) -> str:
    """Which pools the int8 host tier quantizes and which it keeps exact."""
    from host_pools.host_format import is_int8
    pools = plan.stack.data_pools()
    q = [p.name for p in pools if is_int8(p, plan.host.pool(p.name))]
    exact = [p.name for p in pools if p.name not in q]
    return f"int8 + fp32 scales: {', '.join(q)}" + (f"; exact: {', '.join(exact)}" if exact else "")


def _state_lines(plan: CachePlan) -> list[str]:
    """KV bytes per token beside each state root's bytes per snapshot (hybrid stacks)."""
    snaps = plan.snapshot_bytes()
    if not snaps:
        return []
    kv = plan.kv_bytes_per_token()
    host_kv = plan.kv_bytes_per_token(True)
    kv_text = f"KV {kv:,.0f} B per token (history pools, all layers" + (
        f"; {host_kv:,.0f} B on the int8 host)" if host_kv != kv else ")")
    lines = [kv_text]
    for root, size in snaps.items():
        worth = f" = the KV of {size / kv:,.0f} tokens" if kv else ""
        every = (f"; one per {plan.interval:,} tokens (--hicache-state-interval) adds {size / plan.interval:,.0f} B "
                 "per token" if plan.interval and plan.stack.pool(root).recurrent else "")
        pools = ", ".join(p.name for p in plan.stack if plan.stack.root_of(p.name).name == root)
        lines.append(f"state snapshot ({pools}): {size:,} B (exact on every tier){worth}{every}")
    return lines


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` subcommand: 0 when the host pools fit, 1 when they do not.

    Raises:
        ValueError: a bad flag (named), which the CLI prints as one line.
    """
    from hicache.build import check_backend_device
    from hicache.cli.checks import check_device_tokens, stack_from_flags, tokens_from_gib
    from hicache.sizing import plan_sizes

    config = HiCacheConfig.from_args(args)
    check_backend_device(config.io_backend)  # plan sizes this machine's pools: dma needs its GPU
    stack = stack_from_flags(args.model, args.layers)
    if args.device_gib is not None:
        tokens = tokens_from_gib(args.device_gib, stack, config)
    else:
        tokens = check_device_tokens(args.device_tokens if args.device_tokens is not None else 1 << 20, stack)
    plan = plan_sizes(stack, tokens, config)
    print(json.dumps(plan.to_json()) if args.json else format_plan(plan))
    return 0 if plan.fits else 1
