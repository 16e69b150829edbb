from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.selectors import deployments_allowed_for_user
from conversations.models import Message
from conversations.selectors import (
    conversation_get_for_user,
    conversation_list_for_user,
    default_model_for_user,
    held_back_flags,
    message_list,
)
from conversations.services import ANSWER_CUT, conversation_delete, held_back_reason
from inference.dispatch import engine_state
from inference.selectors import deployment_list_enabled


@login_required
@require_GET
def chat(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    conversation = None
    messages = []
    if conversation_id is not None:
        conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
        if conversation is None:
            raise Http404("No such conversation.")
        messages = message_list(conversation=conversation)
        _notes_attach(messages)
    deployments = deployments_allowed_for_user(user=request.user, deployments=deployment_list_enabled())
    if conversation is not None:
        # The picker shows the model the conversation is on now; switching it applies from the
        # next message (`message_send`), and only to a model the plan includes.
        selected = conversation.deployment.name
        if all(d.name != selected for d in deployments):
            deployments = [conversation.deployment, *deployments]
    else:
        selected = default_model_for_user(user=request.user, allowed=deployments)
    return render(
        request,
        "conversations/chat.html",
        {
            "conversation": conversation,
            "chat_messages": messages,
            "conversations": conversation_list_for_user(user=request.user)[:100],
            "deployments": deployments,
            "default_deployment": selected,
            "engine_state": engine_state(settings.INFERENCE_DEFAULT_DEPLOYMENT),
            "answer_cut_note": ANSWER_CUT,
        },
    )


def _notes_attach(messages: list[Message]) -> None:
    """Give each flagged message the note the page shows under it: a held-back message its own
    reason, as its send gave it (with the self-harm support line where it applies), and an answer
    output moderation cut the same words the live page adds."""
    flags = held_back_flags(messages=messages)
    for message in messages:
        if message.status != Message.Status.FLAGGED:
            continue
        if message.role == Message.Role.USER:
            message.note = held_back_reason(flag=flags.get(message.id))
        else:
            message.note = ANSWER_CUT


@login_required
@require_POST
def conversation_delete_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    if conversation is None:
        raise Http404("No such conversation.")
    conversation_delete(conversation=conversation)
    return redirect("conversations:chat")
