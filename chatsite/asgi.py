"""The ASGI entry point: HTTP through Django, WebSockets through Channels, lifespan to warm engines."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chatsite.origins import PageOriginValidator  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402
from inference.execution.lifespan import StartedBeforeSockets, lifespan_app  # noqa: E402
from observability.asgi import SocketsCounted  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SocketsCounted(
            PageOriginValidator(AuthMiddlewareStack(StartedBeforeSockets(URLRouter(websocket_urlpatterns))))
        ),
        "lifespan": lifespan_app,
    }
)
