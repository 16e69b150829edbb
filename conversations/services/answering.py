from __future__ import annotations

import logging
from dataclasses import replace
from functools import cache

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts.models import ApiKey, User
from accounts.selectors import user_instructions
from accounts.services import (
    Admission,
    RequestLimits,
    request_admit,
    request_limits,
)
from chatsite.parsers import JsonObject
from chatsite.queries import sql_now, sql_value
from conversations.citations import citations_record
from conversations.images import content_with_image_text, image_blocks_of
from conversations.models import Conversation, Message
from conversations.prompts import AssembledPrompt, Memory, Turn, assemble_prompt
from conversations.requests import is_row_id
from conversations.selectors import project_instructions_for_prompt, summary_for_branch
from conversations.summaries import summary_extend
from documents.retrieval import (
    NOTHING,
    Retrieved,
    passages_quoted,
    retrieve_for_message,
)
from inference.caching import response_cache_probe
from inference.engine.base import PromptImage
from inference.engine.tokenizers import (
    continuation_ids,
    render_chat,
    special_tokens_defused,
    tokenizer_for,
)
from inference.models import Generation, ModelDeployment
from inference.openai.tools import tool_fields_kept
from inference.services import generation_admit, generation_create
from moderation.services import (
    CONTENT_FILTER,
)

logger = logging.getLogger(__name__)
# What an answer output moderation cut says under what it had written (the chat page and its script).
ANSWER_CUT = "This answer was stopped by an automatic safety check; what it had written before that is kept."


def passages_for(*, user_id: int, conversation_id: int | None, text: str, project_id: int | None = None) -> Retrieved:
    """The passages of the user's files (the conversation's, its project's, or `project_id`'s for a
    conversation about to start in one, and the library's) that answer `text`. A search that fails
    costs the answer its passages, not the message."""
    if conversation_id is not None and not is_row_id(conversation_id):
        return NOTHING
    if project_id is not None and not is_row_id(project_id):
        return NOTHING
    try:
        return retrieve_for_message(owner_id=user_id, conversation_id=conversation_id, text=text, project_id=project_id)
    except Exception:
        logger.exception("the search of user %s's files failed; answering without them", user_id)
        return NOTHING


def citations_save(*, user_id: int, answer: Message, prompt: AssembledPrompt, retrieved: Retrieved) -> None:
    if not retrieved.empty:
        citations_record(
            owner_id=user_id,
            message_id=answer.id,
            cited=retrieved.passages[: prompt.passages_kept],
            withheld=retrieved.withheld,
        )


def answer_queue(
    *,
    user: User,
    conversation: Conversation,
    deployment: ModelDeployment,
    answer: Message,
    prompt: AssembledPrompt,
    api_key: ApiKey | None = None,
    limits: RequestLimits | None = None,
    touch_conversation: bool = True,
    held: bool = False,
    text_before: str = "",
    routing_reason: str = "",
    cacheable: str = "",
    images: list[PromptImage] | None = None,
    tool_sampling: JsonObject | None = None,
    tool_request: JsonObject | None = None,
) -> tuple[Generation, Admission]:
    """Pass the plan's gate, queue the answer's generation, and save `answer` pending. `prompt` is
    the one assembled for it. `touch_conversation`: move the conversation to the top of its owner's
    list and make the answer's branch the one shown; a conversation this transaction created has
    only this branch, and the update would be one more round trip on the way to the first token.
    `held`: its text is held until its message's verdict is in. `text_before`: the answer is
    continued, and keeps what it has; its new text goes after it. `cacheable`: the message, when the
    prompt holds nothing personal (a first message without instructions): the deployment's response
    cache may answer it (orchestration.cache). `tool_sampling`: the structured output that holds a
    tool step's calls to their tools' schemas (and forces a call the person asked for);
    `tool_request`: that step's tool fields, which its generation keeps for whoever follows it."""
    limits = limits or request_limits(user=user, deployment=deployment, api_key=api_key)
    # Refuse before anything is queued: a full queue first (so it costs no rate-limit budget), then
    # the plan's quotas and rate limits.
    generation_admit(deployment=deployment)
    admission = request_admit(
        user=user,
        api_key=api_key,
        deployment=deployment,
        prompt_tokens=len(prompt.token_ids) + len(images or ()) * deployment.image_tokens,
        max_tokens=prompt.max_tokens,
        limits=limits,
    )
    sampling = {
        # The conversation's own temperature (its settings), else the deployment's.
        "temperature": deployment.temperature if conversation.temperature is None else conversation.temperature,
        "top_p": deployment.top_p,
        "repetition_penalty": deployment.repetition_penalty,
        "max_tokens": admission.max_tokens,
        **(tool_sampling or {}),
    }
    cache = None
    if cacheable:
        cache = response_cache_probe(
            deployment=deployment,
            system_prompt=deployment.system_prompt,
            user_text=cacheable,
            sampling=sampling,
            max_tokens=admission.max_tokens,
            user_id=user.id,
        )
    generation = generation_create(
        user=user,
        deployment=deployment,
        prompt_token_ids=prompt.token_ids,
        sampling=sampling,
        priority=admission.priority,
        awaiting_verdict=held,
        tier_id=limits.tier.id,
        routing_reason=routing_reason,
        cached=cache.hit if cache is not None else None,
        images=images or (),
        tool_fields=tool_fields_kept(tool_request) if tool_request else None,
    )
    if cache is not None:
        cache.keep(generation_id=generation.id)
    answer.generation = generation
    answer.status = Message.Status.PENDING
    answer.content = text_before
    answer.text_before = text_before
    if not text_before:
        answer.token_count = 0  # a continued answer adds its new tokens to those it has
    answer.finish_reason = ""
    answer.error_code = ""
    answer.save()
    if touch_conversation:
        Conversation.objects.filter(id=conversation.id).update(updated_at=timezone.now(), active_leaf=answer)
    return generation, admission


