from __future__ import annotations

import logging
from functools import cache

from django.conf import settings
from django.db import connection, transaction

from accounts.services import (
    user_sockets_tell,
)
from chatsite.queries import sql_value
from conversations.models import Conversation, Message
from conversations.titles import (
    TITLE_MAX_TOKENS,
    TITLE_STRUCTURED_OUTPUTS,
    TITLE_TEMPERATURE,
    title_from_message,
    title_from_model,
    title_prompt_messages,
)
from inference.engine.tokenizers import (
    render_chat,
    tokenizer_for,
)
from inference.models import Generation
from inference.services import generation_admit, service_generation_create

logger = logging.getLogger(__name__)


def conversation_title_on_finish(*, generation: Generation) -> None:
    """What an ended generation means for its conversation's title (inference's `generation_finished`,
    inside the finish's transaction).

    A title's own generation: its text, cleaned, becomes the title (`_title_apply`). An answer that
    ended with text in a conversation still untitled, and with no title asked for yet: the title is
    asked for once this transaction commits (`conversation_title_request`), or with
    CHAT_TITLES_FROM_MODEL off, its first words set then. Only this answer's conversation is read, in
    one statement that finds nothing for a titled one, on the way to the answer's `done`; the request
    itself is made after the commit."""
    if generation.purpose == Generation.Purpose.TITLE:
        _title_apply(generation=generation)
        return
    if generation.status == Generation.Status.FAILED or not generation.text.strip():
        return
    with connection.cursor() as cursor:
        cursor.execute(_untitled_answer_sql(), (sql_value(Message, "generation", generation.id),))
        found = cursor.fetchone()
    if found is None:
        return
    answer_id, conversation_id, user_id = found
    if settings.CHAT_TITLES_FROM_MODEL:
        transaction.on_commit(
            lambda: conversation_title_request(conversation_id=conversation_id, answer_id=answer_id), robust=True
        )
    else:
        # The first words, with nothing else to read: what conversation_title_request would do, without
        # reading the answer, its question, the conversation, its model and its owner first.
        transaction.on_commit(lambda: _title_fallback(conversation_id=conversation_id, user_id=user_id), robust=True)


@cache  # read once the models are all loaded
def _untitled_answer_sql() -> str:
    """The answer written by the generation %s, its conversation and that conversation's owner, when
    the answer follows a message and its conversation has no title and none asked for. Written as
    SQL: it runs inside every answer's end, and the ORM spent more CPU compiling it than PostgreSQL
    spent answering (docs/performance-relay.md)."""
    message, conversation = Message._meta.db_table, Conversation._meta.db_table
    return (
        f'SELECT m."id", m."conversation_id", c."user_id" FROM "{message}" m '
        f'INNER JOIN "{conversation}" c ON c."id" = m."conversation_id" '
        f'WHERE m."generation_id" = %s AND m."role" = \'{Message.Role.ASSISTANT.value}\' '
        f'AND m."parent_id" IS NOT NULL AND c."title" = \'\' AND c."title_generation_id" IS NULL LIMIT 1'
    )


def conversation_title_request(*, conversation_id: int, answer_id: int) -> None:
    """Ask the conversation's model for a title from the exchange that `answer_id` ended, as a short
    generation of the service's own (`Generation.Purpose.TITLE`: lowest priority, not charged,
    dispatched like any answer: in this process in the embedded default, to a GPU worker through
    Celery in the production topology). At most once per conversation: the claim is a conditional
    update of the untitled conversation. With CHAT_TITLES_FROM_MODEL off, or when the request cannot
    be queued (a full queue), the title is the message's first words at once."""
    answer = (
        Message.objects.select_related("parent", "conversation__deployment", "conversation__user")
        .filter(id=answer_id, conversation_id=conversation_id)
        .first()
    )
    if answer is None or answer.parent is None:
        return
    conversation = answer.conversation
    if not settings.CHAT_TITLES_FROM_MODEL:
        _title_fallback(conversation_id=conversation.id, user_id=conversation.user_id)
        return
    deployment = conversation.deployment
    try:
        with transaction.atomic():
            generation_admit(deployment=deployment)
            tokenizer = tokenizer_for(deployment.model_path)
            prompt = render_chat(
                tokenizer,
                title_prompt_messages(user_text=answer.parent.content, answer_text=answer.content),
                chat_template=deployment.chat_template,
            )
            generation = service_generation_create(
                user=conversation.user,
                deployment=deployment,
                prompt_token_ids=prompt,
                purpose=Generation.Purpose.TITLE,
                temperature=TITLE_TEMPERATURE,
                max_tokens=TITLE_MAX_TOKENS,
                structured_outputs=TITLE_STRUCTURED_OUTPUTS,
            )
            claimed = Conversation.objects.filter(id=conversation.id, title="", title_generation__isnull=True).update(
                title_generation=generation
            )
            if not claimed:  # titled meanwhile, or asked for by another answer's end
                transaction.set_rollback(True)
    except Exception:
        logger.warning("conversation %s: the title could not be asked for", conversation.id, exc_info=True)
        _title_fallback(conversation_id=conversation.id, user_id=conversation.user_id)


def _title_apply(*, generation: Generation) -> None:
    """Make a finished title generation's text the title of the conversation that asked for it,
    unless its owner has named it meanwhile. Nothing usable (a failure, a stop, output moderation's
    cut, a reply cut at its length, no plausible title: `title_from_model`): the first message's first
    words instead."""
    row = Conversation.objects.filter(title_generation_id=generation.id).values_list("id", "user_id").first()
    if row is None:
        return
    conversation_id, user_id = row
    usable = generation.status == Generation.Status.COMPLETE and generation.finish_reason == "stop"
    title = ""
    if usable:
        # The answers it might echo: a conversation being titled has one or a few.
        answers = Message.objects.filter(conversation_id=conversation_id, role=Message.Role.ASSISTANT).values_list(
            "content", flat=True
        )[:4]
        title = title_from_model(generation.text, answers=answers)
    if not title:
        _title_fallback(conversation_id=conversation_id, user_id=user_id)
        return
    _title_set_if_untitled(conversation_id=conversation_id, user_id=user_id, title=title)


def _title_fallback(*, conversation_id: int, user_id: int) -> None:
    """The title from the first words of the conversation's first message that moderation let through."""
    first = (
        Message.objects.filter(conversation_id=conversation_id, role=Message.Role.USER)
        .exclude(status=Message.Status.FLAGGED)
        .order_by("created_at", "id")
        .values_list("content", flat=True)
        .first()
    )
    if first:
        _title_set_if_untitled(conversation_id=conversation_id, user_id=user_id, title=title_from_message(first))


def _title_set_if_untitled(*, conversation_id: int, user_id: int, title: str) -> None:
    # update(): a title arriving is no activity, and the conversation keeps its place in the list.
    if Conversation.objects.filter(id=conversation_id, title="").update(title=title):
        title_announce(user_id=user_id, conversation_id=conversation_id, title=title)


def title_announce(*, user_id: int, conversation_id: int, title: str) -> None:
    """Once the caller's transaction commits, tell the owner's open pages (every socket of theirs,
    in whichever process) the conversation's title: the header, the list and the tab follow."""
    event = {"type": "conversation.title", "conversation": conversation_id, "title": title}
    transaction.on_commit(lambda: user_sockets_tell(user_id=user_id, event=event), robust=True)
