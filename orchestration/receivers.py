"""Hooks orchestration's cache onto inference's signals; the rules live in orchestration.cache."""

from django.db.models.signals import post_save
from django.dispatch import receiver

from inference.models import ModelDeployment
from orchestration.cache import cache_clear


@receiver(post_save, sender=ModelDeployment)
def on_deployment_saved(sender, instance, **kwargs) -> None:
    cache_clear(deployment_id=instance.id)
