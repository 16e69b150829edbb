"""Hooks billing's services onto other apps' signals; the rules live in billing.services."""

from django.db.models.signals import pre_delete
from django.dispatch import receiver

from accounts.models import User
from billing.services import usage_record, usage_records_outlive
from inference.signals import generation_finished


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    usage_record(generation=generation)


@receiver(pre_delete, sender=User)
def on_user_deleting(sender, instance, **kwargs) -> None:
    usage_records_outlive(user_id=instance.pk)
