"""Where the replay's prefill saves state snapshots (hybrid stacks), one rule for the
replay (`hicache.replay.run`) and its bounds (`hicache.replay.bounds`).

A hit must end on a boundary with a snapshot (`hicache.radix.hybrid`), and a prefill can
only save snapshots where it computes: past the tokens it restored. So a request whose
hit ends at ``start`` and whose prompt (whole pages) ends at ``end`` saves:

    recurrent state (linear-attention hybrids)   end, and every multiple of the state
                                                 interval in (start, end)
    windowed state (DeepSeek-V4)                 end, and the last multiple of the
                                                 interval in (start, end): by default the
                                                 last 512-token block boundary, where the
                                                 next turn of a Mooncake session branches off

``--hicache-state-interval`` sets the interval of both (a windowed stack given the flag
saves at every multiple too); 0 is `hicache.sizing.state_interval`'s default for a
recurrent stack and the trace's 512-token block for a windowed one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from host_pools.spec import Stack
from hicache.config import HiCacheConfig
from hicache.replay.workload import BLOCK_TOKENS
from hicache.sizing import state_interval


@dataclass(frozen=True)
class SnapshotRule:
    """Boundaries a prefill saves (module docstring).

    Attributes:
        interval: tokens between saved boundaries, a multiple of the page.
        every: every multiple in the computed part (True) or only the last one.
    """

    interval: int
    every: bool

    @classmethod
    def of(cls, stack: Stack, config: HiCacheConfig) -> "SnapshotRule | None":
        """The rule of ``stack`` under ``config`` (``None``: no state snapshots).

        Raises:
            ValueError: an interval that is not a multiple of the page (naming the flag).
        """
        roots = [r for r in stack.own_indexed if r.name in stack.snapshot_slots]
        if not roots:
            return None
        if any(r.recurrent for r in roots) or config.state_interval:
            return cls(state_interval(stack, config), True)
        return cls(math.lcm(BLOCK_TOKENS, stack.page_size), False)  # a block boundary that is a page's

    def boundaries(self, start: int, end: int) -> list[int]:
        """Token boundaries a prefill from ``start`` to ``end`` saves, ascending (none when
        nothing is computed)."""
        if end <= start:
            return []
        step = self.interval
        if self.every:
            inner = [k * step for k in range(start // step + 1, (end - 1) // step + 1)]
        else:
            block = end - end % step
            inner = [block] if start < block < end else []
        return inner + [end]
