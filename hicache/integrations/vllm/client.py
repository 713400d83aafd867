"""A vLLM server on 127.0.0.1 for tests and benchmarks: start, wait, stream, scrape, stop.

Standard library only (urllib): the core environment drives the server, which runs in
the vLLM environment. Each server is a `process.ServerGroup`, its own process group, so
``stop`` ends vLLM's engine and worker processes with it and nothing else, and removes its
temporary folder (vLLM's sockets and init files stay out of /tmp) and the shared memory
its processes left in /dev/shm.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bounded_input import MAX_JSON_BYTES, capped_lines, parse_json
from hicache.integrations.vllm.process import ServerGroup

MAX_STREAM_BYTES = 1 << 30  # one completion's event stream (a few MB for the longest runs here)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Completion:
    """One streamed completion: token ids, text, time to first token and total latency (s)."""

    token_ids: tuple[int, ...]
    text: str
    ttft_s: float
    latency_s: float
    prompt_tokens: int


def log_causes(path: Path) -> list[str]:
    """Distinct error lines of a server log (``...Error: ...``, ``Exception: ...``, and
    "degraded mode" notices), in order, without their logger prefix; not the
    ``EngineDeadError`` every stop ends with."""
    if not Path(path).exists():
        return []
    lines = Path(path).read_text(errors="replace").splitlines()
    hits = (l.split("] ", 1)[-1] for l in lines if "WARNING" not in l and "EngineDeadError" not in l
            and ("Error: " in l or "Exception: " in l or "degraded mode" in l))
    return list(dict.fromkeys(hits))


class VllmServer:
    """vLLM's OpenAI server as a child process group (context manager: start ... stop).

    Args:
        argv: the command (from ``serve.serve_command``).
        log_path: where the server's stdout and stderr go.
        port: the ``--port`` inside ``argv``.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, port: int) -> None:
        self.argv, self.log_path, self.port = list(argv), Path(log_path), port
        self.group = ServerGroup(self.argv)
        self.proc: subprocess.Popen | None = None

    @property
    def tmp_dir(self) -> Path | None:
        """vLLM's temporary folder, while it runs."""
        return self.group.tmp_dir

    def start(self) -> "VllmServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = self.group.start(stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).proc
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until ``/v1/models`` answers.

        Raises:
            RuntimeError: the server exited or did not answer in time (with its log tail).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/v1/models", timeout=2).read()
                self.group.shm.observe()  # its message queues exist now (removed by stop)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1.0)
        raise RuntimeError(f"vLLM did not answer within {timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 25) -> str:
        """The log's last lines, after the first few root-cause lines (``...Error: ...``,
        ``Exception: ...``) that a long traceback would push out of the tail."""
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        head = [f"cause: {c}" for c in log_causes(self.log_path)[:3]]
        return "\n".join(head + text[-lines:])

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """SIGTERM the server (it shuts its engine down), then SIGKILL what is left of its
        process group, at once or after ``timeout_s``, and remove its temporary folder and
        the shared memory it left (idempotent). Returns the shared memory names removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.group.signal(signal.SIGTERM)
            self.group.wait(timeout_s)
        return self.group.end()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def complete(self, model: str, prompt: str, max_tokens: int, timeout_s: float = 300.0,
                 ignore_eos: bool = True) -> Completion:
        """Greedy completion of ``prompt``, streamed to time the first token.

        ``ignore_eos`` (the default) always generates ``max_tokens``; ``False`` stops at the
        model's end of sequence, as a user's request would (fixed-length greedy runs can
        hide outputs that loop)."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "return_token_ids": True, "ignore_eos": ignore_eos,
                "stream_options": {"include_usage": True}}
        req = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        started, first, ids, text, prompt_tokens = time.perf_counter(), None, [], [], 0
        what = f"{self.url}/v1/completions stream"
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for lineno, raw in capped_lines(resp, what, MAX_JSON_BYTES + 6, MAX_STREAM_BYTES):
                if not raw.startswith(b"data: ") or raw.strip() == b"data: [DONE]":
                    continue
                chunk = parse_json(raw[6:], what, lineno)
                if chunk.get("usage"):
                    prompt_tokens = chunk["usage"]["prompt_tokens"]
                for choice in chunk.get("choices", []):
                    if first is None and (choice.get("token_ids") or choice.get("text")):
                        first = time.perf_counter()
                    ids += choice.get("token_ids") or []
                    text.append(choice.get("text") or "")
        end = time.perf_counter()
        return Completion(tuple(ids), "".join(text), (first or end) - started, end - started,
                          prompt_tokens)

    def complete_with(self, model: str, prompt: str, max_tokens: int, kv_transfer_params: dict | None = None,
                      timeout_s: float = 300.0) -> tuple[tuple[int, ...], dict | None]:
        """Greedy completion of ``prompt`` carrying ``kv_transfer_params`` (a client hint:
        ``{"hicache": {"retain_s": 600}}``), not streamed: (its token ids, the response's
        ``kv_transfer_params``, where the plugin returns the hints' tickets)."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "return_token_ids": True, "ignore_eos": True}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        req = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = parse_json(resp.read(MAX_JSON_BYTES + 1), f"{self.url}/v1/completions")
        return tuple(doc["choices"][0].get("token_ids") or ()), doc.get("kv_transfer_params")

    def metrics(self) -> dict[str, float]:
        """Prometheus samples summed over labels: ``{"hicache:loaded_blocks_total": 72.0, ...}``."""
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return out
