from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.selectors import deployments_allowed_for_user
from conversations.branches import Tree
from conversations.models import Message
from conversations.selectors import (
    conversation_get_for_user,
    conversation_list_for_user,
    feedback_for_user,
    held_back_flags,
    message_branch,
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
        # The branch shown last (conversations.branches); the page switches branches by choosing one
        # (POST .../branch/) and loading again.
        branch = message_branch(conversation=conversation)
        messages = branch.messages
        _notes_attach(messages)
        _details_attach(messages, tree=branch.tree, user=request.user)
    return render(
        request,
        "conversations/chat.html",
        {
            "conversation": conversation,
            "chat_messages": messages,
            "conversations": conversation_list_for_user(user=request.user)[:100],
            "deployments": deployments_allowed_for_user(user=request.user, deployments=deployment_list_enabled()),
            "default_deployment": settings.INFERENCE_DEFAULT_DEPLOYMENT,
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


def _details_attach(messages: list[Message], *, tree: Tree, user) -> None:
    """What the page's branch navigation, Regenerate, feedback and hover need of each message: its
    siblings, the newest answer's generation beside an answer (a regenerate's `replaces`), the
    user's rating, and its size and time."""
    feedback = feedback_for_user(user=user, messages=messages)
    for message in messages:
        message.siblings_list = ",".join(map(str, message.siblings))
        newest = tree.by_id[message.siblings[-1]]
        message.newest_generation = newest.generation_id or ""
        message.rating = feedback[message.id].rating if message.id in feedback else ""
        message.stats = _stats(message)


def _stats(message: Message) -> str:
    stats = f"{message.token_count} tokens"
    generation = message.generation
    if generation is not None and generation.started_at and generation.finished_at:
        stats += f" · {(generation.finished_at - generation.started_at).total_seconds():.1f} s"
    return stats


@login_required
@require_POST
def conversation_delete_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    if conversation is None:
        raise Http404("No such conversation.")
    conversation_delete(conversation=conversation)
    return redirect("conversations:chat")
