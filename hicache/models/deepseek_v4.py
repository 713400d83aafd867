"""DeepSeek-V4 hybrid stack: a data-less anchor plus six data families (DESIGN §4).

    pool              kind     source  tokens/row  row bytes  layers
    kv                ANCHOR   -         1 (pg 256)        0  -
    swa               STATE    own       128          74 880  all
    c4_kv             HISTORY  kv        256          37 440  ratio 4
    c4_indexer        HISTORY  kv        256           8 448  ratio 4
    c128_kv           HISTORY  kv        256           1 728  ratio 128
    c4_state          STATE    swa       128          65 536  ratio 4
    c4_indexer_state  STATE    swa       128          16 384  ratio 4

The ratio-128 compressor state is per request and never needs offload: pages are 256
tokens, a multiple of 128, so a load never resumes a partial ratio-128 window.
"""
from __future__ import annotations

from typing import Sequence

import torch

from host_pools.spec import BufferSpec, PoolKind, PoolSpec, Stack

RATIOS = (0, 4, 128)
PAGE_SIZE = 256
WINDOW = 128
SWA_ROW_BYTES = 74_880  # 128 x (448 fp8 + 128 bf16 rope + 8 scale) = 74 752, padded to 130 x 576
C4_KV_ROW_BYTES = 37_440  # 64 x 576 values + 64 x 8 scales = 37 376, padded to 65 x 576
C4_INDEXER_ROW_BYTES = 8_448  # 64 x (128 fp8 + 4 fp32 scale)
C128_KV_ROW_BYTES = 1_728  # 2 x 584 = 1 168, padded to 3 x 576
RING = 8  # compressor ring slots per SWA page

FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (0,)  # 43 layers: 20 ratio-4, 20 ratio-128
PRO_RATIOS = (128, 128) + (4, 128) * 29 + (4,)  # 61 layers: 30 ratio-4, 31 ratio-128


def deepseek_v4(compress_ratios: Sequence[int], model: str = "deepseek-v4") -> Stack:
    """Build the seven-pool stack for one entry of ``compress_ratios`` per layer.

    Raises:
        ValueError: an entry other than 0, 4 or 128, or an empty list.
    """
    ratios = tuple(int(r) for r in compress_ratios)
    if not ratios:
        raise ValueError("compress_ratios: need one entry per layer, got an empty list")
    bad = sorted({r for r in ratios if r not in RATIOS})
    if bad:
        raise ValueError(f"compress_ratios: entries must be in {RATIOS}, got {bad}")
    c4 = tuple(i for i, r in enumerate(ratios) if r == 4)
    c128 = tuple(i for i, r in enumerate(ratios) if r == 128)
    u8 = torch.uint8
    pools = [
        PoolSpec("kv", PoolKind.ANCHOR, 0, (), tokens_per_row=1),
        PoolSpec("swa", PoolKind.STATE, len(ratios), (BufferSpec("kv", (SWA_ROW_BYTES,), u8),),
                 tokens_per_row=WINDOW, window_tokens=WINDOW),
    ]
    if c4:
        pools += [
            PoolSpec("c4_kv", PoolKind.HISTORY, len(c4), (BufferSpec("kv", (C4_KV_ROW_BYTES,), u8),),
                     PAGE_SIZE, indices_from="kv", layer_ids=c4),
            PoolSpec("c4_indexer", PoolKind.HISTORY, len(c4),
                     (BufferSpec("indexer", (C4_INDEXER_ROW_BYTES,), u8),), PAGE_SIZE,
                     indices_from="kv", layer_ids=c4),
        ]
    if c128:
        pools.append(PoolSpec("c128_kv", PoolKind.HISTORY, len(c128),
                              (BufferSpec("kv", (C128_KV_ROW_BYTES,), u8),), PAGE_SIZE,
                              indices_from="kv", layer_ids=c128))
    if c4:
        pools += [
            PoolSpec("c4_state", PoolKind.STATE, len(c4), (BufferSpec("state", (RING, 2048), torch.float32),),
                     WINDOW, indices_from="swa", window_tokens=WINDOW, layer_ids=c4),
            PoolSpec("c4_indexer_state", PoolKind.STATE, len(c4),
                     (BufferSpec("state", (RING, 512), torch.float32),), WINDOW,
                     indices_from="swa", window_tokens=WINDOW, layer_ids=c4),
        ]
    return Stack(tuple(pools), page_size=PAGE_SIZE, model=model)
