"""Property: any valid row map gives exactly the reference's bytes (torch, copy_engine, auto)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transfer_kernels.pools import assert_copied, make_pool, snapshot
from transfer_kernels import copy_rows


@st.composite
def copies(draw):
    num_rows = draw(st.integers(1, 24))
    num_layers = draw(st.integers(1, 3))
    row_bytes = draw(st.lists(st.integers(1, 70), min_size=1, max_size=3))
    dst_rows = draw(st.permutations(range(num_rows)))[: draw(st.integers(0, num_rows))]
    src_rows = [draw(st.integers(0, num_rows - 1)) for _ in dst_rows]
    if draw(st.booleans()):  # make runs the copy engine can coalesce
        start = draw(st.integers(0, num_rows - len(dst_rows)))
        src_rows = list(range(start, start + len(dst_rows)))
    layers = draw(st.none() | st.lists(st.integers(0, num_layers - 1), unique=True))
    return dict(num_rows=num_rows, num_layers=num_layers, row_bytes=row_bytes,
                src_rows=src_rows, dst_rows=list(dst_rows), layers=layers,
                layout=draw(st.sampled_from(["page_first", "layer_first"])),
                h2d=draw(st.booleans()), backend=draw(st.sampled_from(
                    ["torch", "copy_engine", "auto"])), seed=draw(st.integers(0, 2**31)))


@settings(max_examples=150, deadline=None)
@given(copies())
def test_any_row_map_matches_reference(case):
    gen = torch.Generator().manual_seed(case["seed"])
    pool = make_pool(gen, case["num_layers"], case["num_rows"],
                     [((n,), torch.uint8) for n in case["row_bytes"]], case["layout"])
    src, dst = ((pool.host_table, pool.device_table) if case["h2d"]
                else (pool.device_table, pool.host_table))
    src_before, dst_before = snapshot(src), snapshot(dst)
    copy_rows(src, dst, torch.tensor(case["src_rows"], dtype=torch.int64),
              torch.tensor(case["dst_rows"], dtype=torch.int64), layers=case["layers"],
              backend=case["backend"])
    assert_copied(src, dst, src_before, dst_before, case["src_rows"], case["dst_rows"],
                  case["layers"])
