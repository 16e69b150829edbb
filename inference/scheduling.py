"""Queue order across tiers: paid tiers first, free users never starved.

Every generation carries its tier's `priority` (lower is served first, vLLM's convention). Ordering
by that alone would let a steady stream of paid requests keep a free one waiting forever, so the
order uses an *effective* priority that improves as a request waits (aging):

    effective = priority - floor(waited_seconds / aging_s)

With `aging_s` = 15 (INFERENCE_PRIORITY_AGING_S), a free request (priority 4) that has waited 30 s
ranks with a fresh pro request (priority 2), and after 60 s with an admin's (0). Ties go to the
request that came first. Because every waiting request's effective priority keeps falling while
new arrivals start at their tier's value, every request is eventually first in line: paid tiers
are served ahead, and a free request's extra wait is bounded by (its priority - the best
priority) x aging_s.

These are pure functions so a dispatcher (Celery routing by broker priority or per-priority queues,
or vLLM's own `priority` scheduling) can apply the same policy wherever it picks the next request.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Protocol, TypeVar


class Queued(Protocol):
    priority: int
    created_at: dt.datetime


Q = TypeVar("Q", bound=Queued)


def effective_priority(*, priority: int, waited_s: float, aging_s: float) -> int:
    if aging_s <= 0:
        return priority
    return priority - math.floor(max(0.0, waited_s) / aging_s)


def queue_order(items: Iterable[Q], *, now: dt.datetime, aging_s: float) -> list[Q]:
    """`items` in the order they should be served: effective priority, then arrival."""
    return sorted(
        items,
        key=lambda item: (
            effective_priority(
                priority=item.priority, waited_s=(now - item.created_at).total_seconds(), aging_s=aging_s
            ),
            item.created_at,
        ),
    )
