"""Every tuned constant of the transfer layer, with where and how it was tuned.

GPU values are INITIAL values taken from public H100 SXM (PCIe Gen5 x16) numbers, not
yet measured by this project (no GPU was available when they were set); re-tune them
with ``python -m bench.h2d`` on the target machine:

* the copy engine reaches ~50 GB/s H2D only for pieces >= ~32 KiB and falls off a cliff
  below ~28 KiB (per-cudaMemcpyAsync overhead of a few microseconds dominates);
* SM kernels reading pinned host memory through UVA reach ~40-50 GB/s with 16-32 SMs
  even for small scattered pieces, and leave the other SMs to compute.

CPU values were measured on the 2-core development VM (torch 2.13 CPU build) with
``python -m bench.h2d --quick``, criterion: p50 wall time of one call.
"""
from __future__ import annotations

# --- triton backend (H100 initial values) ---
# Max programs of the persistent grid: the "SM budget" a transfer may occupy. 32 of
# 132 H100 SMs saturate PCIe Gen5 with 16-byte UVA accesses (public numbers).
TRITON_MAX_PROGRAMS = 32
# Grid cap under the Triton interpreter (CPU): programs run one after another there and
# each costs ~3 ms of interpreter set-up, so a small grid is fastest (dev VM, p50).
TRITON_INTERPRET_MAX_PROGRAMS = 2
# Bytes one program moves per loop iteration (the tile); 4 warps x 32 lanes x 64 B.
TRITON_TILE_BYTES = 8192
# Smallest tile: one warp still issues 16-byte vectors (32 lanes x 16 B).
TRITON_MIN_TILE_BYTES = 512
# Bytes per thread per tile at which the launcher adds warps (up to TRITON_MAX_WARPS).
TRITON_BYTES_PER_WARP = 2048
TRITON_MAX_WARPS = 4

# --- auto backend on CUDA (H100 initial values) ---
# A contiguous piece (one cudaMemcpyAsync) at least this large goes to the copy engine;
# smaller or scattered pieces go to the triton kernel. Criterion: H2D GB/s.
COPY_ENGINE_MIN_PIECE_BYTES = 28 * 1024

# --- auto backend on CPU (measured on the 2-core dev VM) ---
# On the CPU both backends are memcpy-like: the copy engine pays ~5 us of Python per run
# and per (layer, buffer), torch's index_select/index_copy_ moves ~1-4 GB/s. Crossover
# measured at 8 KiB per contiguous piece (p50 of one call, 1-256 scattered rows, 64 B -
# 64 KiB rows): below it "torch" wins, at and above it "copy_engine" wins.
CPU_COPY_ENGINE_MIN_PIECE_BYTES = 8 * 1024
