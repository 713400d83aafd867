"""Test pools: random host buffers (page_first / layer_first) and per-layer device tensors.

A test pool mirrors what the pool layer builds: per layer, one tensor per buffer on the
"device" side (any dtype, viewed as bytes) and one uint8 host buffer holding all buffers
of a row back to back. Every byte is random (never zeros).

The "device" side is CUDA with a pinned host side when CUDA is available (so the same
tests check real transfers on a GPU machine), else the CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from transfer_kernels import RowTable, as_row_bytes, copy_rows_ref

BufferShape = tuple[tuple[int, ...], torch.dtype]  # (row_shape, dtype)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    """Wait for enqueued copies before reading host memory a device may write."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class Pool:
    """One pool: ``host`` buffer, per-layer ``device`` tensors and their row tables."""

    layout: str  # "page_first" ([R, L, RB]) or "layer_first" ([L, R, RB])
    host: torch.Tensor
    device: list[list[torch.Tensor]]
    host_table: RowTable
    device_table: RowTable

    @property
    def num_rows(self) -> int:
        return self.host_table.num_rows

    def table(self, side: str) -> RowTable:
        return self.host_table if side == "host" else self.device_table


def random_bytes(shape: tuple[int, ...], gen: torch.Generator, device: str = "cpu",
                 pin: bool = False) -> torch.Tensor:
    t = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    if pin:
        t = t.pin_memory()
    return t.to(device)


def host_views(host: torch.Tensor, layout: str, row_bytes: list[int]) -> list[list[torch.Tensor]]:
    num_layers = host.shape[1] if layout == "page_first" else host.shape[0]
    offs = [sum(row_bytes[:b]) for b in range(len(row_bytes))]
    views = []
    for l in range(num_layers):
        base = host[:, l] if layout == "page_first" else host[l]
        views.append([base[:, o:o + n] for o, n in zip(offs, row_bytes)])
    return views


def make_pool(gen: torch.Generator, num_layers: int, num_rows: int,
              buffers: list[BufferShape], layout: str = "page_first",
              device: str | None = None, pin: bool | None = None, name: str = "pool") -> Pool:
    device = device or DEVICE
    pin = device == "cuda" if pin is None else pin
    row_bytes = [math.prod(shape) * dt.itemsize for shape, dt in buffers]
    dev = [[random_bytes((num_rows, n), gen, device).view(dt).view(num_rows, *shape)
            for (shape, dt), n in zip(buffers, row_bytes)] for _ in range(num_layers)]
    rb = sum(row_bytes)
    shape = (num_rows, num_layers, rb) if layout == "page_first" else (num_layers, num_rows, rb)
    host = random_bytes(shape, gen, pin=pin)
    host_table = RowTable.from_views(host_views(host, layout, row_bytes), f"{name}.host")
    device_table = RowTable.from_views([[as_row_bytes(t) for t in layer] for layer in dev],
                                       f"{name}.device")
    return Pool(layout, host, dev, host_table, device_table)


def snapshot(table: RowTable) -> list[list[torch.Tensor]]:
    """A CPU copy of every view of ``table``."""
    sync()
    return [[v.cpu().clone() for v in layer] for layer in table.views]


def expected(src_before: list[list[torch.Tensor]], dst_before: list[list[torch.Tensor]],
             src_rows, dst_rows, layers) -> list[list[torch.Tensor]]:
    """The destination after the copy, computed by THE reference on CPU copies."""
    out = [[v.clone() for v in layer] for layer in dst_before]
    copy_rows_ref(src_before, out, torch.as_tensor(src_rows), torch.as_tensor(dst_rows), layers)
    return out


def assert_copied(src: RowTable, dst: RowTable, src_before, dst_before, src_rows, dst_rows,
                  layers=None) -> None:
    """Moved rows match, untouched rows/layers are unchanged, the source is unchanged."""
    sync()
    src_rows = torch.as_tensor(src_rows, dtype=torch.int64).cpu()
    dst_rows = torch.as_tensor(dst_rows, dtype=torch.int64).cpu()
    layers = range(src.num_layers) if layers is None else layers
    want = expected(src_before, dst_before, src_rows, dst_rows, layers)
    untouched = torch.ones(dst.num_rows, dtype=torch.bool)
    untouched[dst_rows] = False
    for l in range(dst.num_layers):
        for b, view in enumerate(dst.views[l]):
            got = view.cpu()
            assert torch.equal(src.views[l][b].cpu(), src_before[l][b]), f"source changed {l=} {b=}"
            assert torch.equal(got[untouched], dst_before[l][b][untouched]), \
                f"untouched rows changed {l=} {b=}"
            if l in layers:
                assert torch.equal(got[dst_rows], src_before[l][b][src_rows]), \
                    f"moved rows differ {l=} {b=}"
            else:
                assert torch.equal(got, dst_before[l][b]), f"layer not copied changed {l=} {b=}"
            assert torch.equal(got, want[l][b]), f"differs from copy_rows_ref {l=} {b=}"


def assert_unchanged(table: RowTable, before: list[list[torch.Tensor]]) -> None:
    sync()
    for l, layer in enumerate(table.views):
        for b, v in enumerate(layer):
            assert torch.equal(v.cpu(), before[l][b]), f"{table.name} changed at {l=} {b=}"


def random_map(gen: torch.Generator, num_src: int, num_dst: int, n: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` scattered source rows and ``n`` distinct destination rows."""
    src = torch.randint(0, num_src, (n,), generator=gen)
    dst = torch.randperm(num_dst, generator=gen)[:n]
    return src, dst
