from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.authentication import signed_in
from accounts.metering import metered
from accounts.models import User
from accounts.selectors import deployments_allowed_for_user, quota_status_for_user
from billing.selectors import GenerationUsage
from chatsite.errors import ClientError, error_body
from conversations.branches import Tree
from conversations.citations import citations_cited, citations_for_messages
from conversations.costs import answer_usage_for_messages, conversation_usage_total
from conversations.images import images_shown
from conversations.models import Citation, Conversation, Message, Project
from conversations.requests import PROMPT_TEXT_CHARS, SavedPromptRequest
from conversations.selectors import (
    ConversationGroup,
    ExportScope,
    branch_summary,
    conversation_export,
    conversation_get_for_user,
    conversation_groups_for_user,
    default_model_for_project,
    default_model_for_user,
    feedback_for_user,
    held_back_flags,
    message_branch,
    project_chats,
    project_get_for_user,
    projects_with_chats_for_user,
    saved_prompts_for_user,
    shared_conversation_for,
    shared_conversation_get,
)
from conversations.services import (
    ANSWER_CUT,
    conversation_delete,
    conversation_pin,
    conversation_rename,
    conversation_share,
    conversation_share_revoke,
    held_back_reason,
    saved_prompt_create,
    saved_prompt_delete,
    saved_prompt_update,
)
from conversations.tool_loops import LOOP_ENDED
from documents.models import Document
from documents.selectors import documents_of_conversation, documents_of_project
from inference.execution.dispatch import engine_state
from inference.openai.tools import tool_call_reader_for
from inference.selectors import deployment_list_enabled, models_listed
from orchestration.routing import AUTO, AUTO_LABEL


@metered("request")
@login_required
@require_GET
def chat(request: HttpRequest, conversation_id: int | None = None) -> HttpResponse:
    return _chat_page(request, conversation_id=conversation_id)


@metered("request")
@login_required
@require_GET
def project_page(request: HttpRequest, project_id: int) -> HttpResponse:
    """A project's page: its chats, its settings and files, and the composer, which starts a new
    chat in it (on the project's default model unless another is picked)."""
    project = project_get_for_user(user=signed_in(request), project_id=project_id)
    if project is None:
        raise Http404("No such project.")
    return _chat_page(request, project=project)


def _chat_page(
    request: HttpRequest, *, conversation_id: int | None = None, project: Project | None = None
) -> HttpResponse:
    user = signed_in(request)
    conversation = None
    messages: list[ShownMessage] = []
    share = None
    attached: list[Document] = []
    summary = None
    conversation_total = None
    if conversation_id is not None:
        conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
        if conversation is None:
            raise Http404("No such conversation.")
        # The branch shown last (conversations.branches); the page switches branches by choosing one
        # (POST .../branch/) and loading again.
        branch = message_branch(conversation=conversation)
        assert branch is not None  # the branch shown is always one of the conversation's
        messages = _tool_steps_folded([ShownMessage(m, siblings=branch.tree.siblings(m.id)) for m in branch.messages])
        _unrun_calls_attach(messages)
        _notes_attach(messages)
        _details_attach(messages, tree=branch.tree, user=user)
        _writers_attach(messages)
        usage = answer_usage_for_messages(user=user, messages=branch.messages)
        for shown in messages:
            shown.usage = usage.get(shown.id)
        conversation_total = conversation_usage_total(user=user, conversation_id=conversation.id)
        sources = citations_for_messages(owner_id=user.id, message_ids=[m.id for m in messages])
        for shown in messages:
            shown.citation_list = citations_cited(sources.get(shown.id, []), text=shown.content)
        with_images = [m.id for m in messages if m.image_count]
        if with_images:
            images = images_shown(message_ids=with_images)
            for shown in messages:
                shown.images = images.get(shown.id, [])
        attached = list(documents_of_conversation(user=user, conversation_id=conversation.id))
        # Where the model's memory of the branch begins: the messages up to `through` are summarized.
        summary = branch_summary(conversation=conversation, messages=branch.messages)
        share = shared_conversation_for(conversation=conversation)
    deployments = deployments_allowed_for_user(user=user, deployments=deployment_list_enabled())
    # The public model names (orchestration.routing): `auto`, and one for the deployments sharing one.
    models = [(name, AUTO_LABEL if name == AUTO else d.label) for name, d in models_listed(deployments)]
    if conversation is not None:
        # The picker shows the model the conversation is on now; switching it applies from the
        # next message (`message_send`), and only to a model the plan includes.
        selected = conversation.model
        if all(name != selected for name, _ in models):
            models = [(selected, conversation.deployment.label), *models]
    elif project is not None:
        selected = default_model_for_project(user=user, project=project, allowed=deployments)
    else:
        selected = default_model_for_user(user=user, allowed=deployments)
    return render(
        request,
        "conversations/chat.html",
        {
            "conversation": conversation,
            "chat_messages": messages,
            "summary": summary,
            "conversation_groups": conversation_groups_for_user(user=user),
            "share_url": request.build_absolute_uri(_share_path(share.token)) if share else "",
            "models": models,
            "default_deployment": selected,
            "engine_state": engine_state(settings.INFERENCE_DEFAULT_DEPLOYMENT),
            "answer_cut_note": ANSWER_CUT,
            "attached_files": attached,
            "conversation_total": conversation_total,
            "quota": quota_status_for_user(user=user),
            "projects": projects_with_chats_for_user(user=user),
            # The project page's (`project_page`), or the project of the conversation shown.
            "project": project or (conversation.project if conversation is not None else None),
            "project_page": project is not None,
            "project_chats": project_chats(project=project) if project is not None else [],
            "project_files": list(documents_of_project(user=user, project_id=project.id)) if project else [],
        },
    )


