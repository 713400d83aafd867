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
* The Triton kernel reads pinned host memory through UVA; with 64 programs it reached
  48-51 GB/s H2D (0.89-0.92 of the limit) and 42-46 GB/s D2H on 37-128 KiB rows; 32
  programs gave 37-41 GB/s H2D; 16 KiB tiles were slower than 8 KiB at every grid size.
  Those figures are of the byte-lane kernel that the dense vector kernel replaced; the
  dense kernel, the launch groups of a load and the DMA path have not run on a GPU yet
  (``bench/load_batch.py`` and ``bench/triton_grid.py`` re-tune them), so the H100 values
  below are kept and each unmeasured value says so.

CPU values were measured on the 2-core development VM (torch 2.13 CPU build) with
``python -m bench.h2d --quick``, criterion: p50 wall time of one call.
"""
from __future__ import annotations

# --- triton backend ---
# Max programs of the grid: the "SM budget" a transfer may occupy. Measured (H100, the
# byte-lane kernel before the dense vector kernel): 64 of 132 SMs gave llama-3.1-8b rows
# 50.6 GB/s H2D (0.92 of the limit) vs 41.2 with 32. Kept for the dense kernel until
# `bench/triton_grid.py` re-tunes it on a GPU (a dense program moves more per SM).
TRITON_MAX_PROGRAMS = 64
# Grid cap under the Triton interpreter (CPU): programs run one after another there and
# each costs ~3 ms of interpreter set-up, so a small grid is fastest (dev VM, p50).
TRITON_INTERPRET_MAX_PROGRAMS = 2
# Bytes one program moves per loop iteration at 16-byte alignment (512 vectors of 16 B).
# Measured (H100, byte-lane kernel): 8 KiB tiles beat 16 KiB at 16/32/64 programs; kept
# for the dense kernel until re-tuned.
TRITON_TILE_BYTES = 8192
# 16-byte vectors per thread per iteration (64 B in flight per thread, SGLang's figure):
# sets the warps of a tile. Not yet measured on a GPU.
TRITON_VECTORS_PER_THREAD = 4
TRITON_MAX_WARPS = 16
# Upper bound of any grid cap (--hicache-max-copy-programs): far above any GPU's SM count,
# far below what would overflow a launch's grid or the program tables.
MAX_COPY_PROGRAMS = 4096

# --- loads: launch groups (estimate, not yet measured) ---
# A load launches consecutive model layers together until a group moves at least this
# many bytes (each launch then amortizes its fixed ~5 us; a consumer of layer i waits at
# most for the rest of its group, < this many bytes more). From the static review's
# estimate; re-tune with `bench/load_batch.py --group-bytes`.
LOAD_GROUP_MIN_BYTES = 1 << 20

# --- auto backend on CUDA (H100, measured) ---
# A contiguous piece (one copy of the copy engine) at least this large goes to the copy
# engine; smaller or scattered pieces go to the triton kernel. Measured crossover: 37 KiB
# rows (v4 c4_kv) are faster on triton (48.6 vs 24.7 GB/s at 1024 rows), 64-128 KiB
# rows on the copy engine (52-55 vs 45-51 GB/s).
COPY_ENGINE_MIN_PIECE_BYTES = 64 * 1024
# A strided run (host page_first rows) of at least this many rows is one
# cudaMemcpy2DAsync; shorter ones go row by row into the batched copy.
COPY_ENGINE_2D_MIN_ROWS = 2

# --- the DMA path for page_first host pools (copy-engine value, H100, measured) ---
# A page_first host pool whose whole-page pieces (all layers of a run of pages, contiguous
# on the host) are at least this large is staged ("auto"): per launch group one batched
# cudaMemcpyBatchAsync of page chunks into a device staging ring, then the group's scatter
# on the device (D2H: gather, then DMA). The value is the copy engine's measured crossover
# above (pieces >= 64 KiB reach 52-55 GB/s); the staged path itself has not been measured
# on a GPU since it was made per group.
DMA_MIN_PIECE_BYTES = 64 * 1024
# Bytes of each staging ring of the DMA backend (one per device and direction, allocated
# once, reused by every load): a 64-page DeepSeek-V4-Pro load (98.6 MB, the largest
# benchmarked batch) fits whole; a job beyond what is left takes the kernel path.
DMA_STAGING_MAX_BYTES = 128 << 20
# Bytes a DMA piece aims for when a load's launch groups cut a page_first row into chunks
# of layers (H100, measured, cudaMemcpyBatchAsync of scattered pieces: 0.98 of one
# contiguous copy at 128 KiB, 0.68 at 32 KiB); a chunk holds ceil(this / row) layers.
DMA_PIECE_BYTES = 128 * 1024

# --- auto backend on CPU (measured on the 2-core dev VM) ---
# On the CPU both backends are memcpy-like: the copy engine pays ~5 us of Python per run
# and per (layer, buffer), torch's index_select/index_copy_ moves ~1-4 GB/s. Crossover
# measured at 8 KiB per contiguous piece (p50 of one call, 1-256 scattered rows, 64 B -
# 64 KiB rows): below it "torch" wins, at and above it "copy_engine" wins.
CPU_COPY_ENGINE_MIN_PIECE_BYTES = 8 * 1024
