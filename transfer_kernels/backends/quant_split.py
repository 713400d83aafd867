"""Plans with quantized jobs (`codec.Int8Codec`): D2H quantizes in the gather, H2D
dequantizes in the scatter.

Every backend runs a plan's exact jobs as before and hands its quantized jobs to its
*quant backend* (`CopyBackend.quant_backend`): the same launch groups, one more launch
per group where both kinds are present (`execute_split`, `prepare_split`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from transfer_kernels.base import PartLaunches, PreparedPlan

if TYPE_CHECKING:
    from transfer_kernels.base import CopyBackend
    from transfer_kernels.plan import CopyPlan, LaunchGroups


def split_plan(plan: CopyPlan) -> tuple[list[int], list[int]]:
    """Indices of the plan's exact jobs and of its quantized jobs."""
    exact, quant = [], []
    for j, job in enumerate(plan.jobs):
        (quant if job.mode else exact).append(j)
    return exact, quant


def check_split(backend: CopyBackend, plan: CopyPlan) -> None:
    """``backend.check`` of the plan's exact jobs and its quant backend's check of the
    converting ones (a backend that hands converting jobs on checks both kinds)."""
    if not plan.has_quant:
        backend.check(plan)
        return
    exact, quant = split_plan(plan)
    if exact:
        backend.check(plan.subset(plan.jobs[j] for j in exact))
    backend.quant_backend(plan.device).check(plan.subset(plan.jobs[j] for j in quant))


def execute_split(backend: CopyBackend, plan: CopyPlan) -> None:
    """Run ``plan``'s exact jobs on ``backend`` and its quantized jobs on its quant backend
    (both checked before either runs)."""
    exact, quant = split_plan(plan)
    plans = [(backend, plan.subset(plan.jobs[j] for j in exact)),
             (backend.quant_backend(plan.device), plan.subset(plan.jobs[j] for j in quant))]
    plans = [(b, p) for b, p in plans if p.jobs]
    for b, p in plans:
        b.check(p)
    for b, p in plans:
        b.execute(p)


def prepare_split(backend: CopyBackend, plan: CopyPlan, groups: LaunchGroups) -> PreparedPlan:
    """``backend.prepare`` of a plan with quantized jobs: each kind prepared by its backend
    on its jobs' part of every group; a launch runs both parts of its group."""
    exact, quant = split_plan(plan)
    parts = []
    for b, idx in ((backend, exact), (backend.quant_backend(plan.device), quant)):
        if not idx:
            continue
        local = {j: i for i, j in enumerate(idx)}
        # tuples: hashable groups keep the kernel's layout cache hit from load to load
        sub_groups = tuple(tuple((local[j], layer) for j, layer in g if j in local) for g in groups)
        parts.append((b, plan.subset(plan.jobs[j] for j in idx), sub_groups))
    for b, p, _ in parts:
        b.check(p)
    return PartLaunches([b.prepare(p, g) for b, p, g in parts], len(groups))
