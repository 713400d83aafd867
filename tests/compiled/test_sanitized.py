"""The three C modules built once with AddressSanitizer and UndefinedBehaviorSanitizer
(``-fsanitize=address,undefined``, every report fatal), then, in one child process: every
hostile call of `hostile.py` and the differential tests (the compiled forms against their
Python forms: the read path over random trees, the slot arrays, the page allocator). A
read or write out of bounds, a use after free, a signed overflow or a misaligned access in
the C code fails the run. Skipped, saying why, without gcc, its sanitizer runtimes or the
Python headers (the suite passes without the C modules)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from host_pools.compiled import disabled, source_stamp

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"hicache.radix._read": ["hicache/radix/_read.c", "hicache/_tensor.h"],  # setup.py's MODULES
           "hicache._slot_arrays": ["hicache/_slot_arrays.c", "hicache/_tensor.h"],
           "host_pools._pages": ["host_pools/_pages.c"]}
DIFFERENTIAL = ["tests/hicache/radix/test_read.py", "tests/hicache/test_slot_arrays.py",
                "tests/host_pools/test_allocator_compiled.py"]
FLAGS = ["-shared", "-fPIC", "-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all"]  # and no -fwrapv: a signed overflow is reported, not wrapped


def toolchain() -> tuple[str | None, str]:
    """(gcc, what to preload: libasan first, then libstdc++ so that ASan finds the C++ throw
    torch uses, which Python does not link), or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (gcc) on PATH"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return None, "no Python headers (Python.h)"
    libs = [subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
            for lib in ("libasan.so", "libstdc++.so")]
    if not all(Path(lib).is_absolute() and Path(lib).exists() for lib in libs):
        return None, f"{cc} has no AddressSanitizer runtime or libstdc++ ({libs})"
    return cc, " ".join(libs)


def build(cc: str, out: Path) -> None:
    """The three modules as ``out/<name>.so``, sanitized and stamped like setup.py stamps them
    (compiled side by side: the machine's cores, not one after another)."""
    include = sysconfig.get_paths()["include"]
    runs = {}
    for name, sources in SOURCES.items():
        stamp = source_stamp([ROOT / p for p in sources])
        runs[sources[0]] = subprocess.Popen([cc, *FLAGS, f"-I{include}", f"-I{ROOT}", f'-DSOURCE_SHA256="{stamp}"',
                                             str(ROOT / sources[0]), "-o", str(out / f"{name}.so")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    errors = {source: run.communicate(timeout=300)[1] for source, run in runs.items()}
    for source, run in runs.items():
        if run.returncode:
            pytest.skip(f"{cc} could not build {source} with the sanitizers: {errors[source].strip()[-300:]}")


def test_the_setup_script_and_this_test_build_the_same_modules():
    text = (ROOT / "setup.py").read_text()
    assert all(f'"{name}": {sources}'.replace("'", '"') in text for name, sources in SOURCES.items())


@pytest.mark.skipif(disabled(), reason="HICACHE_NO_C=1: the compiled forms are switched off")
def test_the_hostile_calls_and_differential_tests_run_clean_under_the_sanitizers(tmp_path):
    cc, preload = toolchain()
    if cc is None:
        pytest.skip(f"sanitized build: {preload}")
    build(cc, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LD_PRELOAD": preload, "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    env.pop("HICACHE_NO_C", None)
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("sanitized_child.py")), str(tmp_path),
                          *DIFFERENTIAL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = (run.stdout + run.stderr)[-4000:]
    assert "AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    lines = [json.loads(line) for line in (tmp_path / "hostile.jsonl").read_text().splitlines()]
    assert len([x for x in lines if "case" in x]) == len([x for x in lines if "start" in x]) > 900, report
    assert run.returncode == 0, report
    assert " passed" in run.stdout and "skipped" not in run.stdout and "SKIPPED" not in run.stdout, report
