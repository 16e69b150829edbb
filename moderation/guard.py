"""An optional guard model (Llama Guard 3 or 4) as an extra input classifier.

Where a GPU deployment serves a guard model behind an OpenAI-compatible endpoint (`vllm serve
meta-llama/Llama-Guard-3-8B`, or a deployment of this service reached through its own `/v1` with
an API key), set `MODERATION_GUARD_URL` and the guard's verdict joins the built-in classifiers' on
every user message and in `/v1/moderations`: each hazard category it names raises the matching
OpenAI category to the guard's confidence, and the tier's policy decides as usual.

The guard is asked through the chat completions API: the model's own chat template wraps the user's
text in the Llama Guard prompt, and the answer is `safe`, or `unsafe` and a line of hazard codes
(`S1,S10`). With log-probabilities on, the confidence is the probability of the first answer token;
without them it is 1.

It fails open: when the guard does not answer within `MODERATION_GUARD_TIMEOUT_S`, the built-in
classifiers decide alone and a warning is logged, so a guard outage never stops the chat.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any

from django.conf import settings

from moderation.classifiers import Scores, with_floors

logger = logging.getLogger(__name__)

# The MLCommons hazard taxonomy Llama Guard 3 and 4 answer with, mapped to OpenAI's categories.
# S6 specialised advice, S7 privacy, S8 intellectual property, S13 elections and S14 code
# interpreter abuse have no OpenAI counterpart and are not mapped.
HAZARD_CATEGORIES: dict[str, tuple[str, ...]] = {
    "S1": ("violence", "illicit/violent"),  # violent crimes
    "S2": ("illicit",),  # non-violent crimes
    "S3": ("sexual", "illicit"),  # sex-related crimes
    "S4": ("sexual/minors",),  # child sexual exploitation
    "S5": ("harassment",),  # defamation
    "S9": ("illicit/violent",),  # indiscriminate weapons
    "S10": ("hate",),  # hate
    "S11": ("self-harm",),  # suicide and self-harm
    "S12": ("sexual",),  # sexual content
}

_HAZARD_CODE = re.compile(r"\bS\d{1,2}\b")


def guard_verdict(answer: str, *, confidence: float = 1.0) -> dict[str, float]:
    """Per-category scores from a guard's answer ("safe", or "unsafe" then hazard codes)."""
    lines = answer.strip().splitlines()
    if not lines or lines[0].strip().lower() != "unsafe":
        return {}
    scores: dict[str, float] = {}
    for code in _HAZARD_CODE.findall(" ".join(lines[1:])):
        for category in HAZARD_CATEGORIES.get(code, ()):
            scores[category] = max(scores.get(category, 0.0), confidence)
    return scores


def combined_with_guard(scores: Scores, text: str) -> Scores:
    """`scores` raised by the guard's verdict on `text`; unchanged when no guard is configured or answers."""
    if not settings.MODERATION_GUARD_URL:
        return scores
    guard_scores = _ask_guard(text)
    if not guard_scores:
        return scores
    return Scores(with_floors(scores.categories, guard_scores), scores.injection)


# One client (and its connection pool) per configuration, made on first use.
_clients: dict[tuple[str, str, float], Any] = {}
_clients_lock = threading.Lock()


def _guard_client() -> Any:
    config = (settings.MODERATION_GUARD_URL, settings.MODERATION_GUARD_API_KEY, settings.MODERATION_GUARD_TIMEOUT_S)
    with _clients_lock:
        if config not in _clients:
            import openai

            url, api_key, timeout = config
            _clients[config] = openai.OpenAI(base_url=url, api_key=api_key or "unused", timeout=timeout, max_retries=0)
        return _clients[config]


def _ask_guard(text: str) -> dict[str, float]:
    import openai

    try:
        response = _guard_client().chat.completions.create(
            model=settings.MODERATION_GUARD_MODEL,
            messages=[{"role": "user", "content": text}],
            max_tokens=20,
            temperature=0,
            logprobs=True,
        )
    except openai.OpenAIError as exc:
        logger.warning("the guard model did not answer (%s); the built-in classifiers decide alone", exc)
        return {}
    choice = response.choices[0]
    confidence = 1.0
    if choice.logprobs is not None and choice.logprobs.content:
        confidence = math.exp(choice.logprobs.content[0].logprob)
    return guard_verdict(choice.message.content or "", confidence=confidence)
