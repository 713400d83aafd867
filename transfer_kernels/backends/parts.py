"""Several backends' steps over one set of launch groups, each on some of a plan's jobs:
the converting split (`CopyBackend._lay_out_split`: exact jobs on the backend, int8 ones on
its quant backend) and ``auto``'s inner backends. Group g launches group g of every part
that has it; each part's backend counts its own launches."""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from transfer_kernels.backends.launches import Kernel, Prepared


class PartKernel(Kernel):
    """The kernels of several parts (``parts``: (kernel, the plan's job indices))."""

    def __init__(self, parts: Sequence[tuple[Kernel, tuple[int, ...]]], num_groups: int) -> None:
        self.parts = tuple(parts)
        self.live = tuple(any(k.live[g] for k, _ in self.parts) for g in range(num_groups))
        self.counts = tuple(c for k, _ in self.parts for c in k.counts)

    def bind(self, lanes, src_rows, dst_rows) -> Any:
        bound = [(k.bind([lanes[i] for i in idx], [src_rows[i] for i in idx], [dst_rows[i] for i in idx]),
                  k.live) for k, idx in self.parts]
        return PartLauncher([(b, live) for b, live in bound if b is not None])


class PartLauncher(NamedTuple):
    """The launchers of a `PartKernel`'s parts, with their ``live``."""

    parts: list

    def launch(self, group: int) -> None:
        for launcher, live in self.parts:
            if live[group]:
                launcher.launch(group)


def part_prepared(parts: Sequence[tuple[Prepared, tuple[int, ...]]], num_groups: int) -> Prepared:
    """One prepared object of several parts' (each: its prepared object over the jobs
    ``idx`` of the plan, numbered within its part): their kernels as one `PartKernel`, their
    rings, staged jobs and swaps renumbered to the plan's jobs."""
    rings, swaps, stages = [], [], []
    for p, idx in parts:
        rings += [lay._replace(jobs=tuple(idx[j] for j in lay.jobs)) for lay in p.rings]
        swaps += [(idx[j], *rest) for j, *rest in p.swaps]
        stages += [st._replace(job=idx[st.job]) for st in p.stages]
    kernel = PartKernel([(p.kernel, idx) for p, idx in parts], num_groups)
    return Prepared(kernel, tuple(rings), tuple(swaps), tuple(stages),
                    tuple(c for p, _ in parts for c in p.counts))  # outer counters (dma) too
