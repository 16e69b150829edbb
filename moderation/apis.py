"""POST /v1/moderations: OpenAI's moderation endpoint, backed by this service's classifiers."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope, request_user
from accounts.metering import ADMITTED, metered
from accounts.services import moderation_admit
from chatsite.errors import ClientError
from moderation.services import moderations_create

MAX_INPUTS = 32
# For all the inputs together: scoring costs CPU time in proportion (about 1.2 s for this many).
MAX_CHARS = 32_000


@metered(ADMITTED)
class ModerationCreateApi(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "chat"

    class InputSerializer(serializers.Serializer):
        input = serializers.JSONField()
        model = serializers.CharField(max_length=100, required=False, allow_blank=True)

        def validate_input(self, value):
            texts = [value] if isinstance(value, str) else value
            if not isinstance(texts, list) or not texts or len(texts) > MAX_INPUTS:
                raise serializers.ValidationError(f"Send a string or a list of 1 to {MAX_INPUTS} strings.")
            if not all(isinstance(text, str) for text in texts):
                raise serializers.ValidationError("Each input must be a string.")
            return texts

    @extend_schema(
        request=inline_serializer(
            "ModerationRequest", {"input": serializers.JSONField(), "model": serializers.CharField(required=False)}
        ),
        responses=inline_serializer(
            "ModerationResult",
            {"id": serializers.CharField(), "model": serializers.CharField(), "results": serializers.ListField()},
        ),
        summary="Classify texts with OpenAI's moderation categories",
    )
    def post(self, request: Request) -> Response:
        """Refused by size, then admitted against the plan and charged, and only then scored."""
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        texts = serializer.validated_data["input"]
        if sum(len(text) for text in texts) > MAX_CHARS:
            raise ClientError(
                f"The inputs are longer than {MAX_CHARS:,} characters together.",
                code="input_too_long",
                status=413,
                param="input",
            )
        moderation_admit(user=request_user(request), texts=texts)
        return Response(moderations_create(inputs=texts, model=serializer.validated_data.get("model")))
