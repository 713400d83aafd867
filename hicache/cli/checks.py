"""Checks of the flags `hicache plan` and `hicache replay` share; every error names its flag.

    flag              allowed
    --model           a preset (hicache.models.PRESETS)
    --layers          1 .. the model's layer count
    --device          cpu, cuda or cuda:N (replay; CUDA present and N below the device count)
    --device-tokens   one page .. MAX_DEVICE_TOKENS; replay: the pools fit the device's free memory
    --device-gib      finite, > 0, at least one page and at most MAX_DEVICE_TOKENS tokens' worth
    --hicache-ratio   (replay) at most MAX_SWEEP ratios: each is a whole run of the workload

All raise ``ValueError``, which the CLI prints as one line (exit status 2).
"""
from __future__ import annotations

import math

import torch

from host_pools.spec import Stack
from hicache.config import HiCacheConfig
from hicache.models import PRESETS, preset
from hicache.sizing import MAX_DEVICE_TOKENS, CachePlan, device_root_tokens, device_tokens_for_bytes

GIB = 1 << 30
MAX_SWEEP = 64  # ratios of one replay sweep


def check_sweep(ratios: list[float]) -> None:
    """``--hicache-ratio``'s list of a replay sweep: at most `MAX_SWEEP` runs."""
    if len(ratios) > MAX_SWEEP:
        raise ValueError(f"--hicache-ratio: at most {MAX_SWEEP} ratios (each a whole run of the workload), "
                         f"got {len(ratios)}")


def stack_from_flags(model: str, layers: int | None) -> Stack:
    """The preset named by ``--model`` cut to ``--layers`` (``None``: all of them)."""
    if model not in PRESETS:
        raise ValueError(f"--model: unknown preset {model!r}; known presets: {', '.join(sorted(PRESETS))}")
    total = PRESETS[model].num_layers
    if layers is not None and not 1 <= layers <= total:
        raise ValueError(f"--layers: {model} has {total} layers; must be in [1, {total}], got {layers}")
    return preset(model, layers)


def default_layers(model: str) -> int:
    """``--layers`` when not given: the fewest first layers holding every pool of the model,
    at least 2 (4 for DeepSeek-V4: SWA-only, CSA and HCA layers all present).

    Raises:
        ValueError: an unknown ``--model``.
    """
    full = {p.name for p in stack_from_flags(model, None)}
    total = PRESETS[model].num_layers
    least = min(total, 4 if model.startswith("deepseek-v4") else 2)
    return next(n for n in range(least, total + 1) if {p.name for p in preset(model, n)} == full)


def check_device_tokens(tokens: int, stack: Stack, flag: str = "--device-tokens") -> int:
    """``tokens`` if it lies in [one page, MAX_DEVICE_TOKENS]."""
    if not stack.page_size <= tokens <= MAX_DEVICE_TOKENS:
        raise ValueError(f"{flag}: must be in [{stack.page_size} (one page), {MAX_DEVICE_TOKENS:,}] "
                         f"device tokens, got {tokens:,}")
    return tokens


def tokens_from_gib(gib: float, stack: Stack, config: HiCacheConfig) -> int:
    """Device anchor tokens whose pools fit ``--device-gib`` GiB."""
    if not math.isfinite(gib) or gib <= 0:
        raise ValueError(f"--device-gib: must be a finite number > 0, got {gib}")
    if gib * GIB > MAX_DEVICE_TOKENS * 1e6:  # far past any device; keeps the int conversion sane
        raise ValueError(f"--device-gib: {gib:g} GiB is past any device (at most {MAX_DEVICE_TOKENS:,} tokens)")
    tokens = check_device_tokens(device_tokens_for_bytes(stack, int(gib * GIB), config), stack, "--device-gib")
    try:  # a scaled root (SWA) must get one row too: name the flag the user gave
        device_root_tokens(stack, tokens, config)
    except ValueError as exc:
        raise ValueError(f"--device-gib: {gib:g} GiB gives {tokens:,} device tokens, too few for every "
                         f"pool ({exc})") from None
    return tokens


def parse_device(text: str) -> torch.device:
    """``--device``: cpu, cuda or cuda:N, CUDA only where present (``cuda`` becomes ``cuda:<current>``)."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: must be cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device: {text!r} asked for, but this torch sees no CUDA device "
                             f"(torch {torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"--device: {text!r}: only {count} CUDA device(s), cuda:0 .. cuda:{count - 1}")
        if dev.index is None:  # explicit, so it compares equal to the device of the tensors made there
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_fits_device(plan: CachePlan, device: torch.device) -> None:
    """The device pools must fit the device's free memory (CPU mode: with the host pools, the budget)."""
    need = plan.device_bytes_total
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        where = f"{device} has {free / GIB:.2f} GiB free"
    else:  # CPU mode: the "device" pools are host memory too, next to the host pools
        free = plan.budget.budget_bytes - plan.host_bytes_total
        where = (f"in CPU mode they share this machine's budget ({plan.budget.budget_bytes / GIB:.2f} GiB, "
                 f"{plan.budget.headroom_bytes / GIB:.2f} GiB of --hicache-host-headroom kept free) "
                 f"with the host pools ({plan.host_bytes_total / GIB:.2f} GiB)")
    if need > free:
        raise ValueError(f"--device-tokens: the device pools need {need / GIB:.2f} GiB; {where}. "
                         "Lower --device-tokens (or --layers, --hicache-ratio)")
