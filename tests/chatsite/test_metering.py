"""Every endpoint is metered: each URL pattern and socket route declares its limits
(accounts.metering), or is on the short list below with the reason it needs none."""

from __future__ import annotations

from typing import Any

from channels.routing import URLRouter
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.metering import ADMITTED, metering_of
from accounts.services import ACTIONS
from chatsite.asgi import application

# Route prefix: why it has no limit of its own. Kept short: every entry is an attacker's way in.
EXEMPT = {
    "healthz": "the load balancer's liveness probe: answers from memory, touches no database or engine",
    "readyz": "the readiness probe: polled every few seconds by the orchestrator, which must never be refused",
    "metrics": "Prometheus's scrape, behind its own token or the internal network (docs/observability.md)",
    "admin/": "staff only (the admin checks is_staff on every view, the operations page included): the "
    "operators who set the limits; its sign-in is throttled as the site's (accounts.admin)",
}
# Static files are served by ServeStaticMiddleware before URL routing, not by a URL pattern: files
# read from memory or disk with long caching, the same for everyone, so there is nothing to walk.


def url_routes(patterns: list[Any] | None = None, prefix: str = "") -> list[tuple[str, Any]]:
    """(route, callback) for every URL pattern, through every include (the admin's, DRF's, apps')."""
    routes = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            routes += url_routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            routes.append((route, entry.callback))
    return routes


def socket_routes() -> list[tuple[str, Any]]:
    """(route, consumer application) for every WebSocket route the ASGI app serves, found through
    whatever middleware wraps its router."""
    app = application.application_mapping["websocket"]
    while not isinstance(app, URLRouter):
        app = next(getattr(app, name) for name in ("app", "application", "inner") if hasattr(app, name))
    return [(str(route.pattern), route.callback) for route in app.routes]


def exemption(route: str) -> str | None:
    return next((reason for prefix, reason in EXEMPT.items() if route.startswith(prefix)), None)


def test_every_url_pattern_declares_its_limits_or_is_exempt_with_a_reason():
    unmetered = [route for route, view in url_routes() if metering_of(view) is None and exemption(route) is None]
    assert unmetered == []


def test_every_socket_route_declares_its_limits():
    """Per frame type (conversations.consumers); opening one is capped per user (accounts.sockets)."""
    routes = socket_routes()
    assert routes, "the walk found no socket route"
    assert [route for route, app in routes if metering_of(app) is None] == []


def test_each_exemption_still_names_a_route_and_a_reason():
    routes = [route for route, _ in url_routes()]
    for prefix, reason in EXEMPT.items():
        assert any(route.startswith(prefix) for route in routes), f"{prefix} no longer exists: drop it"
        assert len(reason) > 20


def test_the_walk_reaches_the_included_apps_the_admin_and_the_api():
    routes = {route for route, _ in url_routes()}
    assert {"api/files/search/", "v1/chat/completions", "files/", "accounts/login/", "s/<str:token>/"} <= routes
    assert any(route.startswith("admin/accounts/tier/") for route in routes)


def test_declarations_name_only_actions_the_machinery_charges():
    for _, view in url_routes() + socket_routes():
        metering = metering_of(view)
        if metering is None:
            continue
        for actions in (metering.default, *metering.by_kind.values()):
            assert all(action == ADMITTED or action in ACTIONS for action in actions)


def test_the_files_endpoints_are_metered_by_their_own_limits():
    views = dict(url_routes())
    assert metering_of(views["api/files/search/"]).actions_for("GET") == ("file_search",)
    for route in ("api/files/", "files/", "api/conversations/<int:conversation_id>/files/"):
        assert set(metering_of(views[route]).actions_for("POST")) == {"file_upload", "document"}
