"""Micro-benchmarks (python -m benchmarks.<name>)."""