@dataclass
class ShownMessage:
    """A message of the branch on the chat page, with what the page shows beside it. Anything else
    the template asks of it is the message's own (`content`, `role`, `status`, ...)."""

    message: Message
    siblings: list[int]  # its own id and its siblings', oldest first (conversations.branches)
    note: str = ""  # under a flagged message: why
    siblings_list: str = ""  # `siblings`, as the page's data attribute has it
    newest_generation: str = ""  # the newest answer's generation beside an answer (a regenerate's `replaces`)
    rating: str = ""  # the user's thumbs up or down
    stats: str = ""  # its size and time, on hover
    writer: str = ""  # the deployment that wrote an answer, said under it
    citation_list: list[Citation] = field(default_factory=list)
    usage: GenerationUsage | None = None  # an answer's tokens and cost, for its owner's info panel
    images: list[dict[str, object]] = field(default_factory=list)  # a user message's (conversations.images)
    # The tool calls that led to an answer (its loop's steps, folded into it), as the page shows them.
    tool_steps: list[ToolStepShown] = field(default_factory=list)
    tool_note: str = ""  # under an answer whose loop ended before its calls ran

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)


@dataclass
class ToolStepShown:
    """One call of an answer's tool loop as the page shows it: what ran, with which arguments, and
    what came back for the person (moderated; never the fenced turn the model read)."""

    name: str
    arguments: str
    outcome: str
    output: str
    truncated: bool

    @property
    def label(self) -> str:
        return tool_step_label(name=self.name, arguments=self.arguments, outcome=self.outcome)


