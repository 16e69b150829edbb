"""Hooks inference's services onto other apps' signals; the rules live in inference.services."""

from asgiref.sync import async_to_sync
from django.dispatch import receiver

from accounts.signals import user_deactivated
from inference.models import Generation
from inference.services import user_generations_stop
from inference.streaming.streams import stream_end_announce


@receiver(user_deactivated)
def on_user_deactivated(sender, user_id, **kwargs) -> None:
    ended = user_generations_stop(user_id=user_id)
    if ended:
        async_to_sync(_announce_ended)(ended)


async def _announce_ended(ended: list[Generation]) -> None:
    """Tell the followers of answers ended before they began, as no runner will."""
    for generation in ended:
        await stream_end_announce(generation)
