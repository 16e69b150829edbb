from __future__ import annotations

import pytest

from accounts.models import Tier
from moderation.models import ModerationPolicy, PolicyRule


@pytest.fixture
def make_policy(db):
    """A global (or tier) policy with exactly the given rules: {category: (threshold, action)}."""

    made = []

    def make(rules: dict[str, tuple[float, str]], *, tier_name: str = "", name: str | None = None, **fields):
        tier = Tier.objects.get(name=tier_name) if tier_name else None
        ModerationPolicy.objects.filter(tier=tier, is_active=True).update(is_active=False)
        policy = ModerationPolicy.objects.create(name=name or f"policy {len(made) + 1}", tier=tier, **fields)
        PolicyRule.objects.bulk_create(
            PolicyRule(policy=policy, category=category, threshold=threshold, action=action)
            for category, (threshold, action) in rules.items()
        )
        made.append(policy)
        return policy

    return make
