"""Charges every finished generation to the ledger; the rules live in accounts.services.usage_record."""

from django.dispatch import receiver

from accounts.services import usage_record
from inference.signals import generation_finished


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    usage_record(generation=generation)
