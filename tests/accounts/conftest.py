from __future__ import annotations

from typing import Any

import pytest

from accounts.models import Tier
from accounts.services import user_set_tier
from inference.models import Generation
from inference.services import generation_claim, generation_finish


@pytest.fixture
def put_on_tier():
    def put(user: Any, name: str) -> Tier:
        tier = Tier.objects.get(name=name)
        user_set_tier(user=user, tier=tier)
        return tier

    return put


def run_to_end(
    generation: Generation, *, status: str = "complete", completion_tokens: int = 10, prompt_tokens: int | None = None
) -> Generation:
    """What a worker does with a generation: claim it, then report the engine's counts."""
    assert generation_claim(generation_id=generation.id, worker="test") is not None
    finished = generation_finish(
        generation_id=generation.id,
        status=status,
        text="answer",
        finish_reason="stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )
    assert finished is not None
    return finished
