"""Benchmarks of placement policies on public cluster traces."""
