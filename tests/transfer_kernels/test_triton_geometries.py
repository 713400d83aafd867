"""The dense vector kernel on every real pool geometry, interpreted on the CPU.

Row sizes come from the model stacks themselves (DeepSeek-V4's seven pools, MHA with fp8
and int8 scale buffers, MLA bf16 and fp8, DSA): each whole stack is one batch (one
launch), host page_first and layer_first, both directions, with 1, 2 or 5 scattered rows
per pool. Layers are cut to the first few (the geometry of a row does not depend on the
layer count).
"""
from __future__ import annotations

import pytest
import torch

from hicache.models import preset
from tests.transfer_kernels.pools import assert_copied, make_pool, random_map, snapshot
from transfer_kernels import CopyJob, TritonBackend, copy_rows_batch

MODELS = {"deepseek-v4-pro": 4, "llama-3.1-8b-fp8": 2, "llama-3.1-8b-int8": 2,
          "deepseek-v3": 2, "deepseek-v3-fp8": 2, "deepseek-v3.2": 2}


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("model", list(MODELS))
def test_model_stack_in_one_launch_is_byte_exact(gen, model, direction, layout, launched):
    stack = preset(model, MODELS[model])
    jobs, counts = [], (1, 2, 5)
    for i, spec in enumerate(stack.data_pools()):
        buffers = [(b.row_shape, b.dtype) for b in spec.buffers]
        pool = make_pool(gen, spec.num_layers, 6, buffers, layout, device="cpu", pin=False,
                         name=spec.name)
        src, dst = ((pool.host_table, pool.device_table) if direction == "h2d"
                    else (pool.device_table, pool.host_table))
        jobs.append(CopyJob(src, dst, *random_map(gen, 6, 6, counts[i % 3])))
    befores = [(snapshot(j.src), snapshot(j.dst)) for j in jobs]
    backend = TritonBackend()
    copy_rows_batch(jobs, backend=backend)
    launcher, group = launched[-1]  # every pool 16-aligned: (meta, prog_at, fields, vpt, align)
    assert backend.launches == len(launched) == 1 and launcher.args[group][4] == 16
    for job, (sb, db) in zip(jobs, befores):
        assert_copied(job.src, job.dst, sb, db, job.src_rows, job.dst_rows)


@pytest.mark.parametrize("row_bytes", [1, 16, 24, 133, 1728, 8448])
@pytest.mark.parametrize("num_rows", [1, 3, 7])
def test_row_counts_and_sizes_at_the_edges(gen, row_bytes, num_rows):
    # 1 row, rows not a multiple of anything, row sizes unaligned or just past a tile.
    pool = make_pool(gen, 2, 9, [((row_bytes,), torch.uint8)], "page_first", device="cpu",
                     pin=False)
    src_rows, dst_rows = random_map(gen, 9, 9, num_rows)
    before = snapshot(pool.host_table), snapshot(pool.device_table)
    copy_rows_batch([CopyJob(pool.host_table, pool.device_table, src_rows, dst_rows)],
                    backend=TritonBackend(max_programs=3, tile_bytes=1024))
    assert_copied(pool.host_table, pool.device_table, *before, src_rows, dst_rows)
