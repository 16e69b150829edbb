"""Hooks inference's services onto other apps' signals; the rules live in inference.services."""

from django.dispatch import receiver

from accounts.signals import quota_tokens_reserved, user_deactivated
from inference.selectors import generation_tokens_reserved_for_user
from inference.services import user_generations_stop


@receiver(user_deactivated)
def on_user_deactivated(sender, user_id, **kwargs) -> None:
    user_generations_stop(user_id=user_id)


@receiver(quota_tokens_reserved)
def on_quota_tokens_reserved(sender, user, **kwargs) -> int:
    return generation_tokens_reserved_for_user(user=user)