def prompt_for(
    *,
    user_id: int,
    deployment: ModelDeployment,
    limits: RequestLimits,
    path: list[Message],
    new_turn: Turn | None = None,
    continuing: str = "",
    retrieved: Retrieved = NOTHING,
    conversation_prompt: str = "",
    project_id: int | None = None,
    tools: list[JsonObject] | None = None,
    tail: list[JsonObject] | None = None,
) -> AssembledPrompt:
    """The prompt for an answer on a branch: `path` (the branch's messages, root first, up to the
    question or to the answer the new message follows; never another branch's) and `new_turn`, not
    yet saved. `continuing`: an answer's text so far, after the assistant's cue, for the model to
    write on from. The window and the answer's budget are the plan's; flagged messages never go into
    a prompt. `retrieved`: passages of the person's files for the newest question, quoted in the
    system turn as far as the window's policy lets them (`conversations.prompts.context_budget`).
    `conversation_prompt`: the conversation's own system prompt (its settings), after the project's
    instructions. `project_id`: the conversation's project, whose instructions follow the person's own.
    `tools`: the tools the answer is offered (OpenAI's shape), which the chat template renders; `tail`:
    the answer's tool steps so far, after the newest turn (orchestration.tools.loop)."""
    tokenizer = tokenizer_for(deployment.model_path)
    turns = _turns_of(path)
    if any(m.image_count for m in path):
        # Earlier messages' images go as the text OCR read in them, whatever the model: only the
        # message being answered shows a vision model its images.
        blocks = image_blocks_of(message_ids=[m.id for m in path if m.image_count])
        turns = [
            replace(t, content=content_with_image_text(t.content, blocks[t.key])) if t.key in blocks else t
            for t in turns
        ]
    if new_turn is not None:
        turns.append(new_turn)
    continued = continuation_ids(tokenizer, continuing) if continuing else []
    quoted = passages_quoted(retrieved.passages)
    return assemble_prompt(
        system_prompt=deployment.system_prompt,
        instructions=user_instructions(user_id=user_id),
        conversation_prompt=conversation_prompt,
        project_instructions=project_instructions_for_prompt(project_id=project_id),
        turns=turns,
        render=lambda messages: (
            render_chat(tokenizer, messages, tools=tools, chat_template=deployment.chat_template) + continued
        ),
        max_context=limits.max_context,
        max_output=limits.max_output,
        min_output=settings.INFERENCE_MIN_OUTPUT_TOKENS,
        # Quoted in the system turn, which the template does not defuse: a file's special-token
        # spellings are broken here, so that no passage can close the turn.
        context=[special_tokens_defused(tokenizer, p) for p in quoted.passages],
        context_header=quoted.header,
        memory=_memory_of(path, turns, max_context=limits.max_context),
        tail=tail if tail is not None else _loop_tail(path),
    )


def tool_step_turn(message: Message) -> JsonObject:
    """A step of an answer's tool loop as its chat template takes it."""
    if message.role == Message.Role.TOOL:
        return {"role": "tool", "content": message.content, "tool_call_id": message.tool_call_id}
    return {"role": "assistant", "content": message.content, "tool_calls": message.tool_calls}


