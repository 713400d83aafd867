"""`hicache serve-vllm MODEL [vLLM args...] [--enable-hierarchical-cache --hicache-* ...]`.

Starts vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``)
in the vLLM environment. hicache's own flags are taken out of the command line and
translated into ``--kv-transfer-config`` (see ``config.kv_transfer_config``); every other
argument goes to vLLM untouched, except a ``--hicache-*`` flag hicache does not know (a
typo), which is refused before vLLM starts. Without ``--enable-hierarchical-cache`` it
starts plain vLLM. The server listens on 127.0.0.1 unless ``--host`` says otherwise
(vLLM alone would listen on every interface). ``MODEL`` may be ``smollm2-135m``, the
model folder ``scripts/setup_vllm.sh`` made. vLLM runs as a child with its own temporary
folder, removed when it ends (also after SIGTERM): it leaves sockets and init files there.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
from pathlib import Path
from typing import Sequence

from hicache.config import HiCacheConfig, add_hicache_args
from hicache.integrations.vllm import env
from hicache.integrations.vllm.config import PREFIX_FLAG, SpecConfig, kv_transfer_config

DEFAULT_HOST = "127.0.0.1"


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The subcommand's own flags; unknown ones are vLLM's (collected by ``parse_known_args``)."""
    parser.add_argument("model", help="model folder or name for vLLM (smollm2-135m: the set-up model)")
    parser.add_argument("--vllm-python", default=None,
                        help="Python with vLLM installed (default: this one if it has vLLM, "
                             "else the environment scripts/setup_vllm.sh built)")
    parser.add_argument(PREFIX_FLAG, dest="hicache_prefix_tokens", type=int, default=None,
                        help="typical cached prefix in tokens; sizes the host pools of "
                             "sliding-window and state KV cache groups (default 2048)")
    add_hicache_args(parser)
    return parser


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def check_vllm_args(vllm_args: Sequence[str]) -> None:
    """Refuse a ``--hicache-*`` flag that reached vLLM's arguments (hicache does not know it).

    Raises:
        ValueError: naming the flag(s).
    """
    unknown = [_flag(a) for a in vllm_args if _flag(a).startswith(("--hicache", "--enable-hierarchical"))]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: unknown hicache flag(s) (a typo?); "
                         "`hicache serve-vllm --help` lists them")


def resolve_python(python: str | os.PathLike | None) -> Path:
    """The Python that runs vLLM: ``--vllm-python``, else one found (``env.vllm_python``).

    Raises:
        ValueError: none found, or ``--vllm-python`` is not an executable file.
    """
    if python is None:
        py = env.vllm_python()
        if py is None:
            raise ValueError(f"--vllm-python: no Python with vLLM found ({env.missing()})")
        return py
    py = Path(python)
    if not py.is_file() or not os.access(py, os.X_OK):
        raise ValueError(f"--vllm-python: {py} is not an executable file")
    return py


def serve_command(model: str, config: HiCacheConfig, vllm_args: Sequence[str],
                  python: str | os.PathLike | None = None,
                  prefix_tokens: int | None = None) -> list[str]:
    """The argv that starts vLLM's server (on 127.0.0.1 unless ``vllm_args`` has
    ``--host``), with hicache configured when enabled.

    Raises:
        ValueError: no vLLM Python or a bad ``--vllm-python``, an unknown ``--hicache-*``
            flag, ``--kv-transfer-config`` given together with
            ``--enable-hierarchical-cache``, an unsupported hicache setting, or a
            ``--hicache-size`` over this host's budget.
    """
    check_vllm_args(vllm_args)
    py = resolve_python(python)
    host = [] if any(_flag(a) == "--host" for a in vllm_args) else ["--host", DEFAULT_HOST]
    argv = [str(py), "-m", env.API_SERVER, "--model", env.resolve_model(model), *host, *vllm_args]
    if not config.enable_hierarchical_cache:
        return argv
    if any(a == "--kv-transfer-config" or a.startswith("--kv-transfer-config=") for a in vllm_args):
        raise ValueError("--kv-transfer-config: hicache sets it from --enable-hierarchical-cache "
                         "and the --hicache-* flags; pass one or the other")
    spec_json = kv_transfer_config(config, prefix_tokens)
    if config.hicache_size_gb > 0:  # checkable now; ratio sizing is checked when vLLM starts
        SpecConfig(config).check_budget({"vllm_kv": int(config.hicache_size_gb * 1e9)}, 1)
    return argv + ["--kv-transfer-config", spec_json]


def run_serve(args: argparse.Namespace, vllm_args: Sequence[str]) -> int:
    """Run vLLM's server until it ends; its exit status (128 + N after signal N)."""
    argv = serve_command(args.model, HiCacheConfig.from_args(args), vllm_args, args.vllm_python,
                         args.hicache_prefix_tokens)
    return run_in_private_tmp(argv)


def run_in_private_tmp(argv: Sequence[str]) -> int:
    """Run ``argv`` (vLLM's server) in its own process group with its own temporary folder
    (`env.private_tmp`), removed when it ends. SIGINT, SIGTERM and SIGHUP sent to this
    process are passed on to the group, as a terminal's Ctrl-C would be; whatever of the
    group is left when the server has ended is killed (nothing writes to the folder after)."""
    child: list[int] = []  # the group's id once started; a signal before that waits for it
    pending: list[int] = []

    def forward(sig: int, _frame) -> None:
        if child:
            _signal_group(child[0], sig)
        else:
            pending.append(sig)

    with env.private_tmp() as tmp:
        # Handlers first: a signal that arrives while the child starts is not lost.
        passed = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            proc = subprocess.Popen(list(argv), env=env.process_env(tmp), start_new_session=True)
        except BaseException:
            for sig, handler in passed.items():
                signal.signal(sig, handler)
            raise
        child.append(proc.pid)
        for sig in pending:
            _signal_group(proc.pid, sig)
        try:
            code = proc.wait()
        finally:
            for sig, handler in passed.items():
                signal.signal(sig, handler)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    return code if code >= 0 else 128 - code


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group has ended
