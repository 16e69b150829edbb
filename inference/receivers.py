"""Hooks inference's services onto other apps' signals; the rules live in inference.services."""

from django.dispatch import receiver

from accounts.signals import user_deactivated
from inference.services import user_generations_stop


@receiver(user_deactivated)
def on_user_deactivated(sender, user_id, **kwargs) -> None:
    user_generations_stop(user_id=user_id)
