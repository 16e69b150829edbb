"""Every field of an OpenAI chat completion request: honoured, refused, ignored, or a vLLM extra.

The API never drops a field that would change the answer: a client that asks for tools, log
probabilities or an audio answer and gets plain text back has no way to tell it was not served.
Only fields that change nothing in the answer (IGNORED, which agent SDKs and gateways send on every
request) are accepted and dropped. So each field the request carries is looked up here: a
supported field is validated by the view's serializer and passed to vLLM's `SamplingParams`; a
field this service cannot honour (or a value of it that asks for something it cannot do) is a 400
naming it; a field nobody knows is a 400 too, unless `OPENAI_API_STRICT_FIELDS` is off, when it is
ignored as OpenAI's own API used to. docs/api.md holds the same table for people.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from rest_framework import serializers

from chatsite.errors import ClientError
from inference.engine.vllm_server_internals import structured_outputs_problem
from inference.openai.schemas import json_schema_problem

# OpenAI's fields this service honours (the serializer validates each).
SUPPORTED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "n",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
        "logprobs",
        "top_logprobs",
        # An end-user id for abuse monitoring: it changes nothing in the answer, at OpenAI either.
        "user",
        "safety_identifier",
        # Tool calling (inference/openai/tools.py): refused there by a deployment without a parser.
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)

# vLLM's sampling fields beyond OpenAI's, passed through to SamplingParams as `vllm serve` does.
EXTRAS = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids"})


def _present(value: Any) -> bool:
    return value is not None


def _truthy(value: Any) -> bool:
    return bool(value)


# OpenAI's fields this service cannot honour: each with the test of a value that asks for something
# (a value that asks for nothing, such as `logprobs: false`, is accepted) and why it is refused.
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "functions": (_truthy, "The deprecated function calling fields are not supported: use 'tools'."),
    "function_call": (
        lambda v: v not in (None, "none"),
        "The deprecated function calling fields are not supported: use 'tool_choice'.",
    ),
    "audio": (_present, "Audio output is not supported."),
    "modalities": (lambda v: v not in (None, ["text"]), "Only text output is supported."),
    "prediction": (_present, "Predicted outputs are not supported."),
    "web_search_options": (_present, "Web search is not supported."),
    "reasoning_effort": (_present, "The models served here do not take a reasoning effort."),
    "verbosity": (_present, "The models served here do not take a verbosity."),
    "store": (_truthy, "Completions are not stored for later retrieval."),
    "service_tier": (lambda v: v not in (None, "auto", "default"), "Only the default service tier exists."),
}


def _metadata(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))


# OpenAI's fields that change nothing in the answer, which agent SDKs and gateways send on every
# request: each with the test of a well-formed value, accepted and dropped. `metadata` tags a stored
# completion (none is stored: `store: true` stays refused); `prompt_cache_key` groups requests for
# OpenAI's prompt cache (vLLM's prefix cache here finds a shared prefix by itself).
IGNORED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "metadata": (_metadata, "an object of strings"),
    "prompt_cache_key": (lambda v: v is None or isinstance(v, str), "a string"),
}


def request_fields_check(payload: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """The request's fields this service honours, or a 400 naming the first it cannot.

    Refused fields whose value asks for nothing, and well-formed IGNORED ones, are dropped here, so
    the serializer sees only what it validates; unknown fields are refused when `strict`, dropped
    otherwise."""
    kept: dict[str, Any] = {}
    for field, value in payload.items():
        if field in SUPPORTED or field in EXTRAS:
            kept[field] = value
        elif field in IGNORED:
            well_formed, shape = IGNORED[field]
            if not well_formed(value):
                raise ClientError(f"Invalid '{field}': it must be {shape}.", code="invalid_value", param=field)
        elif field in REFUSED:
            asks, reason = REFUSED[field]
            if asks(value):
                raise ClientError(
                    f"Unsupported parameter: '{field}'. {reason}", code="unsupported_parameter", param=field
                )
        elif strict:
            raise ClientError(
                f"Unrecognized request argument supplied: '{field}'.", code="unknown_parameter", param=field
            )
    return kept


def response_format_structured_outputs(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's `StructuredOutputsParams` fields (as JSON) for an OpenAI `response_format`, or None
    for plain text. A JSON schema is enforced whether or not the request says `strict`: vLLM's
    grammar backends only know how to enforce one."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        return {"json": response_format["json_schema"]["schema"]}
    raise ValueError(f"unknown response_format type {kind!r}")  # the serializer admits no other


def completion_sampling(*, request: dict[str, Any], deployment: Any) -> dict[str, Any]:
    """The SamplingParams fields (as JSON) of a completion's choices, `max_tokens` and the seed aside.

    The deployment's sampling settings are defaults: they fill only what the request leaves out."""
    sampling: dict[str, Any] = {
        "temperature": deployment.temperature,
        "top_p": deployment.top_p,
        "repetition_penalty": deployment.repetition_penalty,
    }
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty", *sorted(EXTRAS)):
        if request.get(field) is not None:
            sampling[field] = request[field]
    if request.get("stop"):
        sampling["stop"] = request["stop"]
    if request.get("logit_bias"):
        sampling["logit_bias"] = request["logit_bias"]
    if request.get("logprobs") is not None:
        sampling["logprobs"] = request["logprobs"]
    structured = response_format_structured_outputs(request.get("response_format"))
    if structured is not None:
        # The engine would fail the generation, after it is queued and charged: refused before.
        if "json" in structured and (problem := structured_outputs_problem(structured)):
            raise ClientError(
                f"Invalid 'response_format': the JSON schema cannot be enforced: {problem}",
                code="invalid_value",
                param="response_format",
            )
        sampling["structured_outputs"] = structured
    return sampling


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of the `index`th of n choices: seed + index, as vLLM's own server does, so that n
    seeded choices differ from each other and each is reproducible. Wraps within 64 bits."""
    if seed is None:
        return None
    return (seed + index + 2**63) % 2**64 - 2**63


# The most alternatives to a sampled token a request may ask the log probabilities of: vLLM's
# `max_logprobs` (an engine argument, 20 unless a deployment sets it), and OpenAI's limit.
MAX_TOP_LOGPROBS = 20
# Each key a token id: `logit_bias` is keyed by strings in JSON.
LOGIT_BIAS_MAX_ENTRIES = 300
STOP_TOKEN_IDS_MAX = 64
SCHEMA_MAX_CHARS = 50_000


class StopAndStreamOptions:
    """The checks of `stop` and `stream_options`, which the chat and the text completions share (each
    serializer declares the two fields where its other fields are)."""

    def validate_stop(self, stop: Any) -> list[str]:
        if stop is None:
            return []
        stops = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stops, list)
            or len(stops) > 4
            or not all(isinstance(s, str) and 0 < len(s) <= 100 for s in stops)
        ):
            raise serializers.ValidationError("stop must be a string or a list of up to 4 strings.")
        return stops

    def validate_stream_options(self, options: dict[str, Any] | None) -> dict[str, Any]:
        options = options or {}
        if not isinstance(options.get("include_usage", False), bool):
            raise serializers.ValidationError("include_usage must be a boolean.")
        return options


class SamplingFieldsSerializer(serializers.Serializer):
    """The fields beyond the basics that reach vLLM: `logit_bias`, `response_format`, the log
    probabilities and vLLM's extras. A base of the chat completion serializer, which also runs the
    field check above.

    Validated, `logprobs` is the number of most likely tokens to give beside each sampled one (chat's
    `top_logprobs`, 0 when left out), or absent when no log probabilities were asked for: the text
    completion's `logprobs` means the same, and vLLM's `SamplingParams(logprobs=...)` too."""

    logit_bias = serializers.DictField(
        child=serializers.FloatField(min_value=-100, max_value=100), required=False, allow_null=True
    )
    response_format = serializers.JSONField(required=False, allow_null=True)
    logprobs = serializers.BooleanField(required=False, allow_null=True)
    top_logprobs = serializers.IntegerField(min_value=0, max_value=MAX_TOP_LOGPROBS, required=False, allow_null=True)
    safety_identifier = serializers.CharField(max_length=256, required=False, allow_blank=True)
    top_k = serializers.IntegerField(min_value=-1, max_value=10**6, required=False, allow_null=True)
    min_p = serializers.FloatField(min_value=0, max_value=1, required=False, allow_null=True)
    repetition_penalty = serializers.FloatField(min_value=0.01, max_value=2, required=False, allow_null=True)
    min_tokens = serializers.IntegerField(min_value=0, max_value=10**6, required=False, allow_null=True)
    ignore_eos = serializers.BooleanField(required=False, allow_null=True)
    stop_token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0), max_length=STOP_TOKEN_IDS_MAX, required=False, allow_null=True
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = request_fields_check(data, strict=settings.OPENAI_API_STRICT_FIELDS)
        return super().to_internal_value(data)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().validate(data)
        top = data.pop("top_logprobs", None)
        if data.pop("logprobs", None):
            data["logprobs"] = top or 0
        elif top:
            raise serializers.ValidationError({"top_logprobs": ["top_logprobs needs logprobs: true."]})
        return data

    def validate_logit_bias(self, bias: dict[str, float] | None) -> dict[str, float] | None:
        if not bias:
            return None
        if len(bias) > LOGIT_BIAS_MAX_ENTRIES:
            raise serializers.ValidationError(f"At most {LOGIT_BIAS_MAX_ENTRIES} tokens can be biased.")
        if not all(key.isascii() and key.isdigit() for key in bias):  # not "²", which int() refuses
            raise serializers.ValidationError("Each key must be a token id.")
        return {str(int(key)): value for key, value in bias.items()}

    def validate_response_format(self, response_format: Any) -> dict[str, Any] | None:
        if response_format is None:
            return None
        if not isinstance(response_format, dict) or response_format.get("type") not in (
            "text",
            "json_object",
            "json_schema",
        ):
            raise serializers.ValidationError("type must be 'text', 'json_object' or 'json_schema'.")
        if response_format["type"] != "json_schema":
            return {"type": response_format["type"]}
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise serializers.ValidationError("json_schema needs a name.")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise serializers.ValidationError("json_schema.schema must be a JSON Schema object.")
        if len(json.dumps(schema)) > SCHEMA_MAX_CHARS:
            raise serializers.ValidationError(f"json_schema.schema is longer than {SCHEMA_MAX_CHARS} characters.")
        if problem := json_schema_problem(schema):
            raise serializers.ValidationError(f"json_schema.schema is not a valid JSON Schema: {problem}")
        return {"type": "json_schema", "json_schema": {**spec, "schema": schema}}


def token_ids_check(request: dict[str, Any], *, vocab_size: int, max_tokens: int) -> None:
    """What only the model's tokenizer and the answer's budget can tell: token ids within the
    vocabulary, and `min_tokens` within `max_tokens` (vLLM would fail the request in the engine)."""
    for key in request.get("logit_bias") or {}:
        if int(key) >= vocab_size:
            raise ClientError(
                f"Invalid 'logit_bias': token id {key} is not in the model's vocabulary of {vocab_size}.",
                code="invalid_value",
                param="logit_bias",
            )
    for token in request.get("stop_token_ids") or []:
        if token >= vocab_size:
            raise ClientError(
                f"Invalid 'stop_token_ids': token id {token} is not in the model's vocabulary of {vocab_size}.",
                code="invalid_value",
                param="stop_token_ids",
            )
    if (request.get("min_tokens") or 0) > max_tokens:
        raise ClientError(
            f"Invalid 'min_tokens': {request['min_tokens']} is more than the answer's {max_tokens} tokens.",
            code="invalid_value",
            param="min_tokens",
        )
