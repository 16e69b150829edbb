"""Hooks orchestration's services onto inference's signals; the rules live in services and cache."""

from django.db.models.signals import post_save
from django.dispatch import receiver

from inference.models import Generation, ModelDeployment
from inference.signals import generation_finished
from orchestration.cache import cache_clear
from orchestration.services import summary_on_finish


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    if generation.purpose == Generation.Purpose.SUMMARY:
        summary_on_finish(generation=generation)


@receiver(post_save, sender=ModelDeployment)
def on_deployment_saved(sender, instance, **kwargs) -> None:
    cache_clear(deployment_id=instance.id)
