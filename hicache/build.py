"""`hicache.build`: device pools, host group and controller in one call (server start-up).

This module is imported with the ``hicache`` package (``hicache.build`` is the function),
so it imports torch and the pools only when `build` runs: ``import hicache`` and the
``hicache`` command's ``--help`` stay free of torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hicache.config import HiCacheConfig, flag_error

if TYPE_CHECKING:
    import torch

    from host_pools.group import HostPoolGroup
    from host_pools.memory import HostBudget
    from host_pools.spec import Stack
    from hicache.controller import HybridCacheController
    from hicache.device_pool import DevicePool
    from hicache.sizing import CachePlan


@dataclass(frozen=True)
class HiCache:
    """Everything a server holds for the hierarchical cache of one model."""

    stack: Stack
    config: HiCacheConfig
    plan: CachePlan
    device_pools: dict[str, DevicePool]
    host_group: HostPoolGroup
    controller: HybridCacheController

    def close(self) -> None:
        """Wait for in-flight copies, then unpin host memory (call at shutdown; buffers go
        with their last reference). Further transfers raise ``RuntimeError``."""
        self.controller.close()


def build_device_pools(stack: Stack, device_rows: dict[str, int], device: torch.device) -> dict[str, DevicePool]:
    """Fresh device pools for every pool of ``stack`` (the anchor allocates whole pages)."""
    from hicache.device_pool import DevicePool
    pools = {}
    for p in stack:
        page = stack.page_size if p is stack.anchor else None
        if p.has_data:
            pools[p.name] = DevicePool.allocate(p, device_rows[p.name], device, page_size=page)
        else:
            pools[p.name] = DevicePool.logical(p, device_rows[p.name] * p.tokens_per_row, device, stack.page_size)
    return pools


def build(stack: Stack, device_tokens: int, config: HiCacheConfig | None = None,
          device: str | torch.device = "cuda", *, budget: HostBudget | None = None,
          backend: Any = None) -> HiCache:
    """Assemble device pools, the host group (one reservation, inside the budget) and the controller.

    Args:
        stack: the model's pools (``hicache.models``).
        device_tokens: device anchor token capacity; other pools are sized from it.
        config: sizes, layout, backend; defaults to ``HiCacheConfig()``.
        device: ``"cuda"`` (host memory pinned) or ``"cpu"`` (CPU mode, plain memory).
        budget: host-memory budget override (tests); default from psutil/cgroup and config.
        backend: transfer backend override (name or instance), e.g. a fault injector.
    Returns:
        `HiCache` with device pools and host pools keyed by pool name.
    Raises:
        HostMemoryError: host pools do not fit the budget (nothing stays allocated).
        ValueError: bad sizes, or an io backend that cannot run here (naming
            ``--hicache-io-backend``; checked before anything is allocated).
    """
    import torch

    from host_pools.group import HostPoolGroup
    from hicache.controller import HybridCacheController
    from hicache.host_dtype import log_host_stack
    from hicache.sizing import plan_sizes

    config = config or HiCacheConfig()
    check_backend_usable(config.io_backend if backend is None else backend)
    if backend is None:  # the flag's dma; an explicit backend= may run dma's CPU stand-in (tests)
        check_backend_device(config.io_backend, device)
    dev = torch.device(device)
    plan = plan_sizes(stack, device_tokens, config, budget)
    log_host_stack(stack, plan.host)  # which pools are int8 with --hicache-host-dtype int8
    host_group = HostPoolGroup.allocate(plan.host, plan.host_rows(), config.mem_layout, plan.budget,
                                        pin=dev.type == "cuda")
    device_pools = build_device_pools(stack, plan.device_rows(), dev)
    controller = HybridCacheController(device_pools, host_group, config, backend=backend)
    return HiCache(stack, config, plan, device_pools, host_group, controller)


def triton_problem() -> str | None:
    """Why the ``"triton"`` backend cannot run in this process, or ``None`` when it can."""
    from transfer_kernels.backends.triton import kernel_module
    from transfer_kernels.cuda.abi import triton_importable
    if not triton_importable():
        return "the triton package is not installed"
    try:
        kernel_module()  # imports triton and builds the kernel's interpreted twin
    except (ImportError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_backend_device(backend: str, device: Any = None) -> None:
    """Refuse ``--hicache-io-backend dma`` without a CUDA device: ``device`` is not one, or
    (``None``: any device of this process) this torch sees none.

    Raises:
        ValueError: naming ``--hicache-io-backend``, why, and the backends that work.
    """
    import torch
    if backend != "dma":
        return
    if device is not None and torch.device(device).type != "cuda":
        problem = f"the device is {device}"
    elif not torch.cuda.is_available():
        problem = f"this torch, {torch.__version__}, sees no CUDA device"
    else:
        return
    raise flag_error("io_backend", f"'dma' needs CUDA ({problem}): it stages pages by DMA between pinned host "
                                   "memory and a GPU; use auto, triton, copy_engine or torch")


def check_backend_usable(backend: Any) -> None:
    """Refuse, before anything is allocated, an io backend named by the config that cannot run.

    Only names are checked (an instance is the caller's); ``"auto"`` falls back by itself
    (copy engine without triton), so only ``"triton"`` can be unusable (``"dma"`` without
    CUDA: `check_backend_device`).

    Raises:
        ValueError: naming ``--hicache-io-backend``, why, and the backends that work.
    """
    if backend == "triton" and (problem := triton_problem()) is not None:
        raise flag_error("io_backend", f"'triton' cannot run here ({problem}); install triton, "
                                       "or use auto, copy_engine or torch")