def tool_step_label(*, name: str, arguments: str, outcome: str) -> str:
    """What a step says it did, as static/chat/tools.js says it live: "Searched the web for …"."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = {}
    parsed = parsed if isinstance(parsed, dict) else {}
    said = {
        "web_search": f"Searched the web for “{parsed.get('query', '')}”",
        "search_files": f"Searched your files for “{parsed.get('query', '')}”",
        "fetch_page": f"Read {parsed.get('url', 'a page')}",
        "run_code": "Ran code",
    }.get(name, f"Used {name}")
    if outcome in ("ok", ""):
        return said
    return f"{said} ({TOOL_OUTCOMES.get(outcome, outcome)})"


TOOL_OUTCOMES = {
    "failed": "failed",
    "invalid": "not run: invalid call",
    "timeout": "timed out",
    "refused": "not allowed",
    "withheld": "result withheld",
    "not_run": "not run",
}


def _tool_steps_folded(messages: list[ShownMessage]) -> list[ShownMessage]:
    """The branch with each answer's tool loop folded into the answer it led to: the steps that
    called tools and their results are not messages of their own on the page. A loop that ended
    before an answer in words (stopped) shows its last step, with its calls."""
    shown: list[ShownMessage] = []
    steps: list[ToolStepShown] = []
    for index, message in enumerate(messages):
        if message.role == Message.Role.TOOL:
            data = message.tool_shown or {}
            steps.append(
                ToolStepShown(
                    name=message.tool_name,
                    arguments=str(data.get("arguments", "")),
                    outcome=str(data.get("outcome", "")),
                    output=str(data.get("output", "")),
                    truncated=bool(data.get("truncated")),
                )
            )
            continue
        if message.role == Message.Role.ASSISTANT and message.tool_calls and index < len(messages) - 1:
            continue
        if message.role == Message.Role.ASSISTANT and steps:
            message.tool_steps, steps = steps, []
        shown.append(message)
    return shown


def _unrun_calls_attach(messages: list[ShownMessage]) -> None:
    """A tool step whose loop ended before its calls were read (the socket that drove it closed while
    it was written) kept the text of its calls: shown as the live page shows it, its words, and
    its calls as steps that did not run, with the same note."""
    for shown in messages:
        generation = shown.generation if shown.role == Message.Role.ASSISTANT else None
        if generation is None or not generation.tool_fields or shown.tool_calls or shown.is_in_progress:
            continue
        reader = tool_call_reader_for(fields=generation.tool_fields, deployment=generation.deployment)
        if reader is None:
            continue
        words, calls = reader.complete(shown.content)
        if not calls:
            continue
        shown.message.content = words or ""  # as shown, never saved
        shown.tool_steps = [
            *shown.tool_steps,
            *(
                ToolStepShown(
                    name=call["function"]["name"],
                    arguments=call["function"]["arguments"],
                    outcome="not_run",
                    output="",
                    truncated=False,
                )
                for call in calls
            ),
        ]
        shown.tool_note = LOOP_ENDED


def _notes_attach(messages: list[ShownMessage]) -> None:
    """Give each flagged message the note the page shows under it: a held-back message its own
    reason, as its send gave it (with the self-harm support line where it applies), and an answer
    output moderation cut the same words the live page adds."""
    flags = held_back_flags(messages=[m.message for m in messages])
    for message in messages:
        if message.status != Message.Status.FLAGGED:
            continue
        if message.role == Message.Role.USER:
            message.note = held_back_reason(flag=flags.get(message.id))
        else:
            message.note = ANSWER_CUT


def _details_attach(messages: list[ShownMessage], *, tree: Tree, user: User) -> None:
    """What the page's branch navigation, Regenerate, feedback and hover need of each message: its
    siblings, the newest answer's generation beside an answer (a regenerate's `replaces`), the
    user's rating, and its size and time."""
    feedback = feedback_for_user(user=user, messages=[m.message for m in messages])
    for message in messages:
        message.siblings_list = ",".join(map(str, message.siblings))
        newest = tree.by_id[message.siblings[-1]]
        message.newest_generation = str(newest.generation_id or "")
        message.rating = feedback[message.id].rating if message.id in feedback else ""
        message.stats = _stats(message.message)


def _writers_attach(messages: list[ShownMessage]) -> None:
    """The deployment that wrote each answer (orchestration.routing, or a regenerate's model), said
    under every answer: a conversation's answers may come from several models."""
    for message in messages:
        generation = message.generation if message.role == Message.Role.ASSISTANT else None
        if generation is not None:
            # As the live page has it (message.accepted's model): marked where the scripted engine wrote it.
            message.writer = generation.deployment.answer_model


def _stats(message: Message) -> str:
    stats = f"{message.token_count} tokens"
    generation = message.generation
    if generation is not None and generation.started_at and generation.finished_at:
        stats += f" · {(generation.finished_at - generation.started_at).total_seconds():.1f} s"
    return stats


def _own_conversation(request: HttpRequest, conversation_id: int) -> Conversation:
    """The signed-in user's conversation; 404 for another user's, exactly as for a missing one."""
    conversation = conversation_get_for_user(user=signed_in(request), conversation_id=conversation_id)
    if conversation is None:
        raise Http404("No such conversation.")
    return conversation


