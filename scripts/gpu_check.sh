#!/usr/bin/env bash
# One device session's checks (GPU machine: no network, python3 has torch and triton):
# the GPU tests, the whole suite on the GPU machine, the controller and H2D benchmarks.
# Usage: scripts/gpu_check.sh OUT_DIR [h2d args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}; shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > "$OUT/env.txt"
python3 -c "import torch,triton,numpy;print(torch.__version__,triton.__version__,numpy.__version__)" >> "$OUT/env.txt"
timeout 240 python3 -m pytest tests -m gpu -q -p no:cacheprovider -x > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.log"
if [ "${FULL_SUITE:-0}" = 1 ]; then
  timeout 300 python3 -m pytest tests -q -p no:cacheprovider -n 8 -m "not gpu" > "$OUT/suite.log" 2>&1
  echo "suite rc=$?"; tail -3 "$OUT/suite.log"
fi
timeout 120 python3 bench/controller.py --reps 20 > "$OUT/controller.log" 2>&1
echo "controller rc=$?"; tail -7 "$OUT/controller.log"; cp bench/results/local/controller_*.json "$OUT/" 2>/dev/null
timeout "${H2D_TIMEOUT:-300}" python3 bench/h2d.py --out "$OUT/h2d.json" --no-plot "$@" > "$OUT/h2d.log" 2>&1
echo "h2d rc=$?"
