"""vLLM's SamplingParams from a generation's sampling fields, which are stored as JSON.

A generation's `sampling` is a JSON column (it travels to GPU workers in the Celery message), so the
few fields vLLM takes as objects or int-keyed maps are rebuilt here: structured outputs and the
logit bias. Everything else is passed as it is: vLLM validates it.
"""

from __future__ import annotations

from typing import Any


def sampling_params(sampling: dict[str, Any]) -> Any:
    """A streaming (`DELTA`) `SamplingParams` for `sampling`."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    fields = dict(sampling)
    structured = fields.pop("structured_outputs", None)
    if structured is not None:
        fields["structured_outputs"] = StructuredOutputsParams(**structured)
    if fields.get("logit_bias"):
        fields["logit_bias"] = {int(token): bias for token, bias in fields["logit_bias"].items()}
    return SamplingParams(**fields, output_kind=RequestOutputKind.DELTA)
