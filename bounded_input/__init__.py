"""Reading what a user or a disk hands the project, with bounds.

Never more bytes than a stated limit, never waiting on a source forever, never a JSON
document deeper or with longer numbers than a stated limit. Every failure is one
``ValueError`` naming the source and its line.

The lowest package of the project: it imports nothing of ``hicache``, ``host_pools`` or
``transfer_kernels``, so each of them may use it (``transfer_kernels`` reads its ``"auto"``
table with it, ``hicache`` its traces, store markers and records) and imports still point
down only.

    sources.py   open_source: a file opened without blocking; a FIFO, pipe or terminal
                 read through poll(2) against a `Deadline` (a stall is refused)
    reads.py     read_capped / read_file (a whole file), capped_lines (line by line), their
                 byte bounds and the refusal of a source that stalls
    json_doc.py  parse_json: depth, digits and size bounded before the parser runs;
                 read_json: read_file, then parse_json
"""
from __future__ import annotations

from bounded_input.json_doc import MAX_DEPTH, MAX_DIGITS, MAX_JSON_BYTES, parse_json, read_json
from bounded_input.reads import capped_lines, over_limit, read_capped, read_file
from bounded_input.sources import STALL_S, Deadline, Stalled, open_source

__all__ = ["MAX_DEPTH", "MAX_DIGITS", "MAX_JSON_BYTES", "STALL_S", "Deadline", "Stalled", "capped_lines",
           "open_source", "over_limit", "parse_json", "read_capped", "read_file",
           "read_json"]
