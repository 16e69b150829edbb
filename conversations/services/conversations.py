from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from accounts.selectors import conversation_settings_limits
from accounts.services import (
    action_admit,
    request_limits,
)
from chatsite.errors import ClientError
from conversations.models import Conversation, Message
from conversations.requests import ConversationSettingsRequest, is_row_id
from conversations.selectors import (
    conversation_get_for_user,
    conversation_list_for_user,
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
    switch: bool = True,
) -> Routed:
    """The deployment a conversation's next answer goes to (orchestration.routing): the one it is on,
    unless that is drained or gone or cannot take it, or `model` names another model (a switch, from
    this message on). A move is saved on the conversation, inside the caller's transaction, unless
    `switch` is False (one answer by another model: a regenerate's)."""
    current = conversation.model
    asked = model or current
    sticky = conversation.deployment if asked == current else None
    routed = route(user=user, model=asked, sticky=sticky, prompt_tokens=prompt_tokens)
    name = model_name_stored(asked, routed.deployment)
    if switch and (routed.deployment.id != conversation.deployment_id or name != conversation.model_name):
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


def conversation_settings_update(*, conversation: Conversation, request: ConversationSettingsRequest) -> Conversation:
    """Give the conversation its own system prompt and temperature, within its owner's plan (the
    prompt's length is the plan's, the temperature's range every plan's: `Tier`). Out of bounds:
    a 400 that says the bound, and nothing is saved. Both apply from the next answer on."""
    limits = conversation_settings_limits(user=conversation.user)
    if len(request.system_prompt) > limits.system_prompt_chars:
        raise ClientError(
            f"A conversation's system prompt can be at most {limits.system_prompt_chars} characters long on "
            f"your plan ({limits.plan}); this one has {len(request.system_prompt)}.",
            code="system_prompt_too_long",
            param="system_prompt",
        )
    temperature = request.temperature
    if temperature is not None and not limits.temperature_min <= temperature <= limits.temperature_max:
        raise ClientError(
            f"The temperature must be between {limits.temperature_min:g} and {limits.temperature_max:g}.",
            code="invalid_temperature",
            param="temperature",
        )
    conversation.system_prompt, conversation.temperature = request.system_prompt, temperature
    # update(): a change of settings is no activity, and the conversation keeps its place in the list.
    Conversation.objects.filter(id=conversation.id).update(system_prompt=request.system_prompt, temperature=temperature)
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


def conversation_archive(*, user: User, conversation_id: int) -> Conversation:
    """Archive one of the user's conversations: out of their list and its search, into the Archived
    view. It still opens, and a message sent in it leaves it archived. Archiving it again keeps the
    first time; its place in time (`updated_at`) does not change. Another user's is a 404."""
    conversation = _own(user=user, conversation_id=conversation_id)
    if conversation.archived_at is None:
        conversation.archived_at = timezone.now()
        Conversation.objects.filter(id=conversation.id).update(archived_at=conversation.archived_at)
    return conversation


def conversation_unarchive(*, user: User, conversation_id: int) -> Conversation:
    """Put an archived conversation of the user's back in their list, where its time puts it."""
    conversation = _own(user=user, conversation_id=conversation_id)
    if conversation.archived_at is not None:
        conversation.archived_at = None
        Conversation.objects.filter(id=conversation.id).update(archived_at=None)
    return conversation


def conversation_archive_many(*, user: User, conversation_ids: Collection[int]) -> list[int]:
    """Archive several of the user's conversations at once, all or none (`_own_many`). Returns their ids."""
    with transaction.atomic():
        conversations = _own_many(user=user, conversation_ids=conversation_ids)
        ids = [c.id for c in conversations if c.archived_at is None]
        Conversation.objects.filter(id__in=ids).update(archived_at=timezone.now())
    return [c.id for c in conversations]


def conversation_delete_many(*, user: User, conversation_ids: Collection[int]) -> list[int]:
    """Delete several of the user's conversations at once, in one transaction, all or none
    (`_own_many`), each as `conversation_delete` deletes one. Returns their ids."""
    with transaction.atomic():
        conversations = _own_many(user=user, conversation_ids=conversation_ids)
        ids = [c.id for c in conversations]
        for conversation in conversations:
            conversation_delete(conversation=conversation)
    return ids


def _own(*, user: User, conversation_id: int) -> Conversation:
    conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
    if conversation is None:
        raise ClientError("That conversation does not exist.", code="not_found", status=404)
    return conversation


def _own_many(*, user: User, conversation_ids: Collection[int]) -> list[Conversation]:
    """The user's conversations of these ids, locked until the transaction ends. One that is not
    theirs, or does not exist, refuses the whole batch with a 404 that does not say which: a
    request must not learn whether someone else's id exists. At least one id, and only ids."""
    wanted = set(conversation_ids)
    if not wanted or not all(is_row_id(i) for i in wanted):
        raise ClientError("Name one or more conversations by id.", code="invalid_request", param="ids")
    conversations = list(
        conversation_list_for_user(user=user).select_for_update(of=("self",)).filter(id__in=wanted).order_by("id")
    )
    if len(conversations) != len(wanted):
        raise ClientError("Some of those conversations do not exist.", code="not_found", status=404, param="ids")
    return conversations


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
