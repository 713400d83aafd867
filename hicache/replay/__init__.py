"""`hicache replay`: request traces through the hierarchical cache, hit rates and transfers, bytes checked."""
from hicache.replay.cli import add_replay_args, replay_one, run_replay
from hicache.replay.content import ContentModel, ReplayMismatch, prefix_hashes, state_seed
from hicache.replay.report import JSON_KEYS, format_table, json_row
from hicache.replay.run import Replayer, RunStats
from hicache.replay.workload import Request, chat_workload, load_trace, parse_line

__all__ = [
    "JSON_KEYS", "ContentModel", "ReplayMismatch", "Replayer", "Request", "RunStats", "add_replay_args",
    "chat_workload", "format_table", "json_row", "load_trace", "parse_line", "prefix_hashes", "replay_one",
    "run_replay", "state_seed",
]
