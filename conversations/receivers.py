"""Keeps assistant messages in step with their generations; the rules live in services."""

from django.dispatch import receiver

from conversations.services import (
    conversation_title_on_finish,
    message_finish_from_generation,
    message_mark_streaming,
)
from inference.signals import generation_finished, generation_started


@receiver(generation_started)
def on_generation_started(sender, generation, **kwargs) -> None:
    message_mark_streaming(generation=generation)


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    message_finish_from_generation(generation=generation)
    conversation_title_on_finish(generation=generation)
