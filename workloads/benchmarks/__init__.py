"""Benchmark commands whose figures go to docs/results.md."""
