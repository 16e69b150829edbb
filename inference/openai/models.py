"""GET /v1/models/{model}: one model the caller's plan includes, as /v1/models lists it."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import ApiKeyAuthentication, HasScope, request_user
from accounts.metering import metered
from accounts.selectors import deployments_allowed_for_user
from chatsite.errors import ClientError
from inference.openai.apis import ModelListApi
from inference.selectors import deployment_list_enabled, models_listed


@metered("model_list")
class ModelDetailApi(APIView):
    """A model outside the caller's plan, disabled or unknown is the same 404 `model_not_found`
    (what OpenAI and vLLM answer), so the answer says nothing of models the caller cannot use."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated, HasScope]
    required_scope = "models:read"

    @extend_schema(
        operation_id="v1_model_retrieve",
        responses={200: ModelListApi.OutputSerializer, 404: OpenApiResponse(description="No such model.")},
        summary="Retrieve one model your plan includes",
    )
    def get(self, request: Request, model_id: str) -> Response:
        allowed = deployments_allowed_for_user(
            user=request_user(request), deployments=deployment_list_enabled(task=None)
        )
        listed = [entry for entry in models_listed(allowed) if entry[0] == model_id]
        if not listed:
            raise ClientError(
                f"The model '{model_id}' does not exist.", code="model_not_found", status=404, param="model"
            )
        return Response(ModelListApi.OutputSerializer(listed[0]).data)
