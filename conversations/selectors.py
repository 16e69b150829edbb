from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from django.conf import settings
from django.db import connection
from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from accounts.models import User
from accounts.selectors import deployments_allowed_for_user, user_settings_get
from chatsite.parsers import JsonObject
from conversations.branches import Tree
from conversations.models import (
    Conversation,
    ConversationSummary,
    FlaggedMessage,
    Message,
    MessageFeedback,
    Project,
    SavedPrompt,
    SharedConversation,
)
from conversations.prompts import project_block
from conversations.requests import is_row_id
from inference.models import ModelDeployment
from inference.selectors import deployment_list_enabled, models_listed, queue_length_annotation
from moderation.models import Flag


def conversation_list_for_user(*, user: User, archived: bool | None = None) -> QuerySet[Conversation]:
    """The user's conversations: all of them, or with `archived`, only those archived (True) or
    only those in their list (False)."""
    conversations = Conversation.objects.filter(user=user).select_related("deployment", "project")
    if archived is not None:
        conversations = conversations.filter(archived_at__isnull=not archived)
    return conversations


def saved_prompts_for_user(*, user: User) -> QuerySet[SavedPrompt]:
    """The user's prompt library, by command."""
    return SavedPrompt.objects.filter(owner=user).order_by("command", "id")


def saved_prompt_get_for_user(*, user: User, prompt_id: int) -> SavedPrompt | None:
    """One of the user's prompts, or None: another user's looks exactly like a missing one."""
    if not is_row_id(prompt_id):
        return None
    return saved_prompts_for_user(user=user).filter(id=prompt_id).first()


def conversation_get_for_user(*, user: User, conversation_id: int) -> Conversation | None:
    """The user's own conversation, or None: another user's conversation looks exactly like a missing one."""
    return _conversation_get(conversation_list_for_user(user=user), conversation_id=conversation_id)


def conversation_get_for_send(*, user: User, conversation_id: int) -> Conversation | None:
    """The user's own conversation, as `conversation_get_for_user`, locked for a send into it until
    the transaction ends (PostgreSQL row lock; SQLite locks the database), with its deployment's
    queue length (`deployment.queued_now`, for `generation_admit`): one statement.

    Whether an answer is still being written in it must be read after this, in a statement of its
    own: a send that waited here for another's lock sees that send's rows only in a later statement."""
    conversations = (
        conversation_list_for_user(user=user)
        .select_for_update(of=("self",))
        .annotate(deployment_queued_now=queue_length_annotation())
    )
    conversation = _conversation_get(conversations, conversation_id=conversation_id)
    if conversation is not None:
        # A column of the query's annotations, which the type checker cannot see on the rows.
        setattr(conversation.deployment, "queued_now", getattr(conversation, "deployment_queued_now"))  # noqa: B009, B010
    return conversation


def _conversation_get(conversations: QuerySet[Conversation], *, conversation_id: int) -> Conversation | None:
    try:
        conversation_id = int(conversation_id)
        if not 0 < conversation_id < 2**63:  # beyond a bigint, PostgreSQL would refuse the query
            return None
        return conversations.get(id=conversation_id)
    except (Conversation.DoesNotExist, TypeError, ValueError, OverflowError):
        return None


def message_list(*, conversation: Conversation) -> list[Message]:
    return list(conversation.messages.select_related("generation__deployment").all())


def message_tree(*, conversation: Conversation) -> Tree:
    """Every message of the conversation, every branch, with its generation: one query."""
    return Tree.of(message_list(conversation=conversation))


def message_tree_for_prompt(*, conversation: Conversation) -> Tree:
    """Every message of the conversation, every branch, without its generation: what a send reads to
    place its message and build its prompt. Each generation holds its whole prompt's token ids, so
    joining them would read the conversation again for every answer in it."""
    return Tree.of(conversation.messages.all())


@dataclass(frozen=True)
class Branch:
    """A branch of a conversation as a reader sees it: its messages, root first, each with
    `siblings` (its own id and its siblings', oldest first) set on it."""

    messages: list[Message]
    tree: Tree


def message_branch(*, conversation: Conversation, through: object = None) -> Branch | None:
    """The branch on screen (the stored active leaf's, `Tree.active_path`), or with `through` (a
    message id) the newest branch through that message; None when `through` names no message of
    this conversation."""
    tree = message_tree(conversation=conversation)
    if through is None:
        path = tree.active_path(conversation.active_leaf_id)
    elif is_row_id(through) and through in tree.by_id:
        path = tree.path_to(tree.newest_leaf_under(through))
    else:
        return None
    for message in path:
        message.siblings = tree.siblings(message.id)
    return Branch(path, tree)


