"""An answer's tool loop in the conversation tree: each step's calls, each call's result, and the next
step queued. The rules (what is offered, how a call is checked, run and screened, the limits) are
orchestration's (orchestration.tools.loop); the chat socket drives the steps (conversations.tool_loops).

A loop's messages hang in one branch: the user's message, the answer's first step (an assistant
message whose `tool_calls` say what it called), one tool message per call, the next step, and so on
to the answer in words. Later prompts see only that last answer (`answering._turns_of`); each step's
prompt sees the whole loop so far after the user's message (`prompt_for`'s `tail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import User
from accounts.services import request_limits
from billing.services import tool_usage_record
from chatsite.errors import ClientError
from conversations.citations import citations_record
from conversations.models import Conversation, Message
from conversations.prompts import Turn
from conversations.selectors import (
    conversation_get_for_send,
    conversation_has_message_in_progress,
    message_tree_for_prompt,
)
from conversations.services.answering import answer_queue, passages_for, prompt_for, tool_step_turn
from documents.retrieval import Passage
from inference.models import Generation
from inference.openai.tools import tool_sampling, tools_in_prompt
from orchestration.tools.loop import CallResult, LoopLimits, ToolCall, ToolPlan


@dataclass(frozen=True)
class StepQueued:
    answer: Message
    generation: Generation


def tool_calls_record(*, user: User, answer_id: int, calls: list[ToolCall], content: str) -> None:
    """A step's answer that called tools: its words before the calls, and the calls."""
    Message.objects.filter(id=answer_id, conversation__user=user, role=Message.Role.ASSISTANT).update(
        content=content,
        tool_calls=[c.as_openai() for c in calls],
        finish_reason="tool_calls",
        updated_at=timezone.now(),
    )


def tool_result_save(*, user: User, conversation_id: int, parent_id: int, result: CallResult) -> Message:
    """A call's result as a tool message after `parent_id`, its cost on the ledger, and the passages
    of the person's files it quoted as its citations."""
    conversation = Conversation.objects.get(id=conversation_id, user=user)
    shown = {
        "outcome": result.outcome.value,
        "output": result.shown,
        "truncated": result.truncated,
        "arguments": result.call.arguments,
        "seconds": round(result.seconds, 3),
        "details": {k: v for k, v in result.details.items() if k in ("url", "title", "query", "results")},
    }
    with transaction.atomic():
        message = Message.objects.create(
            conversation=conversation,
            role=Message.Role.TOOL,
            parent_id=parent_id,
            content=result.for_model,
            tool_call_id=result.call.id,
            tool_name=result.call.name,
            tool_shown=shown,
            finish_reason=result.outcome.value,
        )
        if result.cost > Decimal(0):
            tool_usage_record(user_id=user.id, cost=result.cost)
        cited = result.details.get("citations") if result.outcome.value == "ok" else None
        if cited:
            passages = [
                Passage(c["document_id"], c["file_name"], c.get("page"), c.get("heading") or "", c.get("passage") or "")
                for c in cited
            ]
            citations_record(owner_id=user.id, message_id=message.id, cited=passages, withheld=[])
        Conversation.objects.filter(id=conversation.id).update(active_leaf=message, updated_at=timezone.now())
    return message


def tool_allowed_for_chat(*, user: User, conversation_id: int, tool: str) -> None:
    """The person allowed `tool` for the rest of this chat: it is not asked about again."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().filter(id=conversation_id, user=user).first()
        if conversation is not None and tool not in conversation.tools_allowed:
            conversation.tools_allowed = [*conversation.tools_allowed, tool]
            conversation.save(update_fields=["tools_allowed"])


def tools_allowed_for_chat(*, user: User, conversation_id: int) -> list[str]:
    found = Conversation.objects.filter(id=conversation_id, user=user).values_list("tools_allowed", flat=True).first()
    return list(found or [])


@transaction.atomic
def tool_step_queue(
    *,
    user: User,
    conversation_id: int,
    user_message_id: int,
    parent_id: int,
    plan: ToolPlan,
    step: int,
    tools_left: bool,
) -> StepQueued:
    """Queue step `step` of the answer to `user_message_id`: a new answer after `parent_id` (the last
    tool message), its prompt the conversation up to the user's message, then the loop so far.
    `tools_left`: the answer may still call tools (else, as on its last permitted step, none are offered)."""
    conversation = conversation_get_for_send(user=user, conversation_id=conversation_id)
    if conversation is None:
        raise ClientError("That conversation does not exist.", code="not_found", status=404)
    if conversation_has_message_in_progress(conversation=conversation):  # a message sent meanwhile
        raise ClientError(
            "Another answer is being written in this conversation; this one stops here.",
            code="generation_in_progress",
            status=409,
        )
    tree = message_tree_for_prompt(conversation=conversation)
    user_message = tree.by_id[user_message_id]
    loop = [m for m in tree.path_to(parent_id) if m.id > user_message.id]
    tail = [tool_step_turn(m) for m in loop]
    deployment = conversation.deployment
    limits = request_limits(user=user, deployment=deployment)
    limits_of_loop = LoopLimits.from_settings()
    request = plan.request(
        model=deployment.name, step=step if tools_left else limits_of_loop.max_steps, limits=limits_of_loop
    )
    prompt = prompt_for(
        user_id=user.id,
        deployment=deployment,
        limits=limits,
        path=tree.path_to(user_message.parent_id),
        new_turn=Turn(role=Message.Role.USER, content=user_message.content, token_count=user_message.token_count),
        retrieved=passages_for(
            user_id=user.id,
            conversation_id=conversation.id,
            text=user_message.content,
            project_id=conversation.project_id,
        ),
        conversation_prompt=conversation.system_prompt,
        project_id=conversation.project_id,
        tools=tools_in_prompt(request),
        tail=tail,
    )
    answer = Message(conversation=conversation, role=Message.Role.ASSISTANT, parent_id=parent_id)
    generation, _ = answer_queue(
        user=user,
        conversation=conversation,
        deployment=deployment,
        answer=answer,
        limits=limits,
        prompt=prompt,
        routing_reason="tool step",
        tool_sampling=tool_sampling(request, deployment=deployment),
        tool_request=request,
    )
    return StepQueued(answer, generation)


def tool_loop_stopped(*, user: User, answer_id: int) -> None:
    """An answer stopped between its steps: the step on screen is marked stopped."""
    Message.objects.filter(
        Q(role=Message.Role.ASSISTANT) | Q(role=Message.Role.TOOL), id=answer_id, conversation__user=user
    ).update(status=Message.Status.STOPPED, updated_at=timezone.now())
