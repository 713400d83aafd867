"""Every tuned constant of the transfer layer, with where and how it was tuned.

GPU values were measured on one NVIDIA H100 80GB HBM3 (PCIe Gen5 x16, driver 580,
torch 2.11 + CUDA 13, triton 3.6) on 2026-11-23 with ``python bench/h2d.py`` and
``python bench/triton_grid.py`` (results under ``bench/results/``); the contiguous
pinned-copy limit there is 55 GB/s in both directions. Criterion: p50 GB/s of 256- and
1024-row batches of the real pool geometries. Re-tune on other machines with the same
two scripts.

* The copy engine (batched ``cudaMemcpyBatchAsync``) pays about 1.5 us per piece: it
  reaches the limit (52-55 GB/s) for pieces >= 64 KiB and falls to 1-25 GB/s for the
  1.7-37 KiB rows of DeepSeek-V4's compressed pools.
* The Triton kernel reads pinned host memory through UVA; with 64 programs it reaches
  48-51 GB/s H2D (0.89-0.92 of the limit) and 42-46 GB/s D2H on 37-128 KiB rows; 32
  programs give 37-41 GB/s H2D; 16 KiB tiles are slower than 8 KiB at every grid size.

CPU values were measured on the 2-core development VM (torch 2.13 CPU build) with
``python -m bench.h2d --quick``, criterion: p50 wall time of one call.
"""
from __future__ import annotations

# --- triton backend (H100, measured) ---
# Max programs of the persistent grid: the "SM budget" a transfer may occupy. 64 of
# 132 H100 SMs: llama-3.1-8b rows 50.6 GB/s H2D (0.92 of the limit) vs 41.2 with 32.
TRITON_MAX_PROGRAMS = 64
# Grid cap under the Triton interpreter (CPU): programs run one after another there and
# each costs ~3 ms of interpreter set-up, so a small grid is fastest (dev VM, p50).
TRITON_INTERPRET_MAX_PROGRAMS = 2
# Bytes one program moves per loop iteration (the tile); 4 warps x 32 lanes x 64 B.
# 16 KiB tiles were slower at 16/32/64 programs (H100 sweep).
TRITON_TILE_BYTES = 8192
# Smallest tile: one warp still issues 16-byte vectors (32 lanes x 16 B).
TRITON_MIN_TILE_BYTES = 512
# Bytes per thread per tile at which the launcher adds warps (up to TRITON_MAX_WARPS).
TRITON_BYTES_PER_WARP = 2048
TRITON_MAX_WARPS = 4

# --- auto backend on CUDA (H100, measured) ---
# A contiguous piece (one copy of the copy engine) at least this large goes to the copy
# engine; smaller or scattered pieces go to the triton kernel. Measured crossover: 37 KiB
# rows (v4 c4_kv) are faster on triton (48.6 vs 24.7 GB/s at 1024 rows), 64-128 KiB
# rows on the copy engine (52-55 vs 45-51 GB/s).
COPY_ENGINE_MIN_PIECE_BYTES = 64 * 1024
# A strided run (host page_first rows) of at least this many rows is one
# cudaMemcpy2DAsync; shorter ones go row by row into the batched copy.
COPY_ENGINE_2D_MIN_ROWS = 2

# --- auto backend on CPU (measured on the 2-core dev VM) ---
# On the CPU both backends are memcpy-like: the copy engine pays ~5 us of Python per run
# and per (layer, buffer), torch's index_select/index_copy_ moves ~1-4 GB/s. Crossover
# measured at 8 KiB per contiguous piece (p50 of one call, 1-256 scattered rows, 64 B -
# 64 KiB rows): below it "torch" wins, at and above it "copy_engine" wins.
CPU_COPY_ENGINE_MIN_PIECE_BYTES = 8 * 1024