def summary_for_branch(*, conversation_id: int, message_ids: Collection[int]) -> ConversationSummary | None:
    """The newest ready summary of the conversation that runs to a message of this branch: one that
    ran to another branch's message says nothing of this one."""
    if not message_ids:
        return None
    return (
        ConversationSummary.objects.filter(
            conversation_id=conversation_id,
            status=ConversationSummary.Status.READY,
            through_id__in=list(message_ids),
        )
        .order_by("-turns_covered", "-id")
        .first()
    )


def branch_summary(*, conversation: Conversation, messages: list[Message]) -> ConversationSummary | None:
    """The summary the model is shown of this branch's earliest messages (orchestration.memory), or None."""
    return summary_for_branch(conversation_id=conversation.id, message_ids=[m.id for m in messages])


def feedback_for_user(*, user: User, messages: list[Message]) -> dict[int, MessageFeedback]:
    """The user's feedback on any of `messages`, by message id, in one query."""
    ids = [m.id for m in messages if m.role == Message.Role.ASSISTANT]
    if not ids:
        return {}
    return {f.message_id: f for f in MessageFeedback.objects.filter(user=user, message_id__in=ids)}


def held_back_flags(*, messages: list[Message]) -> dict[int, Flag]:
    """The input flag of each of `messages` that moderation held back, by message id, in one query."""
    held = [m.id for m in messages if m.role == Message.Role.USER and m.status == Message.Status.FLAGGED]
    if not held:
        return {}
    links = (
        FlaggedMessage.objects.filter(message_id__in=held, flag__source=Flag.Source.INPUT)
        .select_related("flag")
        .order_by("-flag_id")
    )
    return {link.message_id: link.flag for link in links}  # newest first, so a message's first flag wins


def conversation_has_message_in_progress(*, conversation: Conversation) -> bool:
    return conversation.messages.filter(status__in=Message.IN_PROGRESS).exists()


def default_model_for_user(*, user: User, allowed: list[ModelDeployment] | None = None) -> str:
    """The model a new chat of this person starts on: their chosen default while it is enabled and
    their plan includes it, else the service's. `allowed`: the deployments the plan may use, when the
    caller has read them already."""
    chosen = user_settings_get(user=user).default_model
    if chosen:
        if allowed is None:
            allowed = deployments_allowed_for_user(user=user, deployments=deployment_list_enabled())
        if chosen in {deployment.public_model for deployment in allowed}:
            return chosen
    return settings.INFERENCE_DEFAULT_DEPLOYMENT


# --- projects --------------------------------------------------------------------------------------

# The chats each project shows under it in the sidebar and on its page, newest first.
PROJECT_CHATS_LIMIT = 100


def project_list_for_user(*, user: User) -> QuerySet[Project]:
    return Project.objects.filter(owner=user)


def project_get_for_user(*, user: User, project_id: object) -> Project | None:
    """The user's own project, or None: another user's project looks exactly like a missing one."""
    if not is_row_id(project_id):
        return None
    return project_list_for_user(user=user).filter(id=project_id).first()


def projects_with_chats_for_user(*, user: User) -> list[Project]:
    """The user's projects, by name, each with its chats (`project.chats`, most recently active first,
    at most PROJECT_CHATS_LIMIT): two queries, whatever the number of projects."""
    chats = Conversation.objects.order_by("-updated_at", "-id")[:PROJECT_CHATS_LIMIT]  # per project
    return list(project_list_for_user(user=user).prefetch_related(Prefetch("conversations", chats, to_attr="chats")))


def project_chats(*, project: Project) -> list[Conversation]:
    return list(project.conversations.order_by("-updated_at", "-id")[:PROJECT_CHATS_LIMIT])


def project_instructions_for_prompt(*, project_id: int | None) -> str:
    """A project's instructions as a prompt carries them (`orchestration.memory.project_block`), ""
    for none: one small read."""
    if project_id is None:
        return ""
    row = Project.objects.filter(id=project_id).values("name", "instructions").first()
    return project_block(row["name"], row["instructions"]) if row else ""


def models_for_user(*, user: User, allowed: list[ModelDeployment] | None = None) -> list[str]:
    """The public model names the user's plan lets them pick (the picker's, `auto` included)."""
    if allowed is None:
        allowed = deployments_allowed_for_user(user=user, deployments=deployment_list_enabled())
    return [name for name, _ in models_listed(allowed)]


