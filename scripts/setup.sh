#!/usr/bin/env bash
# Idempotent set-up for hicache: a virtual environment in .venv that also sees the
# interpreter's own site-packages, so a torch or triton the user already has is kept
# (never replaced); only what is missing gets installed. A first run says what it does, one
# line per step on stderr (it takes a minute or two: pip downloads); a later run is silent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
STAMP=.venv/.hicache-setup
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt scripts/setup.sh ] \
    && [ "$STAMP" -nt setup.py ] && [ -z "$(find hicache host_pools -name '*.[ch]' -newer "$STAMP")" ]; then
  exit 0
fi
START=$SECONDS
step() { echo "hicache setup: $*" >&2; }
if [ -x .venv/bin/python ]; then
  step "1/7 .venv: there, checking what it lacks"
else
  step "1/7 .venv: creating it (it sees $PY's own packages: a torch or triton there is kept)"
  "$PY" -m venv --system-site-packages .venv
fi
V=.venv/bin/python
pipi() { "$V" -m pip install -q --disable-pip-version-check "$@"; }
have() { "$V" -c "import $1" 2>/dev/null; }  # the module imports in .venv
# torch: keep any installed build; otherwise the CPU wheel (an unpinned torch pulls a
# multi-GB CUDA build).
if have torch; then step "2/7 torch: kept, the one installed"; else
  step "2/7 torch: installing torch==2.13.0, the CPU build (~200 MB)"; pipi "torch==2.13.0"; fi
# triton: keep any installed version; needed on CPU too (kernels run under TRITON_INTERPRET=1).
if have triton; then step "3/7 triton: kept, the one installed"; else
  step "3/7 triton: installing (the kernels run interpreted on a CPU)"; pipi "triton>=3.0"; fi
missing=""
for mod in numpy psutil pytest hypothesis matplotlib xxhash; do
  have "$mod" || missing="$missing $mod"
done
step "4/7 numpy psutil pytest hypothesis matplotlib xxhash: $([ -n "$missing" ] && echo "installing$missing" || echo "all there")"
for mod in $missing; do pipi "$mod"; done
# Mooncake Store (the storage tier's distributed backend; its tests start a real master):
# Debian's RDMA user libraries, which its binaries link even over TCP, then the wheel that
# matches torch (-non-cuda without CUDA). Neither pulls torch.
step "5/7 Mooncake client (the storage tier's distributed backend) and the RDMA libraries it links"
if ! ldconfig -p | grep -q "libibverbs.so.1 "; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      libibverbs1 libnl-3-200 libnl-route-3-200 >/dev/null) \
      || echo "setup: apt-get could not install libibverbs1 libnl-3-200 libnl-route-3-200" >&2
  else
    echo "setup: Mooncake needs Debian's libibverbs1 libnl-3-200 libnl-route-3-200; install them" \
      "as root (until then the Mooncake tests are skipped)" >&2
  fi
fi
MOONCAKE=$("$V" -c "import torch; c = torch.version.cuda or ''; print('mooncake-transfer-engine' + \
  ('-cuda13' if c.startswith('13') else '' if c else '-non-cuda'))")
"$V" -c "import importlib.util as u, sys; sys.exit(u.find_spec('mooncake') is None)" 2>/dev/null \
  || pipi "$MOONCAKE" || echo "setup: could not install $MOONCAKE (the Mooncake tests will skip)" >&2
# transformers: the oracle of the reference models' tests (test-only; hicache never imports
# it). Installed pinned when the one here lacks DeepseekV4ForCausalLM (>= 5.19), under a
# constraint that pins the torch already installed, so pip can never replace it; checked after.
if "$V" -c "from transformers import DeepseekV4ForCausalLM" 2>/dev/null; then
  step "6/7 transformers (the test oracle of verify-model's models): kept, it has DeepSeek-V4"
else
  step "6/7 transformers==5.23.0 (the test oracle of verify-model's models): installing, torch pinned"
  TORCH_BEFORE=$("$V" -c "import torch; print(torch.__version__)")
  PIN=$(mktemp)
  echo "torch==$TORCH_BEFORE" > "$PIN"
  pipi -c "$PIN" "transformers==5.23.0" \
    || echo "setup: could not install transformers 5.23.0 (the DeepSeek-V4 oracle tests will skip)" >&2
  rm -f "$PIN"
  TORCH_AFTER=$("$V" -c "import torch; print(torch.__version__)")
  if [ "$TORCH_BEFORE" != "$TORCH_AFTER" ]; then
    echo "setup: installing transformers changed torch $TORCH_BEFORE -> $TORCH_AFTER" >&2
    exit 1
  fi
fi
# editable install without build isolation: needs setuptools >= 64 and wheel locally; it
# compiles the C modules in place, each stamped with its source's hash (optional: without a C
# compiler they are skipped; a C source newer than the stamp reruns this step, which rebuilds)
step "7/7 hicache: editable install (compiles the optional C modules hicache.radix._read, hicache._slot_arrays, host_pools._pages)"
"$V" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" 2>/dev/null \
  || pipi "setuptools>=64"
"$V" -c "import wheel" 2>/dev/null || pipi wheel
pipi --no-deps --no-build-isolation -e .
touch "$STAMP"
step "done in $((SECONDS - START)) s; later runs skip set-up until pyproject.toml, setup.py, a C source or this script change"