def _json_endpoint(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
    """A page's script endpoint: the session's user only (401 in JSON, not the sign-in page's
    redirect, for a script to read), the user's own conversations only (404), and a ClientError
    answered in the site's error shape. CSRF is Django's middleware's, as for every POST."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            body = error_body(message="Sign in first.", status=401, code="not_authenticated")
            return JsonResponse(body, status=401)
        try:
            return view(request, *args, **kwargs)
        except Http404:
            body = error_body(message="That conversation does not exist.", status=404, code="not_found")
            return JsonResponse(body, status=404)
        except ClientError as exc:
            body = error_body(message=exc.message, status=exc.status, code=exc.code, param=exc.param)
            return JsonResponse(body, status=exc.status)

    return wrapped


def _conversation_json(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "title": conversation.display_title,
        "pinned": conversation.pinned,
        "url": reverse("conversations:conversation", args=[conversation.id]),
    }


@metered("request")
@require_POST
@_json_endpoint
def conversation_rename_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _own_conversation(request, conversation_id)
    conversation_rename(conversation=conversation, title=request.POST.get("title", ""))
    return JsonResponse(_conversation_json(conversation))


@metered("request")
@require_POST
@_json_endpoint
def conversation_pin_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _own_conversation(request, conversation_id)
    pinned = request.POST.get("pinned")
    if pinned not in ("true", "false"):
        raise ClientError("'pinned' must be true or false.", code="invalid_request", param="pinned")
    conversation_pin(conversation=conversation, pinned=pinned == "true")
    return JsonResponse(_conversation_json(conversation))


@metered("request")
@login_required
@require_POST
def conversation_delete_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation_delete(conversation=_own_conversation(request, conversation_id))
    return redirect("conversations:chat")


@metered("request")
@require_GET
@_json_endpoint
def conversation_search_view(request: HttpRequest) -> HttpResponse:
    """The sidebar's list, grouped as the page renders it; with `q`, only the conversations it finds."""
    groups = conversation_groups_for_user(user=signed_in(request), query=request.GET.get("q", ""))
    return JsonResponse({"groups": [_group_json(group) for group in groups]})


def _group_json(group: ConversationGroup) -> dict[str, Any]:
    return {"label": group.label, "conversations": [_conversation_json(c) for c in group.conversations]}


# --- export ---------------------------------------------------------------------------------------


def _export_scope(request: HttpRequest) -> ExportScope | None:
    """`?scope=branch` (the default: the branch on screen) or `?scope=tree` (every branch); None for
    anything else."""
    try:
        return ExportScope(request.GET.get("scope", ExportScope.BRANCH))
    except ValueError:
        return None


SCOPE_REFUSED = "scope must be 'branch' (the branch on screen) or 'tree' (every branch)."


@metered("request")
@login_required
@require_GET
def conversation_export_json(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _own_conversation(request, conversation_id)
    scope = _export_scope(request)
    if scope is None:
        return HttpResponseBadRequest(SCOPE_REFUSED, content_type="text/plain")
    exported = conversation_export(conversation=conversation, scope=scope)
    body = json.dumps(exported, ensure_ascii=False, indent=2)
    return _download(body, content_type="application/json", filename=_filename(exported, "json"))


@metered("request")
@login_required
@require_GET
def conversation_export_markdown(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _own_conversation(request, conversation_id)
    scope = _export_scope(request)
    if scope is None:
        return HttpResponseBadRequest(SCOPE_REFUSED, content_type="text/plain")
    exported = conversation_export(conversation=conversation, scope=scope)
    return _download(export_markdown(exported), content_type="text/markdown", filename=_filename(exported, "md"))


ROLE_HEADINGS = {"user": "You", "assistant": "Assistant"}
STATUS_NOTES = {
    "flagged": "held back by an automatic safety check",
    "stopped": "stopped",
    "failed": "failed",
    "pending": "not written yet",
    "streaming": "still being written",
}


def export_markdown(exported: dict[str, Any]) -> str:
    """The conversation as Markdown: what it holds (the branch on screen, or every branch), then a
    heading per message, its text as it was written (Markdown the model wrote stays Markdown), and a
    note where a message did not end normally. Every branch: each heading names its message and
    the one it follows, and marks those of the branch on screen."""
    tree = exported["holds"] == ExportScope.TREE
    parts = [
        f"# {_one_line(exported['title'])}",
        "",
        f"Model: {exported['model']} · {exported['created_at']}",
        "",
        f"> {exported['holds_description']}",
        "",
    ]
    for message in exported["messages"]:
        heading = f"## {ROLE_HEADINGS.get(message['role'], message['role'])}"
        if tree:
            heading += f" · #{message['id']}"
            heading += f", after #{message['parent']}" if message["parent"] is not None else ", first"
            heading += ", on screen" if message["on_screen"] else ""
        if message["status"] in STATUS_NOTES:
            heading += f" ({STATUS_NOTES[message['status']]})"
        parts += [heading, "", message["content"], ""]
    return "\n".join(parts)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _filename(exported: dict[str, Any], extension: str) -> str:
    """An ASCII file name from the title (nothing in it can break the header): `chat-12-trip-plans.md`,
    `chat-12-trip-plans-all-branches.json` for every branch."""
    slug = re.sub(r"[^a-z0-9]+", "-", exported["title"].lower()).strip("-")[:40].strip("-")
    every = "-all-branches" if exported["holds"] == ExportScope.TREE else ""
    return f"chat-{exported['id']}{'-' + slug if slug else ''}{every}.{extension}"


def _download(body: str, *, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(body.encode(), content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# --- sharing --------------------------------------------------------------------------------------


def _share_path(token: str) -> str:
    return reverse("conversations:shared", args=[token])


@metered("request")
@require_POST
@_json_endpoint
def conversation_share_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    share = conversation_share(conversation=_own_conversation(request, conversation_id))
    return JsonResponse({"url": request.build_absolute_uri(_share_path(share.token))})


@metered("request")
@require_POST
@_json_endpoint
def conversation_share_revoke_view(request: HttpRequest, conversation_id: int) -> HttpResponse:
    revoked = conversation_share_revoke(conversation=_own_conversation(request, conversation_id))
    return JsonResponse({"revoked": revoked})


@metered("request")
@never_cache  # revoking must take the page down everywhere: no cache along the way may keep a copy
@require_GET
def shared_conversation(request: HttpRequest, token: str) -> HttpResponse:
    """A shared snapshot, readable by anyone with its link, signed in or not: its title and messages
    as text, nothing of the account it came from, and kept out of search engines."""
    share = shared_conversation_get(token=token)
    if share is None:
        raise Http404("No such shared conversation.")
    response = render(request, "conversations/shared.html", {"share": share})
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


# --- the prompt library -----------------------------------------------------------------------------


def _prompts_page(request: HttpRequest, *, status: int = 200, editing: int | None = None) -> HttpResponse:
    return render(
        request,
        "conversations/prompts.html",
        {
            "prompts": saved_prompts_for_user(user=signed_in(request)),
            "text_chars": PROMPT_TEXT_CHARS,
            "editing": editing,
            "form": request.POST if status != 200 else {},
        },
        status=status,
    )


def _prompt_write(
    request: HttpRequest, write: Callable[[SavedPromptRequest], Any], *, editing: int | None = None
) -> HttpResponse:
    """A form's prompt written by `write`, then back to the library; refused, the page again with why."""
    try:
        write(SavedPromptRequest.parse(request.POST))
    except ClientError as exc:
        flash.error(request, exc.message)
        return _prompts_page(request, status=exc.status, editing=editing)
    return redirect("conversations:prompts")


@metered("request")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def saved_prompts_view(request: HttpRequest) -> HttpResponse:
    """The user's prompt library: each prompt with its command, to edit or delete, and a form for a new one."""
    if request.method == "POST":
        return _prompt_write(request, lambda asked: saved_prompt_create(user=signed_in(request), request=asked))
    return _prompts_page(request)


@metered("request")
@login_required
@require_POST
def saved_prompt_edit_view(request: HttpRequest, prompt_id: int) -> HttpResponse:
    return _prompt_write(
        request,
        lambda asked: saved_prompt_update(user=signed_in(request), prompt_id=prompt_id, request=asked),
        editing=prompt_id,
    )


@metered("request")
@login_required
@require_POST
def saved_prompt_delete_view(request: HttpRequest, prompt_id: int) -> HttpResponse:
    try:
        saved_prompt_delete(user=signed_in(request), prompt_id=prompt_id)
    except ClientError as exc:
        raise Http404(exc.message) from None
    return redirect("conversations:prompts")