def default_model_for_project(*, user: User, project: Project, allowed: list[ModelDeployment] | None = None) -> str:
    """The model a new chat in `project` starts on: the project's default while the user's plan
    offers it, else the person's own (`default_model_for_user`)."""
    if allowed is None:
        allowed = deployments_allowed_for_user(user=user, deployments=deployment_list_enabled())
    if project.default_model and project.default_model in models_for_user(user=user, allowed=allowed):
        return project.default_model
    return default_model_for_user(user=user, allowed=allowed)


# --- the list in the sidebar, and search ---------------------------------------------------------

SIDEBAR_LIMIT = 100
SEARCH_MAX_TERMS = 8
SEARCH_MAX_CHARS = 200
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ConversationGroup:
    label: str
    conversations: list[Conversation]


def conversation_groups_for_user(
    *, user: User, query: str = "", now: dt.datetime | None = None, limit: int = SIDEBAR_LIMIT
) -> list[ConversationGroup]:
    """The user's conversations as the sidebar lists them: pinned ones first, then the rest by when
    they were last active (Today, Yesterday, Previous 7 days, Older, by the site's time zone), each
    group newest first. A chat in a project is listed under its project instead
    (`projects_with_chats_for_user`). With `query`, every conversation it matches, projects' too
    (`conversation_search`). Archived ones are in neither: the Archived view lists them."""
    conversations = (
        conversation_search(user=user, query=query)
        if query.strip()
        else conversation_list_for_user(user=user).filter(project__isnull=True)
    )
    rows = list(conversations.filter(archived_at__isnull=True).order_by("-pinned", "-updated_at", "-id")[:limit])
    today = timezone.localdate(now or timezone.now())
    groups: dict[str, list[Conversation]] = {}
    for conversation in rows:
        groups.setdefault(_group_label(conversation, today=today), []).append(conversation)
    order = ["Pinned", "Today", "Yesterday", "Previous 7 days", "Older"]
    return [ConversationGroup(label, groups[label]) for label in order if label in groups]


def _group_label(conversation: Conversation, *, today: dt.date) -> str:
    if conversation.pinned:
        return "Pinned"
    age = (today - timezone.localdate(conversation.updated_at)).days
    if age <= 0:
        return "Today"
    if age == 1:
        return "Yesterday"
    if age <= 7:
        return "Previous 7 days"
    return "Older"


def conversation_search(*, user: User, query: str) -> QuerySet[Conversation]:
    """The user's own conversations whose title, or one of whose messages, holds every word of
    `query` (words as prefixes: "lig" finds "lighthouse").

    PostgreSQL: full-text search (`to_tsvector('simple', …)`, the expression the migration's GIN
    index on message text is built on; 'simple' stems nothing, so it reads every language alike).
    SQLite: a case-insensitive substring match of each word."""
    terms = search_terms(query)
    conversations = conversation_list_for_user(user=user)
    if not terms:
        return conversations.none()
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchQuery, SearchVector

        tsquery = SearchQuery(" & ".join(f"'{term}':*" for term in terms), config="simple", search_type="raw")
        in_messages = (
            Message.objects.filter(conversation__user=user)
            .annotate(document=SearchVector("content", config="simple"))
            .filter(document=tsquery)
            .values("conversation_id")
        )
        in_titles = conversations.annotate(document=SearchVector("title", config="simple")).filter(document=tsquery)
        return conversations.filter(Q(id__in=in_titles.values("id")) | Q(id__in=in_messages))
    title_matches, message_matches = Q(), Message.objects.filter(conversation__user=user)
    for term in terms:
        title_matches &= Q(title__icontains=term)
        message_matches = message_matches.filter(content__icontains=term)
    return conversations.filter(title_matches | Q(id__in=message_matches.values("conversation_id")))


def search_terms(query: str) -> list[str]:
    """The words of a search, lower-cased: letters, digits and underscores only, so nothing in them
    is tsquery syntax, and at most SEARCH_MAX_TERMS of them."""
    if not isinstance(query, str):
        return []
    return [word.lower() for word in _WORD.findall(query[:SEARCH_MAX_CHARS])][:SEARCH_MAX_TERMS]


# --- export and sharing -------------------------------------------------------------------------


class ExportScope(StrEnum):
    """What an export holds: the branch on screen, or every branch with the tree's structure."""

    BRANCH = "branch"
    TREE = "tree"


