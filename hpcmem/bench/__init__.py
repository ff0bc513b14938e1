"""Benchmarks: `python -m hpcmem.bench.<name>`; each prints ratios against a reference run in the same process."""
