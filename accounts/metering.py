"""Every endpoint's limit, declared on the endpoint by the same object that enforces it.

`metered(...)` names, per HTTP method (or per frame type on a socket), the actions of
`accounts.services.ACTIONS` one request counts against the signed-in user's plan: all taken in one
step before the view runs, or none (429 rate_limited with Retry-After, in the API's error shape),
so a refused request changes nothing. A visitor who has not signed in pays into their client
address's bucket instead (`address_admit`).

`ADMITTED` declares that the view's own service charges the plan: a generation's requests and
tokens a minute and its quotas (`request_admit`), an embedding's or tokenizing's
(`api_request_admit`), a moderation request's (`moderation_admit`), a new conversation's
(`action_admit`). Those charges need what only the service knows (the model, the prompt's tokens),
so the declaration names them rather than taking them itself; their own tests prove each refusal.

Because the declaration is the enforcement, "every endpoint is metered" is a check on declarations:
tests/chatsite/test_metering.py walks every URL pattern and socket route and fails for one without
`metering` (`metering_of`) that is not on its short list of exemptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.views import View
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from accounts.services import ACTIONS, actions_admit, address_admit
from chatsite.errors import API_PREFIXES, ClientError, error_body

ADMITTED = "admitted"


@dataclass(frozen=True)
class Metering:
    """What one request counts against: `default`, or its method's (a frame type's) own actions."""

    default: tuple[str, ...]
    by_kind: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for actions in (self.default, *self.by_kind.values()):
            if not actions or any(action != ADMITTED and action not in ACTIONS for action in actions):
                raise ValueError(f"metered: each request needs actions from ACTIONS or ADMITTED, not {actions!r}")

    def actions_for(self, kind: str) -> tuple[str, ...]:
        return self.by_kind.get(kind, self.default)


def _actions(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _address(request: HttpRequest) -> str:
    """The client's address as every limit reads it: the peer's (`REMOTE_ADDR`)."""
    return request.META.get("REMOTE_ADDR", "")[:64]


def request_meter(*, user: Any, address: str, actions: tuple[str, ...]) -> None:
    """Charge one request's `actions` to the signed-in `user`'s plan (the service charges ADMITTED
    itself), or to `address` for a visitor; a ClientError (429) when a bucket is short."""
    charged = tuple(action for action in actions if action != ADMITTED)
    if not charged:
        return
    if user is not None and user.is_authenticated:
        actions_admit(user=user, actions=charged)
    else:
        address_admit(address=address)


def _refused(request: HttpRequest, exc: ClientError) -> HttpResponse:
    """The refusal in the API's error shape, or as a page for a person's browser navigating to one."""
    response: HttpResponse
    if "text/html" in request.headers.get("Accept", "") and not request.path.startswith(API_PREFIXES):
        response = render(request, "too_many_requests.html", {"message": exc.message}, status=exc.status)
    else:
        body = error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param)
        response = JsonResponse(body, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


class MeteredThrottle(BaseThrottle):
    """The declaration's enforcement in a DRF view: it runs once DRF has authenticated the caller (a
    key's owner or the session's user) and checked its permissions, before the handler. A refusal is
    raised, for the API's exception handler to answer with its status and Retry-After."""

    def allow_request(self, request: Any, view: Any) -> bool:
        metering: Metering = view.metering
        request_meter(user=request.user, address=_address(request), actions=metering.actions_for(request.method or ""))
        return True


def metered(default: str | tuple[str, ...], **by_kind: str | tuple[str, ...]) -> Callable[[Any], Any]:
    """Declare and enforce a view's limits: `@metered("request", POST=("file_upload", "document"))`.

    On a DRF APIView class, through `MeteredThrottle`; on another class-based view, by wrapping its
    `dispatch`; on a function view (or a library's `as_view()`), by wrapping it, with the session's
    user; on a socket consumer class, the declaration is by frame type and the consumer calls
    `request_meter` with it for each frame. A view whose every request is ADMITTED is left as it is:
    its service charges.
    """
    metering = Metering(_actions(default), {kind: _actions(actions) for kind, actions in by_kind.items()})
    only_admitted = all(actions == (ADMITTED,) for actions in (metering.default, *metering.by_kind.values()))

    def decorate(view: Any) -> Any:
        if isinstance(view, type):
            cls: Any = view  # the declaration and its enforcement are attributes the class did not have
            cls.metering = metering
            if only_admitted or not issubclass(cls, View):
                return cls  # a consumer charges per frame (conversations.consumers)
            if issubclass(cls, APIView):
                cls.throttle_classes = [*cls.throttle_classes, MeteredThrottle]
                return cls
            cls.dispatch = _metered_dispatch(cls.dispatch, metering)
            return cls
        if only_admitted:
            view.metering = metering
            return view
        if asyncio.iscoroutinefunction(view):

            @wraps(view)
            async def metered_async(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                user = await request.auser()
                try:
                    await sync_to_async(request_meter)(
                        user=user, address=_address(request), actions=metering.actions_for(request.method or "")
                    )
                except ClientError as exc:
                    return _refused(request, exc)
                return await view(request, *args, **kwargs)

            metered_async.metering = metering  # type: ignore[attr-defined]
            return metered_async

        @wraps(view)
        def metered_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                request_meter(
                    user=request.user,
                    address=_address(request),
                    actions=metering.actions_for(request.method or ""),
                )
            except ClientError as exc:
                return _refused(request, exc)
            return view(request, *args, **kwargs)

        metered_view.metering = metering  # type: ignore[attr-defined]
        return metered_view

    return decorate


def _metered_dispatch(dispatch: Callable[..., HttpResponseBase], metering: Metering) -> Callable[..., HttpResponseBase]:
    @wraps(dispatch)
    def metered_dispatch(self: View, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            request_meter(
                user=request.user, address=_address(request), actions=metering.actions_for(request.method or "")
            )
        except ClientError as exc:
            return _refused(request, exc)
        return dispatch(self, request, *args, **kwargs)

    return metered_dispatch


def metering_of(view: Any) -> Metering | None:
    """The declaration behind a URL pattern's callback or a socket route's application: on the
    function itself, or on the class its `as_view()`/`as_asgi()` was made from."""
    for holder in (
        view,
        getattr(view, "view_class", None),
        getattr(view, "cls", None),
        getattr(view, "consumer_class", None),
    ):
        metering = getattr(holder, "metering", None)
        if isinstance(metering, Metering):
            return metering
    return None
