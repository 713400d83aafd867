"""What the compiled copy kernel costs: shared memory, registers, spills, instructions.

Compiles the kernel for a CUDA target without a GPU (triton ships ``ptxas`` and
``cuobjdump``), so the CPU test suite and ``bench/triton_grid.py`` check what a GPU would
run: no shared memory, no local-memory stack (spills), 16-byte global accesses for the
16-byte specialization, and the size of the inner loop.

    python -m transfer_kernels.cuda.inspect [--arch 90]    # one line per variant
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from typing import Any

from transfer_kernels import tuning
from transfer_kernels.cuda.abi import SEG_FIELDS

SIGNATURE = {"meta_ptr": "*i64", "prog_at": "i64", "NF": "constexpr", "VPT": "constexpr",
             "ALIGN": "constexpr"}


def _cuobjdump() -> str | None:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else None


def compile_variant(vpt: int, align: int, num_warps: int, arch: int = 90) -> Any:
    """The compiled kernel for ``sm_<arch>`` (no GPU needed); ``.asm`` has ptx and cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from transfer_kernels.cuda.copy_kernel import compiled_kernel

    src = ASTSource(fn=compiled_kernel(), signature=SIGNATURE,
                    constexprs={"NF": SEG_FIELDS, "VPT": vpt, "ALIGN": align})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})


def report(vpt: int, align: int, num_warps: int, arch: int = 90) -> dict[str, Any]:
    """Resource use of one variant: ``shared`` bytes (triton's metadata), vector accesses in
    the PTX, and, when ``cuobjdump`` is there, ``regs``, ``stack`` and ``local`` bytes (a
    spill needs local memory), ``spill_ops`` (STL/LDL) and ``loop_instructions`` (SASS
    instructions of the inner copy loop: the shortest backward branch around a store).
    """
    compiled = compile_variant(vpt, align, num_warps, arch)
    ptx = compiled.asm["ptx"]
    out: dict[str, Any] = {"vpt": vpt, "align": align, "num_warps": num_warps, "arch": arch,
                           "shared": int(compiled.metadata.shared),
                           "ptx_v4_loads": ptx.count("ld.global.v4"),
                           "ptx_v4_stores": ptx.count("st.global.v4")}
    tool = _cuobjdump()
    if tool is None:
        return out
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    out.update(regs=int(fields.get("REG", -1)), stack=int(fields.get("STACK", -1)),
               local=int(fields.get("LOCAL", -1)))
    ops = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)([^;]*);", sass)
    out["spill_ops"] = sum(op.startswith(("STL", "LDL")) for _, _, op, _ in ops)
    out["sass_instructions"] = len(ops)
    stores = [int(at, 16) for at, _, op, _ in ops if op.startswith("STG")]
    loops = [(int(m.group(1), 16), int(at, 16)) for at, _, op, rest in ops
             if op == "BRA" and (m := re.search(r"0x([0-9a-f]+)", rest)) and int(m.group(1), 16) < int(at, 16)]
    inner = [end - start for start, end in loops if any(start <= a <= end for a in stores)]
    out["loop_instructions"] = min(inner) // 16 + 1 if inner else 0
    return out


def variants() -> list[tuple[int, int, int]]:
    """The (vpt, align, warps) the backend launches with its defaults, per alignment."""
    tile = tuning.TRITON_TILE_BYTES
    return [(tile // 16, align, tuning.triton_warps(tile)) for align in (16, 8, 4, 1)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90)")
    p.add_argument("--tiles", default=str(tuning.TRITON_TILE_BYTES),
                   help="comma list of tile bytes (vectors per tile = tile // 16)")
    args = p.parse_args(argv)
    for tile in map(int, args.tiles.split(",")):
        for align in (16, 8, 4, 1):
            print(json.dumps(report(tile // 16, align, tuning.triton_warps(tile), args.arch)))


if __name__ == "__main__":
    main()
