"""The `x-ratelimit-*` headers OpenAI's clients and SDKs read, on every answer of the endpoints
that pay into the plan's requests and tokens a minute (chat and text completions, embeddings,
tokenizing), refusals included.

Read from the same token buckets that admit the request (accounts.services.rate_limit_levels),
after it has paid: `remaining` is what is left now, and `reset` how long until the bucket is full
again, in OpenAI's duration format ("1s", "6m0s", "20ms"). A limit the plan does not have is not
sent, as OpenAI leaves out what does not apply."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from accounts.models import ApiKey
from accounts.services import BucketLevel, rate_limit_levels
from chatsite.database import db_async


def duration(seconds: float) -> str:
    """Seconds as OpenAI writes them in `x-ratelimit-reset-*`: "20ms", "1.5s", "6m0s", "1h2m3s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def rate_limit_headers(*, user: Any, api_key: ApiKey | None) -> dict[str, str]:
    levels = rate_limit_levels(user=user, api_key=api_key)
    headers = {}
    for kind, level in (("requests", levels.requests), ("tokens", levels.tokens)):
        if level is not None:
            headers.update(_headers(kind, level))
    return headers


def _headers(kind: str, level: BucketLevel) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(level.limit),
        f"x-ratelimit-remaining-{kind}": str(level.remaining),
        f"x-ratelimit-reset-{kind}": duration(level.reset_s),
    }


async def with_rate_limits(response: HttpResponseBase, *, user: Any, api_key: ApiKey | None) -> HttpResponseBase:
    """`response` with the caller's headers; unchanged when there is no caller (a refused key)."""
    if user is not None:
        for name, value in (await db_async(rate_limit_headers)(user=user, api_key=api_key)).items():
            response[name] = value
    return response


class RateLimitHeaders(APIView):
    """A DRF view whose answers, errors included, carry the authenticated caller's headers."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            api_key = request.auth if isinstance(request.auth, ApiKey) else None
            for name, value in rate_limit_headers(user=user, api_key=api_key).items():
                response[name] = value
        return response
