"""Hooks billing's services onto other apps' signals; the rules live in billing.services."""

from django.dispatch import receiver

from billing.services import usage_record
from inference.signals import generation_finished


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    usage_record(generation=generation)