def _loop_tail(path: list[Message]) -> list[JsonObject]:
    """The tool loop an answer after `path` follows (a regenerated or continued answer to a loop's
    last result): the steps after the person's message, so it is written from their results."""
    if not path or path[-1].role != Message.Role.TOOL:
        return []
    start = len(path)
    while start > 0 and (
        path[start - 1].role == Message.Role.TOOL
        or (path[start - 1].role == Message.Role.ASSISTANT and path[start - 1].tool_calls)
    ):
        start -= 1
    return [tool_step_turn(m) for m in path[start:]]


def _turns_of(path: list[Message]) -> list[Turn]:
    return [
        Turn(role=m.role, content=m.content, token_count=m.token_count, key=m.id)
        for m in path
        if m.role in (Message.Role.USER, Message.Role.ASSISTANT)
        and m.status != Message.Status.FLAGGED
        # An answer's tool steps are its own; later turns see the answer they led to.
        and not m.tool_calls
        and not (m.role == Message.Role.ASSISTANT and not m.content)
    ]


def _memory_of(path: list[Message], turns: list[Turn], *, max_context: int) -> Memory | None:
    """The branch's summary (orchestration.memory), looked up only when its turns cannot all fit."""
    if not settings.CHAT_SUMMARIES or not path or sum(t.token_count + 8 for t in turns) <= max_context // 2:
        return None
    keys = [t.key for t in turns]
    summary = summary_for_branch(conversation_id=path[0].conversation_id, message_ids=[k for k in keys if k])
    if summary is None or summary.through_id not in keys:
        return None
    return Memory(text=summary.text, covers=keys.index(summary.through_id) + 1)


def memory_extend_after_commit(*, user_id: int, deployment: ModelDeployment, path: list[Message], upto: int) -> None:
    """Once the send commits (after its answer is dispatched), have the turns that fell out of the
    window summarized in the background (conversations.summaries.summary_extend); whatever becomes
    of that, the message is answered."""
    if not settings.CHAT_SUMMARIES or not path:
        return
    turns, conversation_id = _turns_of(path), path[0].conversation_id
    transaction.on_commit(
        lambda: summary_extend(
            conversation_id=conversation_id, user_id=user_id, deployment=deployment, turns=turns, upto=upto
        ),
        robust=True,
    )


_STATUS_FROM_GENERATION = {
    Generation.Status.COMPLETE: Message.Status.COMPLETE,
    Generation.Status.STOPPED: Message.Status.STOPPED,
    Generation.Status.FAILED: Message.Status.FAILED,
}


def message_mark_streaming(*, generation: Generation) -> None:
    """Show a generation's pending answer as streaming (inference's `generation_started`)."""
    key = sql_value(Message, "generation", generation.id)
    with connection.cursor() as cursor:
        cursor.execute(_mark_streaming_sql(), (sql_now(), key, Message.Status.PENDING.value))


def message_finish_from_generation(*, generation: Generation) -> None:
    """Copy a finished generation's outcome onto its assistant message (partial text included).

    An answer cut by output moderation ends `stopped` with finish_reason `content_filter`; its
    message is marked flagged and keeps only the text that passed moderation.

    This and `message_mark_streaming` are written as SQL: every answer runs both on the worker, and
    the ORM spent more CPU compiling them than PostgreSQL spent answering (docs/performance-relay.md).
    """
    status = _STATUS_FROM_GENERATION[Generation.Status(generation.status)]
    if generation.finish_reason == CONTENT_FILTER:
        status = Message.Status.FLAGGED
    params = (
        generation.text,
        status.value,
        generation.completion_tokens,
        generation.finish_reason,
        generation.error_code,
        sql_now(),
        sql_value(Message, "generation", generation.id),
    )
    with connection.cursor() as cursor:
        cursor.execute(_finish_sql(), params)


@cache  # read once the models are all loaded
def _mark_streaming_sql() -> str:
    return (
        f'UPDATE "{Message._meta.db_table}" SET "status" = \'{Message.Status.STREAMING.value}\', "updated_at" = %s '
        'WHERE "generation_id" = %s AND "status" = %s'
    )


@cache
def _finish_sql() -> str:
    # A continued answer's text goes after what it had (`text_before`, empty for any other answer).
    return (
        f'UPDATE "{Message._meta.db_table}" SET "content" = "text_before" || %s, "status" = %s, '
        '"token_count" = "token_count" + %s, "finish_reason" = %s, "error_code" = %s, "updated_at" = %s '
        'WHERE "generation_id" = %s'
    )
