from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """An error a client can act on: a stable `code`, an HTTP-style `status`, optionally a retry hint.

    Services raise it; the API's exception handler and the WebSocket consumer turn it into their own
    wire shapes, so the same refusal reads the same everywhere.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 400,
        retry_after: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after = retry_after
        self.param = param


def request_too_large() -> ClientError:
    """A body over DATA_UPLOAD_MAX_MEMORY_SIZE, which Django raises as RequestDataTooBig when it is read."""
    return ClientError("The request body is too large.", code="request_too_large", status=413)


# OpenAI's error `type` for each status, so every API error reads like OpenAI's.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


# OpenAI's code for a request without a valid key: every 401 of both APIs carries it.
INVALID_API_KEY = "invalid_api_key"


def error_body(*, message: str, status: int, code: str | None, param: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's error shape."""
    return {
        "error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param, "code": code}
    }


def api_exception_handler(exc: Exception, context: dict) -> Any:
    """Every REST error in OpenAI's shape: ClientError with its status and Retry-After, and DRF's own
    errors (validation, authentication, permission, not found, throttling) translated, every 401 as
    `invalid_api_key` (DRF's `not_authenticated` and `authentication_failed` too). A body over
    the upload limit, which Django raises as it is read, is a 413."""
    from django.core.exceptions import RequestDataTooBig
    from rest_framework import exceptions
    from rest_framework.response import Response
    from rest_framework.views import exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = request_too_large()
    if isinstance(exc, ClientError):
        response = Response(
            error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param), status=exc.status
        )
        if exc.retry_after is not None:
            response["Retry-After"] = str(exc.retry_after)
        return response
    handled = exception_handler(exc, context)
    if handled is None or not isinstance(exc, exceptions.APIException):
        return handled
    response = handled
    param: str | None = None
    message: Any = exc.detail
    if isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict) and exc.detail:
        param, problems = next(iter(exc.detail.items()))
        message = problems[0] if isinstance(problems, list) and problems else problems
        message = f"Invalid '{param}': {message}"
    elif isinstance(exc.detail, list) and exc.detail:
        message = exc.detail[0]
    codes = exc.get_codes()
    code = codes if isinstance(codes, str) else getattr(exc, "default_code", None)
    if response.status_code == 401:
        # One code for a missing or bad key on every endpoint, OpenAI's, which its clients read.
        code = INVALID_API_KEY
    response.data = error_body(message=str(message), status=response.status_code, code=code, param=param)
    return response


API_PREFIXES = ("/api/", "/v1/")


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """A URL nothing serves: OpenAI's error shape under the APIs (`/api/conversations/abc/`), the site's
    page elsewhere. Django calls this only when DEBUG is off."""
    from django.http import JsonResponse
    from django.views.defaults import page_not_found

    if request.path.startswith(API_PREFIXES):
        body = error_body(message=f"Nothing is served at {request.path}.", status=404, code="not_found")
        return JsonResponse(body, status=404)
    return page_not_found(request, exception)


def bad_request(request: Any, exception: Exception | None = None) -> Any:
    """A request Django itself refuses (SuspiciousOperation): OpenAI's error shape under the APIs, a
    413 for a body over the upload limit, the site's page elsewhere. Django calls this only when
    DEBUG is off; the API views turn an oversized body into the same 413 themselves."""
    from django.core.exceptions import RequestDataTooBig
    from django.http import JsonResponse
    from django.views.defaults import bad_request as bad_request_page

    if not request.path.startswith(API_PREFIXES):
        return bad_request_page(request, exception)  # type: ignore[arg-type]  # Django passes one
    if isinstance(exception, RequestDataTooBig):
        refused = request_too_large()
    else:
        refused = ClientError("The request could not be read.", code="bad_request")
    return JsonResponse(
        error_body(message=refused.message, status=refused.status, code=refused.code), status=refused.status
    )


def server_error(request: Any) -> Any:
    """An unhandled error: OpenAI's error shape under the APIs, the site's page elsewhere."""
    from django.http import JsonResponse
    from django.views.defaults import server_error as server_error_page

    if request.path.startswith(API_PREFIXES):
        body = error_body(message="The server failed to handle this request.", status=500, code="internal_error")
        return JsonResponse(body, status=500)
    return server_error_page(request)
