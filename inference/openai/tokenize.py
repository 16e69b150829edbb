"""POST /tokenize and /detokenize, as vLLM's OpenAI server has them, with a chat model's own tokenizer.

Shapes are vLLM's: /tokenize takes a `prompt` (with `add_special_tokens`) or chat `messages` (with
`add_generation_prompt`, rendered as a chat completion's prompt is) and answers `count`,
`max_model_len`, `tokens` and, with `return_token_strs`, `token_strs`; /detokenize takes `tokens` and
answers `prompt`. `model` may be left out for the default deployment, as vLLM's lone model. Both
need the `chat` scope and a plan that includes the model, and count as a request against the plan's
requests a minute; nothing is written to the ledger (no model runs, nothing is charged).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.authentication import ApiKeyAuthentication, HasScope, request_user
from accounts.metering import ADMITTED, metered
from accounts.models import ApiKey
from accounts.services import api_request_admit
from chatsite.errors import ClientError
from inference.engine.tokenizers import chat_template_text, render_chat, tokenizer_for
from inference.models import ModelDeployment
from inference.openai.apis import ChatCompletionInputSerializer
from inference.openai.ratelimits import RateLimitHeaders
from inference.selectors import deployment_get

MAX_PROMPT_CHARS = 200_000
MAX_TOKENS = 65_536


class _StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming the first (nothing is silently ignored)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["This field is not supported."]})
        return super().to_internal_value(data)


class TokenizeInputSerializer(_StrictSerializer):
    model = serializers.CharField(max_length=100, required=False, allow_null=True, allow_blank=True)
    prompt = serializers.CharField(max_length=MAX_PROMPT_CHARS, required=False, trim_whitespace=False)
    messages = serializers.ListField(child=serializers.DictField(), min_length=1, max_length=512, required=False)
    add_special_tokens = serializers.BooleanField(default=True)
    add_generation_prompt = serializers.BooleanField(default=True)
    return_token_strs = serializers.BooleanField(default=False, allow_null=True)

    def validate_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        return ChatCompletionInputSerializer().validate_messages(messages)

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if ("prompt" in data) == ("messages" in data):
            raise serializers.ValidationError({"prompt": ["Send either a prompt or messages."]})
        if "prompt" in data and "\x00" in data["prompt"]:
            raise serializers.ValidationError({"prompt": ["The prompt cannot contain NUL characters."]})
        return data


class DetokenizeInputSerializer(_StrictSerializer):
    model = serializers.CharField(max_length=100, required=False, allow_null=True, allow_blank=True)
    tokens = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**31 - 1), max_length=MAX_TOKENS
    )


def _deployment_for(request: Request, model: str | None) -> ModelDeployment:
    """The chat deployment named (or the default one), admitted against the caller's plan."""
    deployment = deployment_get(name=model or None)
    api_request_admit(user=request_user(request), deployment=deployment, tokens=0, api_key=_api_key(request))
    return deployment


@metered(ADMITTED)
class TokenizeApi(RateLimitHeaders):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    @extend_schema(
        request=TokenizeInputSerializer,
        responses=inline_serializer(
            "TokenizeResult",
            {
                "count": serializers.IntegerField(),
                "max_model_len": serializers.IntegerField(),
                "tokens": serializers.ListField(child=serializers.IntegerField()),
                "token_strs": serializers.ListField(child=serializers.CharField(), allow_null=True),
            },
        ),
        summary="Tokenize a prompt or chat messages with a model's tokenizer (vLLM's /tokenize)",
    )
    def post(self, request: Request) -> Response:
        serializer = TokenizeInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        deployment = _deployment_for(request, data.get("model"))
        tokenizer = tokenizer_for(deployment.model_path)
        if "messages" in data:
            if data["add_generation_prompt"]:
                tokens = render_chat(tokenizer, data["messages"], chat_template=deployment.chat_template)
            else:
                template = chat_template_text(deployment.chat_template)
                text = tokenizer.apply_chat_template(
                    [{**m, "content": m["content"] or ""} for m in data["messages"]],
                    tokenize=False,
                    add_generation_prompt=False,
                    **({} if template is None else {"chat_template": template}),
                )
                tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            tokens = tokenizer(data["prompt"], add_special_tokens=data["add_special_tokens"])["input_ids"]
        return Response(
            {
                "count": len(tokens),
                "max_model_len": deployment.max_context,
                "tokens": tokens,
                "token_strs": tokenizer.convert_ids_to_tokens(tokens) if data["return_token_strs"] else None,
            }
        )


@metered(ADMITTED)
class DetokenizeApi(RateLimitHeaders):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    @extend_schema(
        request=DetokenizeInputSerializer,
        responses=inline_serializer("DetokenizeResult", {"prompt": serializers.CharField()}),
        summary="Turn token ids back into text with a model's tokenizer (vLLM's /detokenize)",
    )
    def post(self, request: Request) -> Response:
        serializer = DetokenizeInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        deployment = _deployment_for(request, data.get("model"))
        tokenizer = tokenizer_for(deployment.model_path)
        if any(token >= len(tokenizer) for token in data["tokens"]):
            raise ClientError(
                f"Token ids must be below {len(tokenizer)}, the model's vocabulary.",
                code="invalid_value",
                param="tokens",
            )
        return Response({"prompt": tokenizer.decode(data["tokens"])})


def _api_key(request: Request) -> ApiKey | None:
    """The key the request was authenticated with (API-key authentication puts it in `auth`)."""
    return request.auth if isinstance(request.auth, ApiKey) else None
