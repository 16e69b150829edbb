"""`python -m benchmarks <name> [options]`: one entry point for every benchmark (benchmarks/harness.py)."""

from __future__ import annotations

# The guard matters: vLLM starts its engine processes by spawning, and each re-imports this module.
if __name__ == "__main__":
    from benchmarks.harness import main

    main()
