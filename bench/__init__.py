"""Benchmarks: one script per question on a shared harness (bench.harness)."""
