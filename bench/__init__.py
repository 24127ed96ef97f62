"""Benchmarks of reaper (``make bench``; results in BENCHMARKS.md)."""
