#!/usr/bin/env bash
# One device session's checks (GPU machine: no network, python3 has torch and triton).
# Usage: scripts/gpu_check.sh quick [OUT_DIR [BUDGET_S]]    (the load question, one call)
#        scripts/gpu_check.sh OUT_DIR [STEP...]
# quick: bench/gpu_quick.py within BUDGET_S seconds (default 360; at most 600): the GPU tests
# of the transfer path, DeepSeek-V4-Pro 16/64-page loads on auto, triton and dma (idle, beside
# GEMMs, both ways), --host-only, verify-model --device cuda and the device's measured profile
# (bench/device_profile.py: OUT_DIR/profile.json, for `hicache replay --device-profile`, compared
# with the shipped h100 one in the JSON); ONE JSON, OUT_DIR/gpu_quick.json (default OUT_DIR:
# bench/results/local/gpu_quick), read back by `bench/gpu_quick.py --read`.
# Steps (default: all but grid and suite, in this order; each fits one 10-minute device command):
#   tests       the GPU tests (pytest -m gpu)
#   kernel      the compiled copy kernel's resources (shared memory, registers, spills)
#   load_pro    bench/load_batch.py on DeepSeek-V4-Pro (the targets of issue 16)
#   load_flash  bench/load_batch.py on DeepSeek-V4-Flash
#   load_dense  bench/load_batch.py on the MHA and MLA models
#   null        bench/load_batch.py --null (host enqueue alone) on DeepSeek-V4-Pro
#   host_only   bench/load_batch.py --host-only (each backend's preparation, no device calls)
#   calibrate   bench/load_batch.py --calibrate: the "auto" table measured here (auto_table.json;
#               commit it as transfer_kernels' seed or load it with HICACHE_AUTO_TABLE) and the
#               device profile its loads give (profile.json)
#   verify      hicache verify-model on CUDA: deepseek-v4 (fp32 and --kv-format fp8_ds_mla), mha
#   controller  bench/controller.py (real launches' host cost)
#   h2d         bench/h2d.py (per-pool curves, GPU-gated)
#   grid        bench/triton_grid.py (grid x tile x warps sweep)
#   suite       the whole CPU suite on the GPU machine (FULL_SUITE=1 adds it to the default)
# Results go to OUT_DIR (copy the JSON to bench/results/ to commit them).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
usage() { echo "usage: scripts/gpu_check.sh quick [OUT_DIR [BUDGET_S]] | scripts/gpu_check.sh OUT_DIR [STEP...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = quick ]; then
  [ $# -le 3 ] || usage
  OUT=${2:-bench/results/local/gpu_quick}; BUDGET=${3:-360}
  case $BUDGET in ''|*[!0-9]*) echo "gpu_check.sh quick: BUDGET_S must be a whole number of seconds, got '$BUDGET'" >&2; exit 2 ;; esac
  [ "$BUDGET" -ge 10 ] && [ "$BUDGET" -le 600 ] || { echo "gpu_check.sh quick: BUDGET_S must be in [10, 600], got $BUDGET" >&2; exit 2; }
  exec env PYTHONPATH="$PWD" "$PY" bench/gpu_quick.py --out "$OUT" --budget-s "$BUDGET" ${GPU_QUICK_SMOKE:+--smoke}
fi
OUT=$1; shift
STEPS=${*:-tests kernel load_pro load_flash load_dense null host_only calibrate verify controller h2d}
[ "${FULL_SUITE:-0}" = 1 ] && STEPS="$STEPS suite"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > "$OUT/env.txt"
python3 -c "import torch,triton,numpy;print(torch.__version__,triton.__version__,numpy.__version__)" >> "$OUT/env.txt"
step() {  # step NAME TIMEOUT_S COMMAND...: run, keep the log, print rc and the tail
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"; tail -"${TAIL:-6}" "$OUT/$name.log"
}
for s in $STEPS; do
  case $s in
    tests) step gpu_tests 420 python3 -m pytest tests -m gpu -q -p no:cacheprovider ;;
    kernel) step kernel 120 python3 -m transfer_kernels.cuda.inspect --tiles 8192,32768 ;;
    load_pro) step load_pro 580 python3 bench/load_batch.py --models deepseek-v4-pro \
               --out "$OUT/load_batch_pro.json" ;;
    load_flash) step load_flash 580 python3 bench/load_batch.py --models deepseek-v4-flash \
               --out "$OUT/load_batch_flash.json" ;;
    load_dense) step load_dense 580 python3 bench/load_batch.py --models llama-3.1-8b,deepseek-v3 \
               --out "$OUT/load_batch_dense.json" ;;
    null) step null 300 python3 bench/load_batch.py --null --models deepseek-v4-pro --layouts page_first \
               --out "$OUT/load_batch_null.json" ;;
    host_only) step host_only 300 python3 bench/load_batch.py --host-only --models deepseek-v4-pro \
               --layouts page_first --out "$OUT/load_batch_host_only.json" ;;
    calibrate) step calibrate 580 python3 bench/load_batch.py --calibrate --table-out "$OUT/auto_table.json" \
               --profile-out "$OUT/profile.json" ;;
    verify) step verify 580 bash -c 'python3 -m hicache.cli verify-model --device cuda --json > "$0/verify_v4.json" &&
               python3 -m hicache.cli verify-model --device cuda --kv-format fp8_ds_mla --json > "$0/verify_v4_fp8.json" &&
               python3 -m hicache.cli verify-model --device cuda --arch mha --json > "$0/verify_mha.json"' "$OUT" ;;
    controller) step controller 240 python3 bench/controller.py --reps 20
                cp bench/results/local/controller_*.json "$OUT/" 2>/dev/null ;;
    h2d) step h2d "${H2D_TIMEOUT:-500}" python3 bench/h2d.py --out "$OUT/h2d.json" --no-plot ;;
    grid) step grid 560 python3 bench/triton_grid.py --out "$OUT/triton_grid.json" ;;
    suite) step suite 560 python3 -m pytest tests -q -p no:cacheprovider -n 8 -m "not gpu" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
