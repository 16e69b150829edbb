"""POST /v1/embeddings: OpenAI's embeddings, served by a deployment whose task is `embed`.

The default one, `all-minilm-l6-v2`, is the sentence-embedding model moderation already loads in
every web process (384 dimensions, unit length), so it is served here, in the request's thread, and
not by a vLLM engine. The request passes the chat path's plan: the `embeddings` scope, the tier's
models, its quotas and its requests and tokens a minute; each request is one ledger row (kind
`embedding`) at the tier's prompt price for the deployment.

Input is not moderated: an embedding writes no text anyone reads, and a classifier pass would cost
as much again as the embedding itself. An input longer than the model's window is refused
(400 context_length_exceeded), not truncated unseen.
"""

from __future__ import annotations

import base64
from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.authentication import ApiKeyAuthentication, HasScope, request_user
from accounts.metering import ADMITTED, metered
from accounts.models import ApiKey
from accounts.services import admission_refund, api_request_admit, embedding_record
from chatsite.errors import ClientError
from inference.models import ModelDeployment
from inference.openai.ratelimits import RateLimitHeaders
from inference.selectors import deployment_get
from moderation.services import (
    sentence_dimensions,
    sentence_embeddings,
    sentence_model_serves,
    sentence_token_counts,
)

MAX_INPUTS = 64
# Before anything is tokenized: a text over the window's tokens at this many characters a token
# could not fit anyway (settings.PROMPT_MAX_CHARS_PER_TOKEN is the chat path's bound).
MAX_CHARS_PER_TOKEN = 8


@metered(ADMITTED)
class EmbeddingApi(RateLimitHeaders):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "embeddings"

    class InputSerializer(serializers.Serializer):
        model = serializers.CharField(max_length=100)
        input = serializers.JSONField(help_text="A string or a list of up to 64 strings.")
        encoding_format = serializers.ChoiceField(choices=["float", "base64"], default="float")
        dimensions = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**31 - 1)
        user = serializers.CharField(max_length=256, required=False, allow_blank=True)

        def to_internal_value(self, data: Any) -> dict[str, Any]:
            if isinstance(data, dict):
                unknown = sorted(set(data) - set(self.fields))
                if unknown:
                    raise serializers.ValidationError({unknown[0]: ["This field is not supported."]})
            return super().to_internal_value(data)

        def validate_input(self, value: Any) -> list[str]:
            texts = [value] if isinstance(value, str) else value
            if not isinstance(texts, list) or not texts or len(texts) > MAX_INPUTS:
                raise serializers.ValidationError(f"Send a string or a list of 1 to {MAX_INPUTS} strings.")
            if not all(isinstance(text, str) for text in texts):
                raise serializers.ValidationError("Each input must be a string (token ids are not supported).")
            if not all(text.strip() for text in texts):
                raise serializers.ValidationError("An input cannot be empty.")
            if any("\x00" in text for text in texts):
                raise serializers.ValidationError("An input cannot contain NUL characters.")
            return texts

    @extend_schema(
        request=inline_serializer(
            "EmbeddingRequest",
            {
                "model": serializers.CharField(),
                "input": serializers.JSONField(),
                "encoding_format": serializers.ChoiceField(choices=["float", "base64"], required=False),
                "dimensions": serializers.IntegerField(required=False, allow_null=True),
                "user": serializers.CharField(required=False),
            },
        ),
        responses=inline_serializer(
            "EmbeddingList",
            {
                "object": serializers.CharField(),
                "data": serializers.ListField(child=serializers.DictField()),
                "model": serializers.CharField(),
                "usage": serializers.DictField(child=serializers.IntegerField()),
            },
        ),
        summary="Embed texts with an embedding model",
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        deployment = _deployment(data["model"])
        texts = data["input"]
        size = sentence_dimensions(model=deployment.model)
        if data.get("dimensions") not in (None, size):
            raise ClientError(
                f"The model '{deployment.name}' gives {size} dimensions only.", code="invalid_value", param="dimensions"
            )
        tokens = sum(_token_counts(deployment, texts))
        admission = api_request_admit(
            user=request_user(request), deployment=deployment, tokens=tokens, api_key=_api_key(request)
        )
        try:
            vectors = sentence_embeddings(model=deployment.model, texts=texts)
        except BaseException:
            admission_refund(admission=admission)
            raise
        embedding_record(user=request_user(request), deployment=deployment, tokens=tokens)
        encode = _base64 if data["encoding_format"] == "base64" else _floats
        return Response(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
                "model": deployment.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


def _deployment(name: str) -> ModelDeployment:
    deployment = deployment_get(name=name, task=ModelDeployment.Task.EMBED)
    if not sentence_model_serves(deployment.model):
        raise ClientError(
            f"The model '{name}' has no embedding backend in this service.", code="model_unavailable", status=503
        )
    return deployment


def _token_counts(deployment: ModelDeployment, texts: list[str]) -> list[int]:
    """Each input's tokens; an input the model's window cannot hold is a 400 naming it."""
    window = deployment.max_context
    for i, text in enumerate(texts):
        if len(text) > window * MAX_CHARS_PER_TOKEN:
            raise _too_long(deployment, i, f"{len(text):,} characters")
    counts, most = sentence_token_counts(model=deployment.model, texts=texts)
    window = min(window, most)
    for i, count in enumerate(counts):
        if count > window:
            raise _too_long(deployment, i, f"{count} tokens")
    return counts


def _too_long(deployment: ModelDeployment, index: int, size: str) -> ClientError:
    return ClientError(
        f"This model's maximum context length is {deployment.max_context} tokens; input {index} has {size}.",
        code="context_length_exceeded",
        param="input",
    )


def _floats(vector: Any) -> list[float]:
    return [float(x) for x in vector]


def _base64(vector: Any) -> str:
    """OpenAI's base64 encoding: the float32 values' little-endian bytes (the openai client asks for it)."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def _api_key(request: Request) -> ApiKey | None:
    """The key the request was authenticated with (API-key authentication puts it in `auth`)."""
    return request.auth if isinstance(request.auth, ApiKey) else None
