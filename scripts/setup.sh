#!/usr/bin/env bash
# Idempotent set-up for hicache: a virtual environment in .venv that also sees the
# interpreter's own site-packages, so a torch or triton the user already has is kept
# (never replaced); only what is missing gets installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
STAMP=.venv/.hicache-setup
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt scripts/setup.sh ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv --system-site-packages .venv
V=.venv/bin/python
pipi() { "$V" -m pip install -q --disable-pip-version-check "$@"; }
# torch: keep any installed build; otherwise the CPU wheel (an unpinned torch pulls a
# multi-GB CUDA build).
"$V" -c "import torch" 2>/dev/null || pipi "torch==2.13.0"
# triton: keep any installed version; needed on CPU too (kernels run under TRITON_INTERPRET=1).
"$V" -c "import triton" 2>/dev/null || pipi "triton>=3.0"
for mod in numpy psutil pytest hypothesis matplotlib; do
  "$V" -c "import $mod" 2>/dev/null || pipi "$mod"
done
# editable install without build isolation: needs setuptools >= 64 and wheel locally
"$V" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" 2>/dev/null \
  || pipi "setuptools>=64"
"$V" -c "import wheel" 2>/dev/null || pipi wheel
pipi --no-deps --no-build-isolation -e .
touch "$STAMP"
