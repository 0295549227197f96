"""Benchmarks run by `make bench` (not part of the test suite)."""
