# Quick start: `make run` (the main job) and `make test` (the CPU test suite).
# Each target sets itself up first (scripts/setup.sh, idempotent).
PY := .venv/bin/python

.PHONY: setup run test bench plan
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) -m hicache.cli replay

test: setup
	$(PY) -m pytest tests

plan: setup
	$(PY) -m hicache.cli plan --model deepseek-v4-pro --device-tokens 1048576 --hicache-ratio 2

bench: setup
	$(PY) bench/allocator.py
	$(PY) bench/h2d.py --quick
	$(PY) bench/controller.py
	$(PY) bench/tree.py
	$(PY) bench/storage.py
