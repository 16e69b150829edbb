"""What the CPU can compute natively, for choices that differ from one CPU to another."""

from __future__ import annotations


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 itself (AVX-512 BF16, which every CPU with AMX has too).

    Without it, bfloat16 matrix products are emulated, and the default model's engine is several
    times slower in bfloat16 than in float32 (figures in docs/performance.md).
    """
    import torch

    # A private probe, hence the getattr.
    return getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
