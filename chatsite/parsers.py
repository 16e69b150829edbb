"""The one JSON parser for request bodies and socket frames.

DRF's views (through `JSONParser`, the only parser REST_FRAMEWORK lists), the async views
(`chatsite.errors.validated_json_body`) and the chat socket all parse with `json_parse`, so a body
that is not strict JSON, or that nests deeper than anything the APIs read, is the same 400 everywhere
and never reaches code that would recurse through it (serializers, `json.dumps`, `repr`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeAlias

from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers

from chatsite.errors import ClientError, request_too_large

# The deepest request any endpoint reads is a few levels (a chat message's content parts); the
# limit leaves room for clients that send more, and keeps Python's recursion limit (about 1,000
# frames, shared with the caller's stack) far away from anything that walks a parsed value.
JSON_MAX_DEPTH = 64

# A JSON object as it came (an API body, a stored order, a wire payload), its fields checked by a
# serializer or by the code that wrote it: the one name for "whatever JSON holds" that the typed
# services and selectors may take and return.
JsonObject: TypeAlias = dict[str, Any]


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, though Python's parser takes them.
    raise ValueError(f"{name} is not a JSON value")


def json_parse(raw: bytes | str) -> Any:
    """The JSON value in `raw`, or a 400 ClientError: not JSON (nor UTF-8), NaN or Infinity, an
    integer of more digits than Python converts, or nesting deeper than JSON_MAX_DEPTH."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # includes invalid UTF-8 and integers beyond Python's digit limit
        raise ClientError("The request body is not valid JSON.", code="invalid_json") from None
    if _nested_deeper_than(value, JSON_MAX_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> ClientError:
    return ClientError(f"The JSON is nested more than {JSON_MAX_DEPTH} levels deep.", code="json_too_deep")


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels; iterative, so any depth is safe."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def request_body(request: Any) -> bytes:
    """A Django request's body, or a 413 ClientError when it is over DATA_UPLOAD_MAX_MEMORY_SIZE
    (Django raises RequestDataTooBig on the first read of `request.body`)."""
    try:
        return request.body
    except RequestDataTooBig:
        raise request_too_large() from None


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser on `json_parse`. It stays a subclass of DRF's: DRF then reads the body
    through `request.body`, which keeps Django's upload limit (RequestDataTooBig, made a 413 by
    `api_exception_handler`)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        return json_parse(stream.read())


def validated_json_body(body: bytes, serializer_class: Any) -> dict[str, Any]:
    """A JSON object body validated by a DRF serializer, for the async views outside DRF's dispatch.

    Anything wrong (not JSON as `json_parse` takes it, not an object, a field that fails) is a 400
    ClientError naming the first offending field.
    """
    payload = json_parse(body)
    if not isinstance(payload, dict):
        raise ClientError("The request body must be a JSON object.", code="invalid_request")
    serializer = serializer_class(data=payload)
    if not serializer.is_valid():
        field, problems = next(iter(serializer.errors.items()))
        detail = problems[0] if isinstance(problems, list) else problems
        if isinstance(detail, dict):  # nested (e.g. a list item)
            detail = next(iter(detail.values()))
            detail = detail[0] if isinstance(detail, list) else detail
        raise ClientError(f"Invalid '{field}': {detail}", code="invalid_value", param=field)
    return serializer.validated_data
