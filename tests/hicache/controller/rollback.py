"""Rollback tests' fault placement: fail a load's launch group AFTER earlier groups ran.

The group is computed from what the controller itself will launch (its pool sets, rows
and ``LoadGrouper``), so a test keeps failing a later group whatever the grouping's tuning
becomes, and refuses to run (assertion) when the load has too few groups for it.
"""
from __future__ import annotations

from typing import Any

import torch

from hicache.controller.batch import Op
from hicache.controller.groups import LoadGroups


def load_groups(ctrl: Any, host_kv: torch.Tensor, extra: dict | None = None) -> LoadGroups:
    """The launch groups ``ctrl`` will use for a load of ``host_kv`` (+ ``extra``)."""
    src = {ctrl.stack.anchor.name: host_kv, **(extra or {})}
    src = {n: s for n, s in src.items() if s.numel()}
    planner = ctrl._planners["h2d"]
    pool_set, _, _, rows = planner.rows([Op(0, "h2d", src, src)])
    return ctrl.load_groups.groups(pool_set.pools, rows)


def arm_later_group(ctrl: Any, faulty: Any, host_kv: torch.Tensor, extra: dict | None = None,
                    min_groups: int = 2) -> tuple[int, int]:
    """Make ``faulty`` (a ``FaultyBackend``, ``ctrl.backend``) fail the LAST launch group
    of the next load of ``host_kv``; the load must have at least ``min_groups`` groups.

    Returns:
        ``(group, first_layer)``: the failing group and its first model layer (layers
        before it were copied before the fault).
    """
    groups = load_groups(ctrl, host_kv, extra)
    count = len(groups.groups)
    assert count >= min_groups >= 2, f"the load has {count} launch groups, the test needs {min_groups}"
    assert all(groups.groups), "every group launches"
    faulty.fail_on_launch = faulty.attempts + count  # each group's launch is an attempt
    return count - 1, groups.layers[count - 1]


def landed_before(cache: Any, dev: dict, expected: dict, first_layer: int) -> bool:
    """True when every pool's rows at ``dev`` hold ``expected`` for the model layers
    before ``first_layer`` (the groups that ran before the fault), and at least one such
    layer exists."""
    rows = cache.stack.derive_rows(dev)
    seen = 0
    for name, r in rows.items():
        views = cache.device_pools[name].row_views()
        for local, layer in enumerate(cache.stack.pool(name).layer_ids):
            if layer >= first_layer:
                continue
            seen += 1
            for v, e in zip(views[local], expected[name][local]):
                if not torch.equal(v.index_select(0, r.to(v.device)).cpu(), e.cpu()):
                    return False
    return seen > 0
