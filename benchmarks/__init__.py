"""On-demand measurements: `python -m benchmarks <name>`, or the Makefile's `benchmark-*` targets."""
