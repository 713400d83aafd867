#!/usr/bin/env bash
# `make run`: the main job. One `hicache replay` of the flagship model, DeepSeek-V4 Flash
# (4 layers: every pool family: sliding window, compressed KV, indexer keys, compressor
# states), through the whole hierarchy: device pools, pinned host pools at host ratios
# 1, 2 and 4 (after the device-only baseline, ratio 0) and a file storage tier below the
# host. The built-in multi-turn chat workload (333 requests, 1.1 M prompt tokens); every
# page that comes back is checked byte for byte. The last line is the verdict.
#
# Bounded: about 15-60 s on a 2-core VM; the store is a fresh folder under the git-ignored
# bench/results/local/, capped at 1 GB (--hicache-storage-capacity) and removed at the end,
# so a second run starts cold too. Extra arguments go to `hicache replay` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
parent="${HICACHE_RUN_DIR:-bench/results/local}"  # where the scratch store goes (tests: their tmp folder)
mkdir -p "$parent"
store=$(mktemp -d -p "$parent" run-store.XXXXXX)  # 0700: the file store's own rule
trap 'rm -rf "$store"' EXIT
"$PY" -m hicache.cli replay --model deepseek-v4-flash --layers 4 --hicache-ratio 1,2,4 \
    --hicache-storage-backend file --hicache-storage-dir "$store" --hicache-storage-capacity 1 "$@"
