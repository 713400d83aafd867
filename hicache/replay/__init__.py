"""`hicache replay`: request traces through the hierarchical cache, hit rates and transfers, bytes checked.

The names below load on first access (PEP 562): importing ``hicache.replay.args`` for the
command's ``--help`` must not import torch through this package.
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> the module of this package that defines it
_LAZY = {
    "add_replay_args": "args", "default_storage_dir": "args",
    "replay_one": "cli", "run_replay": "cli",
    "ContentModel": "content", "ReplayMismatch": "content", "prefix_hashes": "content", "state_seed": "content",
    "JSON_KEYS": "report", "format_table": "report", "json_row": "report",
    "Replayer": "run", "RunStats": "run",
    "Request": "workload", "load_trace": "workload", "parse_line": "workload",
    "WORKLOADS": "builtin", "chat_workload": "builtin", "shared_prompts_workload": "builtin",
    "agents_workload": "builtin", "Bounds": "bounds", "TraceBounds": "bounds",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = sorted(_LAZY)
