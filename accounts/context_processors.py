from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from accounts.selectors import user_theme


def theme(request: HttpRequest) -> dict[str, Any]:
    """The page theme, read lazily: base.html puts it on <html> so the first paint is in the right
    colours (no flash of the light theme on a dark page), and a page that never renders it costs
    no query."""
    return {"theme": lambda: user_theme(user=request.user)}
