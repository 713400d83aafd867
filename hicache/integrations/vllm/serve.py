"""`hicache serve-vllm MODEL [vLLM args...] [--enable-hierarchical-cache --hicache-* ...]`.

Starts vLLM's OpenAI-compatible server (``python -m`` `env.API_SERVER`) in the vLLM
environment. hicache's own flags are taken out of the command line and translated into
``--kv-transfer-config`` (see ``config.kv_transfer_config``); every other argument goes
to vLLM untouched, except a ``--hicache-*`` flag hicache does not know (a typo), which is
refused before vLLM starts, as is a MODEL vLLM could not load (`model_source.py`: not a
path, not cached, and offline) and, with the host tier, a linear-attention hybrid vLLM's
build cannot cache (`hybrid_models.py`: Mamba-2 on CPU, Qwen3.5 without torchvision). Without ``--enable-hierarchical-cache`` it starts plain
vLLM. The server listens on 127.0.0.1 unless ``--host`` says otherwise (vLLM alone would
listen on every interface). ``MODEL`` may be ``smollm2-135m``, the model folder
``scripts/setup_vllm.sh`` made. vLLM runs as a `process.ServerGroup`: its own process
group, temporary folder and shared memory, nothing of them left when it ends (SIGTERM
included). Exit status: vLLM's, or 128 + N after a signal N was passed on to it (130 for
Ctrl-C, 143 for SIGTERM), with one line saying so.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from hicache.config import HiCacheConfig, add_hicache_args
from hicache.integrations.vllm import env
from hicache.integrations.vllm.config import PREFIX_FLAG, SpecConfig, kv_transfer_config
from hicache.integrations.vllm.hybrid_models import architectures, refusal, vllm_build
from hicache.integrations.vllm.model_source import check_model, hub_cache_dirs
from hicache.integrations.vllm.noise import relay
from hicache.integrations.vllm.process import ServerGroup

DEFAULT_HOST = "127.0.0.1"
RELAY_JOIN_S = 5.0  # stderr's end comes with the group's: a bound, never reached in practice


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
    # vLLM stores every block as soon as it is computed: write-through is the only policy it honours
    parser.set_defaults(write_policy="write_through")
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
            ``--enable-hierarchical-cache``, an unsupported hicache setting, a
            ``--hicache-size`` over this host's budget, a MODEL that is neither a path nor
            cached and cannot be downloaded (`model_source.check_model`), or, with the host
            tier, a hybrid the vLLM build cannot cache (`hybrid_models.refusal`).
    """
    check_vllm_args(vllm_args)
    py = resolve_python(python)
    host = [] if any(_flag(a) == "--host" for a in vllm_args) else ["--host", DEFAULT_HOST]
    hicache = []
    if config.enable_hierarchical_cache:
        if any(a == "--kv-transfer-config" or a.startswith("--kv-transfer-config=") for a in vllm_args):
            raise ValueError("--kv-transfer-config: hicache sets it from --enable-hierarchical-cache "
                             "and the --hicache-* flags; pass one or the other")
        hicache = ["--kv-transfer-config", kv_transfer_config(config, prefix_tokens)]
        if config.hicache_size_gb > 0:  # checkable now; ratio sizing is checked when vLLM starts
            SpecConfig(config).check_budget({"vllm_kv": int(config.hicache_size_gb * 1e9)}, 1)
    # last: it may ask the Hugging Face Hub whether it can be reached
    model = check_model(model, vllm_args)
    if config.enable_hierarchical_cache:
        why = refusal(architectures(model, hub_cache_dirs(vllm_args)), vllm_build(py))
        if why:
            raise ValueError(f"MODEL {model}: {why}")
    return [str(py), "-m", env.API_SERVER, "--model", model, *host, *vllm_args, *hicache]


def run_serve(args: argparse.Namespace, vllm_args: Sequence[str]) -> int:
    """Run vLLM's server until it ends; its exit status, or 128 + N after signal N.

    Raises:
        ValueError: a bad flag (``--hicache-write-policy`` other than write_through included).
    """
    if args.write_policy != "write_through":  # the config would take the tree's default as not asked for
        raise ValueError(f"--hicache-write-policy: vLLM stores each block when it is computed, i.e. "
                         f"write_through; got {args.write_policy!r}")
    argv = serve_command(args.model, HiCacheConfig.from_args(args), vllm_args, args.vllm_python,
                         args.hicache_prefix_tokens)
    return run_until_stopped(argv)


def run_until_stopped(argv: Sequence[str]) -> int:
    """Run ``argv`` (vLLM's server) as a `process.ServerGroup`: its own process group,
    temporary folder and shared memory, none left when it ends. SIGINT, SIGTERM and SIGHUP
    sent to this process are passed on to the group, as a terminal's Ctrl-C would be; once
    one was, the status is 128 + N for the first (130 for Ctrl-C, 143 for SIGTERM) and one
    line says so. vLLM's stderr passes through without its shutdown noise (`noise.py`).

    Returns:
        The exit status (vLLM's own, or 128 + N when it was killed by signal N).
    """
    group, forwarded = ServerGroup(argv), []

    def forward(sig: int, _frame) -> None:
        forwarded.append(sig)
        group.signal(sig)

    # Handlers first: a signal that arrives while the child starts is not lost.
    passed = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    relayed = None
    try:
        group.start(stderr=subprocess.PIPE)
        relayed = relay(group.proc.stderr, sys.stderr.buffer)
        code = group.wait()
    finally:
        for sig, handler in passed.items():
            signal.signal(sig, handler)
        group.end()
        if relayed is not None:
            relayed.join(RELAY_JOIN_S)
    if forwarded:
        sig = forwarded[0]
        name = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else signal.Signals(sig).name
        print(f"hicache serve-vllm: stopped by {name}, exit {128 + sig}", file=sys.stderr)
        return 128 + sig
    return code if code >= 0 else 128 - code
