from __future__ import annotations

import logging
from collections.abc import Callable

from accounts.models import User
from accounts.services import (
    action_admit,
    request_limits,
)
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.selectors import (
    default_model_for_user,
    message_tree_for_prompt,
)
from conversations.services.titles import title_announce
from inference.engine.tokenizers import (
    count_tokens,
    tokenizer_for,
)
from inference.models import ModelDeployment
from inference.selectors import Routed, deployment_get
from inference.services import generation_request_stop
from orchestration.routing import route

logger = logging.getLogger(__name__)


def conversation_create(
    *,
    user: User,
    deployment: ModelDeployment | None = None,
    title: str = "",
    model_name: str = "",
    project_id: int | None = None,
) -> Conversation:
    """A new conversation; `project_id`, one of the user's own projects (the caller has checked)."""
    return Conversation.objects.create(
        user=user,
        deployment=deployment or deployment_get(),
        title=title[:200],
        model_name=model_name,
        project_id=project_id,
    )


def conversation_start(*, user: User, title: str = "", model: str | None = None) -> Conversation:
    """An empty conversation on `model` (or the default), refused if the user's plan excludes the
    model or if the user has started the plan's conversations for the hour (429 rate_limited)."""
    asked = model or default_model_for_user(user=user)
    deployment = route(user=user, model=asked).deployment
    request_limits(user=user, deployment=deployment)  # the plan's gate: refuses a model it excludes
    action_admit(user=user, action="conversation")
    return conversation_create(
        user=user, deployment=deployment, title=title.strip(), model_name=model_name_stored(asked, deployment)
    )


def model_name_stored(asked: str, deployment: ModelDeployment) -> str:
    """What a conversation stores of the model it was asked for: only a name its deployment does not
    serve (`auto`); otherwise it follows its deployment's public name."""
    return "" if asked == deployment.public_model else asked


def conversation_route(
    *,
    user: User,
    conversation: Conversation,
    model: str | None,
    prompt_tokens: Callable[[ModelDeployment], int] | None = None,
) -> Routed:
    """The deployment a conversation's next answer goes to (orchestration.routing): the one it is on,
    unless that is drained or gone or cannot take it, or `model` names another model (a switch, from
    this message on). A move is saved on the conversation, inside the caller's transaction."""
    current = conversation.model
    asked = model or current
    sticky = conversation.deployment if asked == current else None
    routed = route(user=user, model=asked, sticky=sticky, prompt_tokens=prompt_tokens)
    name = model_name_stored(asked, routed.deployment)
    if routed.deployment.id != conversation.deployment_id or name != conversation.model_name:
        conversation.deployment, conversation.model_name = routed.deployment, name
        Conversation.objects.filter(id=conversation.id).update(deployment=routed.deployment, model_name=name)
    return routed


def prompt_measure(*, path: list[Message], content: str) -> Callable[[ModelDeployment], int]:
    """A send's prompt size on a deployment, for the `auto` model's rule: the branch's turns as they
    were counted when saved, and the new message and the system prompt in that deployment's tokenizer
    (the template's own few tokens aside)."""
    history = sum(m.token_count for m in path if m.status != Message.Status.FLAGGED)

    def measure(deployment: ModelDeployment) -> int:
        tokenizer = tokenizer_for(deployment.model_path)
        return history + count_tokens(tokenizer, content) + count_tokens(tokenizer, deployment.system_prompt)

    return measure


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    """Name the conversation; its owner's open pages show the new name (`conversation.title`). A
    title the model is still writing will not replace it: it is applied only to an untitled one."""
    title = " ".join(title.split()) if isinstance(title, str) else ""
    if not title or len(title) > 200:
        raise ClientError("A title must be 1 to 200 characters long.", code="invalid_title", param="title")
    conversation.title = title
    conversation.save(update_fields=["title", "updated_at"])
    title_announce(user_id=conversation.user_id, conversation_id=conversation.id, title=title)
    return conversation


def conversation_pin(*, conversation: Conversation, pinned: bool) -> Conversation:
    """Pin the conversation above the others in its owner's list (or unpin it). Its place among
    the rest does not change: `updated_at` is left as it was."""
    Conversation.objects.filter(id=conversation.id).update(pinned=pinned)
    conversation.pinned = pinned
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    for message in conversation.messages.filter(status__in=Message.IN_PROGRESS).select_related("generation"):
        if message.generation is not None:
            generation_request_stop(generation=message.generation)
    conversation.delete()


def conversation_branch_select(*, conversation: Conversation, message_id: int) -> int:
    """Show the branch through `message_id` (its newest leaf) from now on, on every page and for a
    send that names no parent. Returns the leaf's id; a message not in the conversation is a 400."""
    tree = message_tree_for_prompt(conversation=conversation)
    if message_id not in tree.by_id:
        raise ClientError("That message is not in this conversation.", code="invalid_message", param="message")
    leaf = tree.newest_leaf_under(message_id) or message_id  # a message's own subtree always has a leaf
    Conversation.objects.filter(id=conversation.id).update(active_leaf_id=leaf)
    conversation.active_leaf_id = leaf
    return leaf
