from __future__ import annotations

import functools
from typing import Any

from django.http import HttpRequest

from accounts.selectors import user_theme


def theme(request: HttpRequest) -> dict[str, Any]:
    """The page theme, read lazily and once: base.html puts it on <html> so the first paint is in the
    right colours (no flash of the light theme on a dark page), the chat page picks its code style by
    it, and a page that never renders it costs no query."""

    @functools.cache
    def page_theme() -> str:
        return user_theme(user=request.user)

    return {"theme": page_theme}
