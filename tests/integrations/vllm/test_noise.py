"""vLLM's shutdown noise is dropped from `hicache serve-vllm`'s stderr, precisely (issue 28,
item 11): nanobind's leak report (as vLLM 0.32 on CPU prints it at every stop, its last
line glued to the next output) and the resource tracker's warning go; every other line,
including ones that mention leaks, passes byte for byte."""
from __future__ import annotations

import io

from hicache.integrations.vllm.noise import NoiseFilter, relay

KEPT = [
    b"INFO:     Application shutdown complete.\n",
    b"Traceback (most recent call last):\n",
    b"  File \"x.py\", line 1, in <module>\n",
    b"RuntimeError: a real failure \xe2\x9c\x97\n",
    b" - leaked function \"not in a nanobind block\"\n",
    b"WARNING 11-27 [block_pool.py:1] 3 blocks leaked by request 7\n",
    b"UserWarning: resource_tracker: something else entirely\n",
]
NOISE = [
    b"nanobind: leaked 4 instances!\n",
    b" - leaked instance 0x7f8b9245cb88 of type \"triton._C.libtriton.ir.attribute\"\n",
    b"nanobind: leaked 64 types!\n",
    b" - leaked type \"triton._C.libtriton.ir.location\"\n",
    b" - ... skipped remainder\n",
    b"nanobind: leaked 514 functions!\n",
    b" - leaked function \"create_fcmpUGT\"\n",
    b" - ... skipped remainder\n",
    b"nanobind: this is likely caused by a reference counting issue in the binding code.\n",
]
GLUED = (b"See https://nanobind.readthedocs.io/en/latest/refleaks.html/root/.pyenv/versions/3.11.7/lib/python3.11/"
         b"multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked "
         b"semaphore objects to clean up at shutdown\n")
TRACKER = [
    b"/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear "
    b"to be 2 leaked shared_memory objects to clean up at shutdown\n",
    b"  warnings.warn('resource_tracker: There appear to be %d '\n",
]


def _filtered(lines: list[bytes]) -> list[bytes]:
    noise = NoiseFilter()
    return [kept for line in lines if (kept := noise.keep(line))]


def test_only_the_shutdown_noise_is_dropped():
    stream = KEPT[:1] + NOISE + [GLUED, TRACKER[1]] + KEPT[1:4] + TRACKER + KEPT[4:]
    assert _filtered(stream) == KEPT
    # the glued line's own text, when it is not noise, is kept
    assert _filtered(NOISE + [b"See https://nanobind.readthedocs.io/en/latest/refleaks.htmlERROR x\n"]) == \
        [b"ERROR x\n"]
    # the tracker's source line alone (not after its warning) is not ours to drop
    assert _filtered(TRACKER[1:]) == TRACKER[1:]


def test_relay_copies_the_rest_until_the_end():
    sink = io.BytesIO()
    relay(io.BytesIO(b"".join(KEPT[:2] + NOISE + KEPT[2:]) + b"no newline at the end"), sink).join(10)
    assert sink.getvalue() == b"".join(KEPT) + b"no newline at the end"
