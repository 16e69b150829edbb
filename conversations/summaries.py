"""A conversation's summaries: the memory of its oldest turns (the policy is orchestration.memory's),
asked of a utility model in the background and read into the prompts of the branch it runs through."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from accounts.services import user_sockets_tell
from chatsite.errors import ClientError
from conversations.models import ConversationSummary
from conversations.selectors import summary_for_branch
from inference.engine.tokenizers import render_chat, tokenizer_for
from inference.models import Generation, ModelDeployment
from inference.services import generation_admit, service_generation_create
from moderation.services import CONTENT_FILTER
from orchestration.memory import (
    SUMMARY_TEMPERATURE,
    Turn,
    summary_clean,
    summary_max_tokens,
    summary_request_ids,
)

logger = logging.getLogger(__name__)


def summary_extend(
    *, conversation_id: int, user_id: int, deployment: ModelDeployment, turns: Sequence[Turn], upto: int
) -> ConversationSummary | None:
    """Have the deployment's utility model extend the branch's summary with the turns that fell out
    of the window, `turns[covered:upto]` (`covered`: the turns its newest ready summary covers, 0
    with none): a generation of the service's own (`purpose` "summary", lowest priority, not charged
    to the user, dispatched like any answer: in this process in the embedded default, to a GPU
    worker through Celery in production), whose end makes the new summary ready
    (`summary_on_finish`). Its prompt is the old summary and those turns only.

    At most one summary is being written per conversation (a conditional insert): while one is, the
    next send finds the window still overflowing and asks again once it has ended. None when nothing
    was asked for (nothing new, one already being written, a full queue, a request too long for the
    utility model's window): the conversation goes on with the sliding window meanwhile."""
    keys = [t.key for t in turns[:upto]]
    previous = summary_for_branch(conversation_id=conversation_id, message_ids=[k for k in keys if k is not None])
    covered = keys.index(previous.through_id) + 1 if previous is not None else 0
    new = list(turns[covered:upto])
    if not new or new[-1].key is None:
        return None
    if ConversationSummary.objects.filter(
        conversation_id=conversation_id, status=ConversationSummary.Status.PENDING
    ).exists():
        return None
    utility = deployment
    if deployment.utility_deployment_id is not None:
        utility = (
            ModelDeployment.objects.filter(id=deployment.utility_deployment_id, is_enabled=True).first() or deployment
        )
    try:
        with transaction.atomic():
            generation_admit(deployment=utility)
            tokenizer = tokenizer_for(utility.model_path)
            max_tokens = summary_max_tokens(utility.max_context)
            prompt = summary_request_ids(
                previous=previous.text if previous is not None else "",
                turns=new,
                render=lambda messages: render_chat(tokenizer, messages),
                max_context=utility.max_context,
                max_tokens=max_tokens,
            )
            if prompt is None:
                return None
            generation = service_generation_create(
                user=get_user_model().objects.get(id=user_id),
                deployment=utility,
                prompt_token_ids=prompt,
                purpose=Generation.Purpose.SUMMARY,
                temperature=SUMMARY_TEMPERATURE,
                max_tokens=max_tokens,
            )
            return ConversationSummary.objects.create(
                conversation_id=conversation_id,
                through_id=new[-1].key,
                previous=previous,
                turns_covered=upto,
                generation=generation,
            )
    except IntegrityError:  # another send of this conversation asked for one at the same moment
        return None
    except ClientError as exc:
        logger.info("conversation %s: no summary asked for (%s)", conversation_id, exc.code)
        return None


def summary_on_finish(*, generation: Generation) -> None:
    """A summary's generation ended (inside its finish's transaction): the summary is ready when it
    ended with text that passed output moderation, else failed, and prompts go on without it."""
    text = summary_clean(generation.text)
    usable = (
        generation.status == Generation.Status.COMPLETE and generation.finish_reason != CONTENT_FILTER and bool(text)
    )
    settled = ConversationSummary.objects.filter(
        generation_id=generation.id, status=ConversationSummary.Status.PENDING
    ).update(
        status=ConversationSummary.Status.READY if usable else ConversationSummary.Status.FAILED,
        text=text if usable else "",
    )
    if settled and usable:
        summary = ConversationSummary.objects.values("conversation_id", "through_id").get(generation_id=generation.id)
        event = {
            "type": "conversation.summary",
            "conversation": summary["conversation_id"],
            "through": summary["through_id"],
            "text": text,
        }
        # The owner's open pages show the marker where it now begins, without a reload.
        transaction.on_commit(lambda: user_sockets_tell(user_id=generation.user_id, event=event), robust=True)
