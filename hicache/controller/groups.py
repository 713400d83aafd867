"""`LoadGrouper`: a load's launch groups of consecutive model layers (>= ~1 MB each).

Backups (D2H) are one all-layer launch; loads (H2D) are one launch per group of
consecutive model layers, each followed by its layers' done-event, so the forward pass can
start on early layers while later ones still copy.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from host_pools.spec import Stack


class LoadGroups(NamedTuple):
    """A load's launch groups: consecutive model layers launched together.

    ``groups[g]`` lists the (job index, pool-local layer) pairs of model layers
    ``layers[g] .. layers[g + 1] - 1``.
    """

    groups: tuple[tuple[tuple[int, int], ...], ...]
    layers: tuple[int, ...]  # num_groups + 1 model-layer bounds


class LoadGrouper:
    """Launch groups of a stack's loads: consecutive model layers until a group moves at
    least ``min_bytes`` (0: one group per layer). Built once per size class of a load: the
    route that prepares the class keeps them (`hicache.controller.launcher`).

    A consumer of model layer ``i`` waits for its whole group: at most the rest of the
    group's layers, fewer than ``min_bytes`` plus one layer's bytes in all (a group closes
    at the first layer that takes it to ``min_bytes``); never for a later group.

    Args:
        stack: the pools.
        min_bytes: bytes a group moves at least (may be changed between batches).
    """

    def __init__(self, stack: Stack, min_bytes: int) -> None:
        self.stack, self.min_bytes = stack, min_bytes
        # per pool list: its bytes per model layer and its (job, layer) pairs per model
        # layer, facts of the stack read once
        self._bytes: dict[tuple[str, ...], np.ndarray] = {}
        self._pairs: dict[tuple[str, ...], tuple] = {}

    def groups(self, pools: tuple[str, ...], rows: tuple[int, ...]) -> LoadGroups:
        """The groups of a load moving ``rows[j]`` rows of pool ``pools[j]``, all layers:
        the greedy cut at ``min_bytes``."""
        per_layer = self._per_layer_bytes(pools) @ np.asarray(rows, dtype=np.int64)
        if self.min_bytes > 0 and per_layer.size:
            # layer i closes its group when the group's bytes reach min_bytes
            ends, acc = [], 0
            for i, b in enumerate(per_layer.tolist()):
                acc += b
                if acc >= self.min_bytes:
                    ends.append(i + 1)
                    acc = 0
            if not ends or ends[-1] != per_layer.size:
                ends.append(per_layer.size)
            bounds = (0, *ends)
        else:
            bounds = tuple(range(per_layer.size + 1))
        pairs = self._layer_pairs(pools)
        groups = tuple(tuple(pair for layer in range(a, b) for pair in pairs[layer])
                       for a, b in zip(bounds[:-1], bounds[1:]))
        return LoadGroups(groups, tuple(bounds))

    def _per_layer_bytes(self, pools: tuple[str, ...]) -> np.ndarray:
        """``[model layers, pools]``: bytes of one row of each pool in each model layer."""
        m = self._bytes.get(pools)
        if m is None:
            m = np.zeros((self.stack.num_model_layers, len(pools)), dtype=np.int64)
            for j, name in enumerate(pools):
                spec = self.stack.pool(name)
                m[list(spec.layer_ids), j] = spec.row_bytes
            self._bytes[pools] = m
        return m

    def _layer_pairs(self, pools: tuple[str, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
        """For each model layer, the (job index, pool-local layer) pairs it loads; job ``j``
        is pool ``pools[j]``."""
        got = self._pairs.get(pools)
        if got is None:
            per_layer: list[list[tuple[int, int]]] = [[] for _ in range(self.stack.num_model_layers)]
            for j, name in enumerate(pools):
                for local, model_layer in enumerate(self.stack.pool(name).layer_ids):
                    per_layer[model_layer].append((j, local))
            got = self._pairs[pools] = tuple(tuple(entries) for entries in per_layer)
        return got
