"""Hooks inference's services onto other apps' signals; the rules live in inference.services."""

from django.dispatch import receiver

from accounts.services import usage_record
from accounts.signals import user_deactivated
from inference.services import user_generations_stop
from inference.signals import generation_finished


@receiver(user_deactivated)
def on_user_deactivated(sender, user_id, **kwargs) -> None:
    user_generations_stop(user_id=user_id)


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    usage_record(generation=generation)