EXPORT_HOLDS = {
    ExportScope.BRANCH: "The branch on screen when exported, in order. Other versions of edited messages and "
    "regenerated answers are not included.",
    ExportScope.TREE: "Every message of the conversation, every branch, oldest first. Each names the message it "
    "follows (parent, null for a first message); messages that follow the same one are versions of each other "
    "(edits, regenerations). on_screen marks the branch on screen when exported.",
}


def conversation_export(*, conversation: Conversation, scope: ExportScope = ExportScope.BRANCH) -> JsonObject:
    """The conversation as plain data (the JSON download, and the Markdown one's source), saying
    what it holds (`holds`, `holds_description`): the branch on screen (`Tree.active_path`, as the
    chat page shows it), or the whole tree. Its user and assistant messages with their roles,
    statuses, times and the message each follows."""
    tree = message_tree_for_prompt(conversation=conversation)
    on_screen = tree.active_path(conversation.active_leaf_id)
    on_screen_ids = {m.id for m in on_screen}
    chosen = on_screen if scope == ExportScope.BRANCH else [tree.by_id[i] for i in sorted(tree.by_id)]
    return {
        "id": conversation.id,
        "title": conversation.display_title,
        "model": conversation.deployment.name,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "holds": str(scope),
        "holds_description": EXPORT_HOLDS[scope],
        "messages": [
            {
                "id": m.id,
                "parent": m.parent_id if m.parent_id in tree.by_id else None,
                "role": m.role,
                "content": m.content,
                "status": m.status,
                "created_at": m.created_at.isoformat(),
                **({"on_screen": m.id in on_screen_ids} if scope == ExportScope.TREE else {}),
            }
            for m in chosen
            if m.role in (Message.Role.USER, Message.Role.ASSISTANT)
        ],
    }


def conversations_export_files(*, user: User) -> dict[str, bytes]:
    """conversations' part of a person's data archive: each conversation whole, every branch
    (`conversation_export` with the tree's scope), as conversations/<id>.json, and their projects
    (projects.json: each with its instructions and its chats' ids; its files are in files.json)."""
    files = {}
    for conversation in Conversation.objects.filter(user=user).select_related("deployment").order_by("id"):
        exported = conversation_export(conversation=conversation, scope=ExportScope.TREE)
        files[f"conversations/{conversation.id}.json"] = json.dumps(exported, indent=2, ensure_ascii=False).encode()
    projects = [
        {
            "id": project.id,
            "name": project.name,
            "instructions": project.instructions,
            "default_model": project.default_model,
            "created_at": project.created_at.isoformat(),
            "updated_at": project.updated_at.isoformat(),
            "conversations": [c.id for c in project.chats],  # type: ignore[attr-defined]
        }
        for project in projects_with_chats_for_user(user=user)
    ]
    if projects:
        files["projects.json"] = json.dumps(projects, indent=2, ensure_ascii=False).encode()
    return files


def shared_conversation_get(*, token: object) -> SharedConversation | None:
    """The snapshot a shared link names; None for a token that names none (revoked, or never made)."""
    if not isinstance(token, str) or not 20 <= len(token) <= 64:
        return None
    return SharedConversation.objects.filter(token=token).first()


def shared_conversation_for(*, conversation: Conversation) -> SharedConversation | None:
    return SharedConversation.objects.filter(conversation=conversation).first()


def tool_step_for_user(*, user: User, conversation_id: int, generation_id: str) -> Message | None:
    """The answer (a tool loop's step) a generation of the user's wrote in this conversation; None
    for another user's, another conversation's, or none."""
    if not is_row_id(conversation_id):
        return None
    return Message.objects.filter(
        generation_id=generation_id,
        conversation_id=conversation_id,
        conversation__user=user,
        role=Message.Role.ASSISTANT,
    ).first()


def tool_step_between(*, step: Message, call_id: str | None = None) -> bool:
    """Whether a step of a tool loop may still be between its calls, as its rows say: it ended in
    calls, was not stopped, and no next step follows it (nor, for `call_id`, a result of that call).
    The stream that drives the loop has the last word; this spares it a question about an answer
    long over."""
    if step.finish_reason != "tool_calls" or step.status == Message.Status.STOPPED:
        return False
    if call_id is not None and call_id not in [c.get("id") for c in step.tool_calls]:
        return False
    later = Message.objects.filter(conversation_id=step.conversation_id, id__gt=step.id)
    if later.filter(role=Message.Role.ASSISTANT).exists():
        return False
    return call_id is None or not later.filter(role=Message.Role.TOOL, tool_call_id=call_id).exists()
