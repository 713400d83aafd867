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


def triton_warps(tile_bytes: int) -> int:
    """Warps per program of a tile of ``tile_bytes``: one warp per ``32 *
    TRITON_VECTORS_PER_THREAD`` 16-byte vectors, at most ``TRITON_MAX_WARPS``."""
    return max(1, min(TRITON_MAX_WARPS, tile_bytes // 16 // (32 * TRITON_VECTORS_PER_THREAD)))

# Upper bound of any grid cap (--hicache-max-copy-programs): far above any GPU's SM count,
# far below what would overflow a launch's grid or the program tables.
MAX_COPY_PROGRAMS = 4096

# --- loads: launch groups (estimate, not yet measured) ---
# A load launches consecutive model layers together until a group moves at least this
# many bytes (each launch then amortizes its fixed ~5 us; a consumer of layer i waits at
# most for the rest of its group, < this many bytes more). From the static review's
# estimate; re-tune with `bench/load_batch.py --group-bytes`.
LOAD_GROUP_MIN_BYTES = 1 << 20

# --- the copy engine ---
# A strided run (host page_first rows) of at least this many rows is one
# cudaMemcpy2DAsync; shorter ones go row by row into the batched copy.
COPY_ENGINE_2D_MIN_ROWS = 2

# --- the DMA path for page_first host pools (copy-engine value, H100, measured) ---
# A page_first host pool whose whole-page pieces (all layers of a page, contiguous on the
# host) are at least this large is staged ("auto"): per launch group one batched
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
# Launch groups per DMA call of the dma backend grow by this factor (1: one call, one
# event record and one stream wait per group, the pipeline as designed; 2: windows of
# 1, 2, 4, ... groups, 21 groups -> 5 calls). NOT measured on a GPU: the host saves the
# calls (H100: cudaMemcpyBatchAsync of 16 pieces cost 34 us of host), a consumer of a
# later layer waits for its whole window's DMA. Calibrate before changing the default.
DMA_WINDOW_GROWTH = 1

# --- auto backend on CPU (measured on the 2-core dev VM) ---
# On the CPU both backends are memcpy-like: the copy engine pays ~5 us of Python per run
# and per (layer, buffer), torch's index_select/index_copy_ moves ~1-4 GB/s. Crossover
# of the seed table's CPU rule, which compares one row's bytes (runs are not analysed):
# p50 of 7 calls, 4 layers, 4-1024 scattered rows of 64-8448 B, both layouts
# (2026-11-25): torch wins at <= 512 B rows from 16-64 rows on; the copy engine wins at
# 1728 B and above at every count (DeepSeek-V4-Pro c128_kv, 16 pages, 31 layers: 335 vs
# 1,228 us). Crossover: 1 KiB.
CPU_COPY_ENGINE_MIN_PIECE_BYTES = 1024

# --- the auto backend's seed table (H100, measured 2026-11-25, main at b0a80f0) ---
# The default decision table of "auto" (`transfer_kernels.auto_table.SEED`), from the
# end-to-end and interference runs of `bench/load_batch.py` on one H100 (PCIe Gen5 x16):
# * Copy engines by piece size (`cudaMemcpyBatchAsync` of scattered pieces, one call,
#   share of one contiguous 100 MB copy): 4 KiB 0.05, 10 KiB 0.08, 32 KiB 0.68,
#   128 KiB 0.98, 512 KiB 1.10. Pieces >= 128 KiB reach the PCIe limit; < 32 KiB the
#   engines are useless.
# * Idle, the SM kernel (triton) reaches 0.69-0.82 of the limit over its GPU span and was
#   the fastest end to end for small loads (DeepSeek-V4-Pro 1 page: 1.0 ms vs 2.3 ms dma);
#   that gap was host time (launches, Python), not the copy: the GPU spans were equal
#   (1 page 228 us triton, 220 us dma; 16 pages 767 vs 745 us).
# * While bf16 GEMMs run, the kernel starves (H2D 20-24 -> 3.4-4.2 GB/s) and its D2H slowed
#   the GEMMs by up to 42-53 %; the page-DMA path held (9.9 -> 9.8 GB/s, compute -10 %).
# * The per-row copy_engine backend was host-bound: Flash 16 pages 1.3 GB/s alone and
#   under GEMMs; Llama-3.1-8B layer_first (auto picked it) 12.9 ms of host per load.
# A server loads while it computes, so a job whose whole-page DMA pieces (page spans) are
# >= 32 KiB goes to the copy engines through the staged path (0.68 of the limit at 32 KiB,
# about the kernel's idle share, and unaffected by compute); everything else to the
# kernel. Re-measure with `bench/load_batch.py --calibrate` on a device.
AUTO_STAGE_MIN_PIECE_BYTES = 32 * 1024
