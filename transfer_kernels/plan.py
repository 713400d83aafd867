"""Kept only until hicache's controller (being moved into ``hicache/controller/``) imports
these names from `transfer_kernels.rows`; removed with that merge."""
from __future__ import annotations

from transfer_kernels.rows.plan import LaunchGroups, PlannedJob, exec_device

__all__ = ["LaunchGroups", "PlannedJob", "exec_device"]
