"""The hook through which a response cache above this layer answers a request instead of an engine.

The cache itself (what is kept, when two prompts are close enough, when an entry expires) is the
orchestration layer's (orchestration/cache.py), which registers itself here when it loads. This layer
only asks it (`response_cache_probe`) and, on a hit, queues a generation that plays the earlier
answer back through the runner (`generation_create(cached=...)`, inference.execution.replay): it is
claimed, held for its message's verdict, moderated, streamed, finished and charged as any answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class CachedAnswer:
    """An earlier answer to a close enough prompt: what is played back, and its token count."""

    text: str
    completion_tokens: int


class CacheProbe(Protocol):
    """One request's look into the cache: `hit` is the answer to play back, or None; on a miss,
    `keep` remembers the generation that answers it, so that its answer may serve later requests."""

    hit: CachedAnswer | None

    def keep(self, *, generation_id: Any) -> None: ...


class ResponseCache(Protocol):
    """The cache's look-up for one request (orchestration.cache.cache_probe)."""

    def __call__(
        self,
        *,
        deployment: Any,
        system_prompt: str,
        user_text: str,
        sampling: dict[str, Any],
        max_tokens: int,
        user_id: Any,
    ) -> CacheProbe | None: ...


_cache: ResponseCache | None = None


def response_cache_register(cache: ResponseCache | None) -> None:
    global _cache
    _cache = cache


def response_cache_probe(
    *, deployment: Any, system_prompt: str, user_text: str, sampling: dict[str, Any], max_tokens: int, user_id: Any
) -> CacheProbe | None:
    """The cache's answer for a request with no personal context; None when the deployment's cache
    is off (no statement, no embedding) or no cache is registered."""
    if _cache is None or not deployment.semantic_cache:
        return None
    return _cache(
        deployment=deployment,
        system_prompt=system_prompt,
        user_text=user_text,
        sampling=sampling,
        max_tokens=max_tokens,
        user_id=user_id,
    )
