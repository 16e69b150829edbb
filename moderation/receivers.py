"""Keeps the cached policies in step with their rows; the cache lives in selectors."""

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from moderation.models import ModerationPolicy, PolicyRule
from moderation.selectors import policy_cache_invalidate


@receiver([post_save, post_delete], sender=ModerationPolicy)
@receiver([post_save, post_delete], sender=PolicyRule)
def on_policy_changed(sender, **kwargs) -> None:
    # At once, for this transaction's own later reads; and again once the change is committed, in
    # case another process cached the old rows in between.
    policy_cache_invalidate()
    transaction.on_commit(policy_cache_invalidate)
