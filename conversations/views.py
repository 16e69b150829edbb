from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.selectors import deployments_allowed_for_user
from conversations.selectors import conversation_get_for_user, conversation_list_for_user, message_list
from conversations.services import conversation_delete
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
        },
    )


@login_required
@require_POST
def conversation_delete_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = conversation_get_for_user(user=request.user, conversation_id=conversation_id)
    if conversation is None:
        raise Http404("No such conversation.")
    conversation_delete(conversation=conversation)
    return redirect("conversations:chat")
