"""The other sides of `bench/tree.py`'s rounds, each in a subprocess: SGLang's
(`bench/sglang_anchor.py` in the interpreter that has SGLang 0.5.23) and ``--before``'s
(`bench/tree.py --emit-json` with another checkout's packages first on its path, through
`CODE_ENV`). Standard library only: `bench/tree.py` reads `CODE_ENV` before it imports hicache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CODE_ENV = "HICACHE_TREE_BENCH_CODE"  # the checkout whose packages `bench/tree.py --emit-json` imports


def anchor_round(python: str, anchor: Path, pages: list[int], clock: str, mean_turn_tokens: float) -> dict:
    """One round of SGLang's side (``bench/sglang_anchor.py`` in its interpreter), per case
    (``mean_turn_tokens``: a turn's sequence on average, for the same-work figure)."""
    cmd = [python, str(HERE / "sglang_anchor.py"), "--anchor", str(anchor),
           "--pages", *map(str, pages), "--clock", clock]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"SGLang anchor failed (exit {proc.returncode}): {proc.stderr[-2000:]}{proc.stdout[-500:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"sglang": data["sglang"]}
    for host, rows in (("none", data["no_host_tier"]), ("host", data["host_tier"])):
        for row in rows:
            per_turn = row["match_prefix_mean_us"] + row["path_device_indices_mean_us"] + row["insert_mean_us"]
            got = {"mtokens_per_s": row["tokens_per_s"] / 1e6,
                   "mtokens_per_s_same_work": mean_turn_tokens / per_turn,
                   "match_us": row["match_prefix_mean_us"], "device_indices_us": row["path_device_indices_mean_us"],
                   "insert_us": row["insert_mean_us"], "evict_us": row["evict_us"]}
            if host == "host":
                got["poll_step_us"] = row["check_hicache_events_mean_us"]
                got["load_back_us_per_token"] = (row["load_back_mean_us"] * row["load_backs"] / row["load_back_tokens"]
                                                 if row["load_backs"] else None)
            out[(host, row["page_size"])] = got
    return out


def before_round(before: Path, pages: list[int], clock: str) -> dict:
    """One round of ``--before``'s tree (LRU, the order every checkout has): `bench/tree.py`
    run again in a subprocess with that checkout's code (checked: it imported from there),
    per case."""
    cmd = [sys.executable, str(HERE / "tree.py"), "--emit-json", "--hicache-eviction-policy", "lru",
           "--pages", *map(str, pages), "--clock", clock]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, CODE_ENV: str(before)})
    if proc.returncode:
        raise RuntimeError(f"--before side failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if Path(data["code"]) != before.resolve():
        raise RuntimeError(f"--before side imported hicache from {data['code']}, not {before}")
    return {(host, page): row for host, page, row in data["cases"]}
