from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, TextField, Value
from django.db.models.functions import Concat
from django.utils import timezone

from accounts.models import ApiKey, User
from accounts.selectors import user_instructions
from accounts.services import (
    Admission,
    RequestLimits,
    action_admit,
    admission_refund,
    request_admit,
    request_limits,
    request_size_check,
    user_sockets_tell,
)
from chatsite.errors import ClientError
from conversations.branches import Tree
from conversations.citations import citations_record, retrieved_for_answer
from conversations.models import Conversation, Message, MessageFeedback, SharedConversation
from conversations.prompts import AssembledPrompt, Memory, Turn, assemble_prompt
from conversations.selectors import (
    conversation_get_for_send,
    conversation_get_for_user,
    conversation_has_message_in_progress,
    default_model_for_user,
    message_tree_for_prompt,
    summary_for_branch,
)
from conversations.summaries import summary_extend
from conversations.titles import (
    TITLE_MAX_TOKENS,
    TITLE_TEMPERATURE,
    title_clean,
    title_from_message,
    title_prompt_messages,
)
from documents.retrieval import (
    NOTHING,
    Retrieved,
    passages_quoted,
    retrieve_for_message,
)
from inference.caching import response_cache_probe
from inference.engine.tokenizers import (
    continuation_ids,
    count_tokens,
    render_chat,
    special_tokens_defused,
    tokenizer_for,
)
from inference.held import HeldAnswer, held_verdict_wait_sync
from inference.models import Generation, GenerationId, ModelDeployment
from inference.selectors import Routed, deployment_get
from inference.services import generation_admit, generation_create, service_generation_create
from moderation.models import Flag
from moderation.services import (
    CONTENT_FILTER,
    InputCheck,
    Verdict,
    flag_create,
    input_moderate,
    verdict_of_flag,
    verdict_under_tier,
)
from orchestration.routing import route

logger = logging.getLogger(__name__)
# What a message held back by moderation says when the verdict that held it is gone.
HELD_BACK = "This message wasn't sent to the assistant: an automatic safety check held it back."
# What an answer output moderation cut says under what it had written (the chat page and its script).
ANSWER_CUT = "This answer was stopped by an automatic safety check; what it had written before that is kept."
# A send's `parent` when the request names none: the leaf of the branch last shown or answered.
ACTIVE_BRANCH: Any = type("ActiveBranch", (), {"__repr__": lambda self: "ACTIVE_BRANCH"})()
FEEDBACK_COMMENT_CHARS = 2000


@dataclass(frozen=True)
class SentMessage:
    """What message_send did. A message held back by moderation has no answer and no generation."""

    conversation: Conversation
    conversation_created: bool
    user_message: Message
    assistant_message: Message | None
    generation: Generation | None
    blocked_reason: str = ""
    warning: str = ""
    # True when the message had been sent before (its `client_id`) and this is what that send saved.
    replayed: bool = False

    @property
    def blocked(self) -> bool:
        return self.generation is None


def conversation_create(
    *, user: User, deployment: ModelDeployment | None = None, title: str = "", model_name: str = ""
) -> Conversation:
    return Conversation.objects.create(
        user=user, deployment=deployment or deployment_get(), title=title[:200], model_name=model_name
    )


def conversation_start(*, user: User, title: str = "", model: str | None = None) -> Conversation:
    """An empty conversation on `model` (or the default), refused if the user's plan excludes the
    model or if the user has started the plan's conversations for the hour (429 rate_limited)."""
    asked = model or default_model_for_user(user=user)
    deployment = route(user=user, model=asked).deployment
    request_limits(user=user, deployment=deployment)  # the plan's gate: refuses a model it excludes
    action_admit(user=user, action="conversation")
    return conversation_create(
        user=user, deployment=deployment, title=title.strip(), model_name=_model_name(asked, deployment)
    )


def _model_name(asked: str, deployment: ModelDeployment) -> str:
    """What a conversation stores of the model it was asked for: only a name its deployment does not
    serve (`auto`); otherwise it follows its deployment's public name."""
    return "" if asked == deployment.public_model else asked


def _conversation_route(
    *, user: Any, conversation: Conversation, model: str | None, prompt_tokens: Any = None
) -> Routed:
    """The deployment a conversation's next answer goes to (orchestration.routing): the one it is on,
    unless that is drained or gone or cannot take it, or `model` names another model (a switch, from
    this message on). A move is saved on the conversation, inside the caller's transaction."""
    current = conversation.model
    asked = model or current
    sticky = conversation.deployment if asked == current else None
    routed = route(user=user, model=asked, sticky=sticky, prompt_tokens=prompt_tokens)
    name = _model_name(asked, routed.deployment)
    if routed.deployment.id != conversation.deployment_id or name != conversation.model_name:
        conversation.deployment, conversation.model_name = routed.deployment, name
        Conversation.objects.filter(id=conversation.id).update(deployment=routed.deployment, model_name=name)
    return routed


def _prompt_measure(*, path: list[Message], content: str) -> Any:
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
    _title_announce(user_id=conversation.user_id, conversation_id=conversation.id, title=title)
    return conversation


def conversation_pin(*, conversation: Conversation, pinned: bool) -> Conversation:
    """Pin the conversation above the others in its owner's list (or unpin it). Its place among
    the rest does not change: `updated_at` is left as it was."""
    Conversation.objects.filter(id=conversation.id).update(pinned=pinned)
    conversation.pinned = pinned
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    from inference.services import generation_request_stop

    for message in conversation.messages.filter(status__in=Message.IN_PROGRESS).select_related("generation"):
        if message.generation is not None:
            generation_request_stop(generation=message.generation)
    conversation.delete()


def clean_message_content(content: object) -> str:
    if not isinstance(content, str):
        raise ClientError("A message must be text.", code="invalid_message", param="content")
    if "\x00" in content:
        raise ClientError("A message cannot contain NUL characters.", code="invalid_message", param="content")
    content = content.strip()
    if not content:
        raise ClientError("A message cannot be empty.", code="invalid_message", param="content")
    if len(content) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise ClientError(
            f"A message can be at most {settings.CHAT_MAX_MESSAGE_CHARS} characters long.",
            code="message_too_long",
            param="content",
        )
    return content


def message_send(
    *,
    user: User,
    content: Any,
    conversation_id: Any = None,
    model: str | None = None,
    api_key: ApiKey | None = None,
    verdict: Verdict | InputCheck | None = None,
    client_id: Any = None,
    retry: bool = False,
    settle: bool = True,
    parent: Any = ACTIVE_BRANCH,
) -> SentMessage | HeldAnswer[SentMessage]:
    """Save the user's message and a pending answer, and queue the answer's generation.

    All or nothing: a refused message (too long for the window, a conversation already answering,
    a model the plan does not include, a rate limit or quota reached, a full queue) leaves no rows
    behind. The generation is dispatched only after the transaction commits. A message input
    moderation blocks is saved as flagged, with its flag, and gets no answer.

    `verdict` is input moderation's verdict on the cleaned `content` when the caller has classified
    it already, or an `InputCheck` whose verdict is taken here, under the tier the transaction reads
    (the chat socket and the send API make one); otherwise the content is classified here, before
    the transaction.

    An `InputCheck` whose scores are not in when the transaction has done everything else (the
    socket's and the API's begin only when asked) does not hold the transaction up: the answer is
    committed held (`generation_create(awaiting_verdict=True)`) and dispatched, so the engine starts
    on it while the message is scored, and the verdict is taken after the commit. The runner shows
    none of a held answer until the verdict lets it through; a verdict that blocks takes the answer
    back (never shown, never charged) and keeps the message flagged, so what this returns is what it
    would have returned had the verdict come first (`inference.held`). With `settle=False`, a send
    committed held returns its `HeldAnswer` instead, for an async caller to await the scores on its
    event loop and settle it in a call of its own (`checked_after_commit`), so that no database
    thread waits for the scores.

    `client_id` is the sender's own id for the message (a UUID): a message is saved once per id. A
    send whose id the user has sent before saves nothing and returns what the first send saved
    (`replayed`), so a client whose connection dropped before it heard whether its message arrived
    can send it again. `retry` says it may have been sent before, and the id is looked up first; a
    first send skips that look-up (one round trip fewer before the first token), and the unique
    constraint on the id still catches one that arrives twice.

    `parent`: the message the new one follows, in the conversation's tree (conversations.branches):
    an answer, or a message moderation held back; None to start a new branch from the beginning (an
    edit of the first message); left out, the leaf of the branch on screen. A new message beside one
    sent before is an edit: the old branch stays. Its prompt is that branch alone, root to `parent`.
    """
    content = clean_message_content(content)
    client_id = _uuid_param(client_id, param="client_id")
    parent = _parent_param(parent)
    if conversation_id is None and parent not in (ACTIVE_BRANCH, None):
        raise ClientError("A 'parent' needs the 'conversation' it is in.", code="invalid_parent", param="parent")
    if retry and client_id is not None:
        earlier = _message_sent_earlier(user=user, client_id=client_id, conversation_id=conversation_id)
        if earlier is not None:
            return earlier
    if verdict is None:
        # Classified before the transaction opens, so no lock is held while the classifier runs.
        verdict = input_moderate(user=user, text=content)
    # Before the transaction too: the search reads only the user's own files, whatever the id names.
    retrieved = _passages_for(user_id=user.id, conversation_id=conversation_id, text=content)
    try:
        saved = _message_save(
            user=user,
            content=content,
            conversation_id=conversation_id,
            model=model,
            verdict=verdict,
            api_key=api_key,
            client_id=client_id,
            parent=parent,
            retrieved=retrieved,
        )
    except IntegrityError:
        # The same id in a send that committed first (PostgreSQL made this one wait for it).
        if client_id is None:
            raise
        earlier = _message_sent_earlier(user=user, client_id=client_id, conversation_id=conversation_id)
        if earlier is not None:
            return earlier
        if Message.objects.filter(client_id=client_id).exists():  # someone else's id: say no more
            raise ClientError("That 'client_id' cannot be used.", code="invalid_request", param="client_id") from None
        raise
    if isinstance(saved, _HeldMessage) and settle:
        return saved.settle(verdict)
    return saved


def _passages_for(*, user_id: int, conversation_id: Any, text: str) -> Retrieved:
    """The passages of the user's files (the conversation's and the library's) that answer `text`.
    A search that fails costs the answer its passages, not the message."""
    if conversation_id is not None and not _is_row_id(conversation_id):
        return NOTHING
    try:
        return retrieve_for_message(owner_id=user_id, conversation_id=conversation_id, text=text)
    except Exception:
        logger.exception("the search of user %s's files failed; answering without them", user_id)
        return NOTHING


def _citations_save(*, user_id: int, answer: Message, prompt: AssembledPrompt, retrieved: Retrieved) -> None:
    if not retrieved.empty:
        citations_record(
            owner_id=user_id,
            message_id=answer.id,
            cited=retrieved.passages[: prompt.passages_kept],
            withheld=retrieved.withheld,
        )


def _uuid_param(value: object, *, param: str) -> uuid.UUID | None:
    """A request's optional UUID field, refused with a clear error when it is anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ClientError(f"'{param}' must be a UUID.", code="invalid_request", param=param)


def _parent_param(value: Any) -> Any:
    if value is ACTIVE_BRANCH or value is None or _is_row_id(value):
        return value
    raise ClientError("'parent' must be a message id or null.", code="invalid_request", param="parent")


def _parent_resolve(*, tree: Tree, conversation: Conversation, parent: Any) -> int | None:
    """The id of the message a new user message follows, checked to be one it can follow: an answer
    of this conversation (of any state: a failed one's question is answered again by the new message's
    prompt), or a message moderation held back, which has none."""
    if parent is ACTIVE_BRANCH:
        path = tree.active_path(conversation.active_leaf_id)
        return path[-1].id if path else None
    if parent is None:
        return None
    message = tree.by_id.get(parent)
    if message is None:
        raise ClientError(
            "That message is not in this conversation.", code="invalid_parent", status=400, param="parent"
        )
    if message.role == Message.Role.USER and message.status != Message.Status.FLAGGED:
        raise ClientError(
            "A message follows an answer: 'parent' must be an answer's id.", code="invalid_parent", param="parent"
        )
    return message.id


def _is_row_id(value: object) -> bool:
    """A value a query may compare with an id: an integer (not a bool) that fits a bigint, which
    SQLite and PostgreSQL would otherwise refuse with an error of their own."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63


def _message_sent_earlier(*, user: User, client_id: uuid.UUID, conversation_id: Any) -> SentMessage | None:
    """What the user's earlier send of `client_id` saved, as that send returned it; None if none did."""
    user_message = (
        Message.objects.select_related("conversation")
        .filter(client_id=client_id, role=Message.Role.USER, conversation__user=user)
        .first()
    )
    if user_message is None:
        return None
    conversation = user_message.conversation
    # Told again that the conversation was created, so a client that missed it learns its id.
    created = conversation_id is None
    answer = (
        Message.objects.select_related("generation__deployment")
        .filter(parent=user_message, role=Message.Role.ASSISTANT, generation__isnull=False)
        .first()
    )
    if answer is not None and answer.generation.awaiting_verdict:
        # The first send is still judging the message: answer with what its verdict makes of it.
        held_verdict_wait_sync(generation_id=answer.generation_id)
        return _message_sent_earlier(user=user, client_id=client_id, conversation_id=conversation_id)
    flag = user_message.moderation_flags.filter(source="input").first()
    verdict = verdict_of_flag(flag) if flag is not None else None
    if answer is None:  # held back by moderation: it has no answer
        reason = held_back_reason(flag=flag)
        return SentMessage(conversation, created, user_message, None, None, blocked_reason=reason, replayed=True)
    warning = verdict.warning() if verdict is not None and verdict.action == "warn" else ""
    return SentMessage(conversation, created, user_message, answer, answer.generation, warning=warning, replayed=True)


def held_back_reason(*, flag: Flag | None) -> str:
    """What a message input moderation held back says, from its flag: what the send said then."""
    if flag is None:
        return HELD_BACK
    return verdict_of_flag(flag).explanation()


@dataclass(frozen=True)
class _QueuedAnswer:
    user_message: Message
    answer: Message
    generation: Generation
    admission: Admission


@dataclass(frozen=True)
class _HeldMessage(HeldAnswer[SentMessage]):
    """A message committed with its answer held (`inference.held`). Passed (or warned): the answer
    is released. Blocked: the answer is withdrawn (never shown, never charged) and the message kept
    flagged, with its flag, exactly as a message blocked before its answer was queued. Scores that
    never come remove what the send saved, as if it had never been sent."""

    sent: SentMessage

    def passed(self, verdict: Verdict) -> SentMessage:
        warning = ""
        if verdict.action == "warn":
            flag_create(user=self.user, message=self.sent.user_message, source="input", text=self.text, verdict=verdict)
            warning = verdict.warning()
        return replace(self.sent, warning=warning)

    def withdrawn(self, verdict: Verdict | None) -> None:
        sent = self.sent
        assert sent.assistant_message is not None
        if verdict is None:
            if sent.conversation_created:
                Conversation.objects.filter(id=sent.conversation.id).delete()
            else:
                Message.objects.filter(id__in=[sent.user_message.id, sent.assistant_message.id]).delete()
            return
        Message.objects.filter(id=sent.assistant_message.id).delete()
        Message.objects.filter(id=sent.user_message.id).update(status=Message.Status.FLAGGED, updated_at=timezone.now())
        sent.user_message.status = Message.Status.FLAGGED
        flag_create(user=self.user, message=sent.user_message, source="input", text=self.text, verdict=verdict)

    def blocked(self, verdict: Verdict, *, withdrawn: bool) -> SentMessage:
        if not withdrawn:  # the other verdict decided first
            return self.sent
        sent = self.sent
        return SentMessage(
            sent.conversation,
            sent.conversation_created,
            sent.user_message,
            None,
            None,
            blocked_reason=verdict.explanation(),
        )


class _Blocked(Exception):
    """Input moderation blocked the message: what its transaction did is rolled back, the message
    is saved flagged in a transaction of its own (`_message_save_blocked`)."""

    def __init__(self, *, verdict: Verdict, conversation: Conversation, parent_id: int | None) -> None:
        super().__init__(verdict.explanation())
        self.verdict = verdict
        self.conversation = conversation
        self.parent_id = parent_id


def _message_save(
    *,
    user: User,
    content: str,
    conversation_id: Any,
    model: str | None,
    verdict: Verdict | InputCheck,
    api_key: ApiKey | None,
    client_id: uuid.UUID | None,
    parent: Any,
    retrieved: Retrieved = NOTHING,
) -> SentMessage | _HeldMessage:
    # What an allowed message needs (its prompt, its rows, its generation and its charge on the rate
    # limits) does not depend on the verdict, so it is done while the scores may still be coming. A
    # blocked message rolls all of it back (the dispatch registered in it goes too) and is saved
    # flagged in a second transaction: the rare path pays for the block, instead of every send paying
    # a savepoint's two round trips on the way to its first token.
    try:
        return _message_save_allowed(
            user=user,
            content=content,
            conversation_id=conversation_id,
            model=model,
            verdict=verdict,
            api_key=api_key,
            client_id=client_id,
            parent=parent,
            retrieved=retrieved,
        )
    except _Blocked as blocked:
        return _message_save_blocked(
            user=user,
            content=content,
            created=conversation_id is None,
            blocked=blocked,
            client_id=client_id,
        )


@transaction.atomic
def _message_save_allowed(
    *,
    user: User,
    content: str,
    conversation_id: Any,
    model: str | None,
    verdict: Verdict | InputCheck,
    api_key: ApiKey | None,
    client_id: uuid.UUID | None,
    parent: Any,
    retrieved: Retrieved = NOTHING,
) -> SentMessage | _HeldMessage:
    """The message saved and its answer queued; raises `_Blocked` (after giving its charge back) when
    the verdict blocks it. A refusal (too long for the window, a limit reached) waits for the verdict
    as well: a message moderation blocks is kept flagged whatever else is wrong with it. Scores not in
    yet hold the answer instead of the transaction: it is committed held, and the verdict is taken
    after the commit while the engine starts on it."""
    created = conversation_id is None
    if created:
        asked = model or default_model_for_user(user=user)
        # With its queue's length, read in the same statement for generation_admit.
        routed = route(user=user, model=asked, prompt_tokens=_prompt_measure(path=[], content=content))
        deployment = routed.deployment
        # Untitled: the title is written once an answer has ended (conversation_title_request), so
        # a message moderation holds back never names the conversation.
        conversation = conversation_create(user=user, deployment=deployment, model_name=_model_name(asked, deployment))
        tree = Tree.of([])
        parent_id = _parent_resolve(tree=tree, conversation=conversation, parent=parent)
    else:
        # Locked: sends into one conversation are serialised.
        conversation = conversation_get_for_send(user=user, conversation_id=conversation_id)
        if conversation is None:
            raise ClientError("That conversation does not exist.", code="not_found", status=404, param="conversation")
        if conversation_has_message_in_progress(conversation=conversation):
            raise ClientError(
                "An answer is still being written in this conversation. Wait for it or stop it first.",
                code="generation_in_progress",
                status=409,
            )
        # Every branch, to find the one the message goes on.
        tree = message_tree_for_prompt(conversation=conversation)
        parent_id = _parent_resolve(tree=tree, conversation=conversation, parent=parent)
        # The model switches when `model` names another, and its gate comes next (`request_limits`
        # refuses a model the plan excludes): a refused send rolls the switch back.
        routed = _conversation_route(
            user=user,
            conversation=conversation,
            model=model,
            prompt_tokens=_prompt_measure(path=tree.path_to(parent_id), content=content),
        )
        deployment = routed.deployment

    # The plan first: a model it does not include is refused before anything is loaded for it.
    limits = request_limits(user=user, deployment=deployment, api_key=api_key)
    # Before the message is tokenized or its verdict asked for (which starts the scoring): a message
    # that cannot fit is refused unsaved, unscored and uncharged.
    request_size_check(chars=len(content), limits=limits)
    if isinstance(verdict, InputCheck):
        verdict = verdict.verdict_if_scored(tier_id=limits.tier.id) or verdict
    queued, kept = None, False
    try:
        refused = None
        try:
            queued = _message_queue(
                user=user,
                conversation=conversation,
                deployment=deployment,
                content=content,
                limits=limits,
                api_key=api_key,
                history=not created,
                client_id=client_id,
                held=isinstance(verdict, InputCheck),
                tree=tree,
                parent_id=parent_id,
                routing_reason=routed.reason,
                retrieved=retrieved,
            )
        except ClientError as exc:
            refused = exc
        if refused is None and isinstance(verdict, InputCheck):
            kept = True
            sent = SentMessage(conversation, created, queued.user_message, queued.answer, queued.generation)
            return _HeldMessage(
                user=user,
                text=content,
                generations=[queued.generation],
                admissions=[queued.admission],
                tier_id=limits.tier.id,
                sent=sent,
            )
        verdict = verdict_under_tier(verdict, tier_id=limits.tier.id)
        if verdict.blocks:
            raise _Blocked(verdict=verdict, conversation=conversation, parent_id=parent_id)
        if refused is not None:
            raise refused
        kept = True
    finally:  # a charge the answer does not keep (blocked, refused, failed) is given back
        if queued is not None and not kept:
            admission_refund(admission=queued.admission)
    warning = ""
    if verdict.action == "warn":
        flag_create(user=user, message=queued.user_message, source="input", text=content, verdict=verdict)
        warning = verdict.warning()
    return SentMessage(conversation, created, queued.user_message, queued.answer, queued.generation, warning=warning)


@transaction.atomic
def _message_save_blocked(
    *, user: User, content: str, created: bool, blocked: _Blocked, client_id: uuid.UUID | None
) -> SentMessage:
    """A message input moderation blocked, saved flagged with its flag, and no answer. A conversation
    the message was to start is created here: the one its first transaction created was rolled back."""
    conversation = blocked.conversation
    if created:
        # Its deployment as the rolled-back row had it (no read).
        conversation = conversation_create(user=user, deployment=conversation.deployment)
    else:
        # Serialised with the conversation's other sends, as the first transaction was.
        locked = Conversation.objects.select_for_update().filter(id=conversation.id).first()
        if locked is None:  # deleted since: the message has nowhere to go
            raise ClientError("That conversation does not exist.", code="not_found", status=404, param="conversation")
    user_message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.USER,
        content=content,
        status=Message.Status.FLAGGED,
        client_id=client_id,
        parent_id=None if created else blocked.parent_id,
    )
    flag_create(user=user, message=user_message, source="input", text=content, verdict=blocked.verdict)
    if not created:
        Conversation.objects.filter(id=conversation.id).update(updated_at=timezone.now(), active_leaf=user_message)
    return SentMessage(conversation, created, user_message, None, None, blocked_reason=blocked.verdict.explanation())


def held_message_recover(*, generation_id: GenerationId) -> _HeldMessage | None:
    """The held answer a generation writes, for a runner to judge its message itself when the web
    process that saved it never did (`inference.held.held_answer_judge`); None when it answers no
    message (an API completion, whose client went with its web process)."""
    answer = (
        Message.objects.select_related("parent", "conversation__user", "generation")
        .filter(generation_id=generation_id, role=Message.Role.ASSISTANT)
        .first()
    )
    if answer is None or answer.parent is None or answer.generation is None:
        return None
    conversation = answer.conversation
    sent = SentMessage(conversation, False, answer.parent, answer, answer.generation)
    return _HeldMessage(
        user=conversation.user,
        text=answer.parent.content,
        generations=[answer.generation],
        admissions=[],
        tier_id=None,
        sent=sent,
    )


def _message_queue(
    *,
    user: User,
    conversation: Conversation,
    deployment: ModelDeployment,
    content: str,
    limits: RequestLimits,
    api_key: ApiKey | None,
    history: bool,
    client_id: uuid.UUID | None,
    held: bool,
    tree: Tree,
    parent_id: int | None,
    routing_reason: str = "",
    retrieved: Retrieved = NOTHING,
) -> _QueuedAnswer:
    """The user's message saved after `parent_id`, and its answer queued, as if moderation lets it
    through (`held`: shown only once the verdict lets it through, `inference.held`)."""
    tokenizer = tokenizer_for(deployment.model_path)
    new_turn = Turn(role=Message.Role.USER, content=content, token_count=count_tokens(tokenizer, content))
    path = tree.path_to(parent_id) if history else []
    prompt = _prompt_for(
        user_id=conversation.user_id,
        deployment=deployment,
        limits=limits,
        path=path,
        new_turn=new_turn,
        retrieved=retrieved,
    )
    user_message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.USER,
        content=content,
        token_count=new_turn.token_count,
        client_id=client_id,
        parent_id=parent_id,
    )
    user_message.siblings = [*tree.children.get(parent_id, []), user_message.id]
    answer = Message(conversation=conversation, role=Message.Role.ASSISTANT, parent=user_message)
    generation, admission = _answer_queue(
        user=user,
        conversation=conversation,
        deployment=deployment,
        answer=answer,
        api_key=api_key,
        limits=limits,
        prompt=prompt,
        touch_conversation=history,
        held=held,
        routing_reason=routing_reason,
        # A first message with nothing personal in its prompt (no history, instructions or files).
        cacheable=content if not (path or prompt.instructions_kept or not retrieved.empty) else "",
    )
    _citations_save(user_id=conversation.user_id, answer=answer, prompt=prompt, retrieved=retrieved)
    if prompt.needs_summary:
        _memory_extend_after_commit(user_id=user.id, deployment=deployment, path=path, upto=prompt.unsummarized[1])
    return _QueuedAnswer(user_message, answer, generation, admission)


@dataclass
class Regenerated:
    """A regenerated (or continued) answer: a new answer beside the one asked about, or the same
    answer continued, with the generation writing it."""

    answer: Message
    generation: Generation
    # True when this request had been carried out already (`replaces` named a generation that is no
    # longer the newest): this is what it did, and nothing was queued now.
    replayed: bool = False
    siblings: list[int] | None = None


def _answer_get(*, user: User, message_id: Any) -> Message:
    """The user's own answer `message_id`, its conversation locked; 404 for anything else."""
    answer = (
        Message.objects.select_related("conversation__deployment")
        .filter(id=message_id if _is_row_id(message_id) else None, role=Message.Role.ASSISTANT, conversation__user=user)
        .first()
    )
    if answer is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
    Conversation.objects.select_for_update().filter(id=answer.conversation_id).first()
    return answer


def _no_answer_in_progress(conversation: Conversation) -> None:
    if conversation_has_message_in_progress(conversation=conversation):
        raise ClientError(
            "An answer is still being written in this conversation.", code="generation_in_progress", status=409
        )


@transaction.atomic
def message_regenerate(*, user: User, message_id: Any, replaces: Any = None) -> Regenerated:
    """Answer the question of answer `message_id` again: a new answer beside it (a sibling in the
    tree, with its own generation), from the same branch. The old answer stays, one branch of two.

    For an answer that failed (a worker died), was stopped, or that the user did not like.

    `replaces`: the generation of the newest answer to that question the client knows of. When a
    newer one exists, this request was carried out already (sent again after its socket dropped, or
    by another tab at the same moment): that answer is returned, and nothing is queued, so a repeated
    request never generates twice.
    """
    replaces = _uuid_param(replaces, param="replaces")
    answer = _answer_get(user=user, message_id=message_id)
    conversation = answer.conversation
    # Read under the lock: a regenerate that raced this one has added its answer by now.
    answers = Message.objects.filter(
        conversation=conversation, parent_id=answer.parent_id, role=Message.Role.ASSISTANT
    ).order_by("id")
    siblings = list(answers.values_list("id", "generation_id"))
    newest_id, newest_generation = siblings[-1]
    if replaces is not None and newest_generation is not None and newest_generation != replaces:
        newest = Message.objects.select_related("generation").get(id=newest_id)
        return Regenerated(newest, newest.generation, replayed=True, siblings=[i for i, _ in siblings])
    _no_answer_in_progress(conversation)
    tree = message_tree_for_prompt(conversation=conversation)
    path = tree.path_to(answer.parent_id)
    routed = _conversation_route(
        user=user, conversation=conversation, model=None, prompt_tokens=_prompt_measure(path=path, content="")
    )
    limits = request_limits(user=user, deployment=routed.deployment)
    question = tree.by_id.get(answer.parent_id)
    retrieved = (
        _passages_for(user_id=user.id, conversation_id=conversation.id, text=question.content)
        if question is not None and question.content
        else NOTHING
    )
    prompt = _prompt_for(
        user_id=conversation.user_id, deployment=routed.deployment, limits=limits, path=path, retrieved=retrieved
    )
    new = Message(conversation=conversation, role=Message.Role.ASSISTANT, parent_id=answer.parent_id)
    generation, _ = _answer_queue(
        user=user,
        conversation=conversation,
        deployment=routed.deployment,
        answer=new,
        limits=limits,
        prompt=prompt,
        routing_reason=routed.reason,
    )
    _citations_save(user_id=conversation.user_id, answer=new, prompt=prompt, retrieved=retrieved)
    return Regenerated(new, generation, siblings=[*(i for i, _ in siblings), new.id])


@transaction.atomic
def message_continue(*, user: User, message_id: Any, replaces: Any = None) -> Regenerated:
    """Continue answer `message_id`, which stopped at its length limit, in the same message: a new
    generation whose prompt is the branch up to the question followed by the answer so far (no end
    of turn, so the model writes on), whose text is appended to it. It quotes the passages of the
    person's files that the answer's prompt quoted, under the same numbers. Charged as any generation.

    `replaces`: the generation the client shows in the answer. When the answer has moved on from
    it, this request was carried out already, and that is returned; nothing is queued.
    """
    replaces = _uuid_param(replaces, param="replaces")
    answer = _answer_get(user=user, message_id=message_id)
    conversation = answer.conversation
    current = Message.objects.filter(id=answer.id).values_list("generation_id", flat=True).first()
    if replaces is not None and current is not None and current != replaces:
        answer.generation = Generation.objects.get(id=current)
        return Regenerated(answer, answer.generation, replayed=True)
    _no_answer_in_progress(conversation)
    answer.refresh_from_db()
    tree = message_tree_for_prompt(conversation=conversation)
    if answer.finish_reason != "length" or answer.status != Message.Status.COMPLETE or tree.children.get(answer.id):
        raise ClientError(
            "Only the last answer of a branch that stopped at its length limit can be continued.",
            code="not_continuable",
            status=409,
            param="message",
        )
    path = tree.path_to(answer.parent_id)
    routed = _conversation_route(
        user=user,
        conversation=conversation,
        model=None,
        prompt_tokens=_prompt_measure(path=path, content=answer.content),
    )
    limits = request_limits(user=user, deployment=routed.deployment)
    prompt = _prompt_for(
        user_id=conversation.user_id,
        deployment=routed.deployment,
        limits=limits,
        path=path,
        continuing=answer.content,
        retrieved=retrieved_for_answer(owner_id=conversation.user_id, message_id=answer.id),
    )
    generation, _ = _answer_queue(
        user=user,
        conversation=conversation,
        deployment=routed.deployment,
        answer=answer,
        limits=limits,
        prompt=prompt,
        text_before=answer.content,
        routing_reason=routed.reason,
    )
    return Regenerated(answer, generation)


def conversation_branch_select(*, conversation: Conversation, message_id: Any) -> int:
    """Show the branch through `message_id` (its newest leaf) from now on, on every page and for a
    send that names no parent. Returns the leaf's id; a message not in the conversation is a 400."""
    tree = message_tree_for_prompt(conversation=conversation)
    if not _is_row_id(message_id) or message_id not in tree.by_id:
        raise ClientError("That message is not in this conversation.", code="invalid_message", param="message")
    leaf = tree.newest_leaf_under(message_id)
    Conversation.objects.filter(id=conversation.id).update(active_leaf_id=leaf)
    conversation.active_leaf_id = leaf
    return leaf


def message_feedback_set(
    *, user: User, conversation_id: Any, message_id: Any, rating: Any, comment: Any = ""
) -> MessageFeedback:
    """The user's thumbs up or down, with an optional comment, on an answer of their own
    conversation: one per user and answer, replaced when given again. Anything else is a 404."""
    if rating not in MessageFeedback.Rating.values:
        raise ClientError("'rating' must be 'up' or 'down'.", code="invalid_request", param="rating")
    if comment is None:
        comment = ""
    if not isinstance(comment, str) or "\x00" in comment or len(comment) > FEEDBACK_COMMENT_CHARS:
        raise ClientError(
            f"'comment' must be text of at most {FEEDBACK_COMMENT_CHARS} characters.",
            code="invalid_request",
            param="comment",
        )
    conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
    message = None
    if conversation is not None and _is_row_id(message_id):
        message = conversation.messages.filter(id=message_id, role=Message.Role.ASSISTANT).first()
    if message is None:
        raise ClientError("That answer does not exist.", code="not_found", status=404, param="message")
    feedback, _ = MessageFeedback.objects.update_or_create(
        user=user, message=message, defaults={"rating": rating, "comment": comment.strip()}
    )
    return feedback


def _answer_queue(
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
) -> tuple[Generation, Admission]:
    """Pass the plan's gate, queue the answer's generation, and save `answer` pending. `prompt` is
    the one assembled for it. `touch_conversation`: move the conversation to the top of its owner's
    list and make the answer's branch the one shown; a conversation this transaction created has
    only this branch, and the update would be one more round trip on the way to the first token.
    `held`: its text is held until its message's verdict is in. `text_before`: the answer is
    continued, and keeps what it has; its new text goes after it. `cacheable`: the message, when the
    prompt holds nothing personal (a first message without instructions): the deployment's response
    cache may answer it (orchestration.cache)."""
    limits = limits or request_limits(user=user, deployment=deployment, api_key=api_key)
    # Refuse before anything is queued: a full queue first (so it costs no rate-limit budget), then
    # the plan's quotas and rate limits.
    generation_admit(deployment=deployment)
    admission = request_admit(
        user=user,
        api_key=api_key,
        deployment=deployment,
        prompt_tokens=len(prompt.token_ids),
        max_tokens=prompt.max_tokens,
        limits=limits,
    )
    sampling = {
        "temperature": deployment.temperature,
        "top_p": deployment.top_p,
        "repetition_penalty": deployment.repetition_penalty,
        "max_tokens": admission.max_tokens,
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


def _prompt_for(
    *,
    user_id: int,
    deployment: ModelDeployment,
    limits: RequestLimits,
    path: list[Message],
    new_turn: Turn | None = None,
    continuing: str = "",
    retrieved: Retrieved = NOTHING,
) -> AssembledPrompt:
    """The prompt for an answer on a branch: `path` (the branch's messages, root first, up to the
    question or to the answer the new message follows; never another branch's) and `new_turn`, not
    yet saved. `continuing`: an answer's text so far, after the assistant's cue, for the model to
    write on from. The window and the answer's budget are the plan's; flagged messages never go into
    a prompt. `retrieved`: passages of the person's files for the newest question, quoted in the
    system turn as far as the window's policy lets them (`conversations.prompts.context_budget`)."""
    tokenizer = tokenizer_for(deployment.model_path)
    turns = _turns_of(path)
    if new_turn is not None:
        turns.append(new_turn)
    tail = continuation_ids(tokenizer, continuing) if continuing else []
    quoted = passages_quoted(retrieved.passages)
    return assemble_prompt(
        system_prompt=deployment.system_prompt,
        instructions=user_instructions(user_id=user_id),
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages, chat_template=deployment.chat_template) + tail,
        max_context=limits.max_context,
        max_output=limits.max_output,
        min_output=settings.INFERENCE_MIN_OUTPUT_TOKENS,
        # Quoted in the system turn, which the template does not defuse: a file's special-token
        # spellings are broken here, so that no passage can close the turn.
        context=[special_tokens_defused(tokenizer, p) for p in quoted.passages],
        context_header=quoted.header,
        memory=_memory_of(path, turns, max_context=limits.max_context),
    )


def _turns_of(path: list[Message]) -> list[Turn]:
    return [
        Turn(role=m.role, content=m.content, token_count=m.token_count, key=m.id)
        for m in path
        if m.role in (Message.Role.USER, Message.Role.ASSISTANT)
        and m.status != Message.Status.FLAGGED
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


def _memory_extend_after_commit(*, user_id: Any, deployment: ModelDeployment, path: list[Message], upto: int) -> None:
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
    Message.objects.filter(generation=generation, status=Message.Status.PENDING).update(
        status=Message.Status.STREAMING, updated_at=timezone.now()
    )


def message_finish_from_generation(*, generation: Generation) -> None:
    """Copy a finished generation's outcome onto its assistant message (partial text included).

    An answer cut by output moderation ends `stopped` with finish_reason `content_filter`; its
    message is marked flagged and keeps only the text that passed moderation.
    """
    status = _STATUS_FROM_GENERATION[generation.status]
    if generation.finish_reason == CONTENT_FILTER:
        status = Message.Status.FLAGGED
    # A continued answer's text goes after what it had (`text_before`, empty for any other answer).
    Message.objects.filter(generation=generation).update(
        content=Concat(F("text_before"), Value(generation.text), output_field=TextField()),
        status=status,
        token_count=F("token_count") + generation.completion_tokens,
        finish_reason=generation.finish_reason,
        error_code=generation.error_code,
        updated_at=timezone.now(),
    )


# --- titles -------------------------------------------------------------------------------------


def conversation_title_on_finish(*, generation: Generation) -> None:
    """What an ended generation means for its conversation's title (inference's `generation_finished`,
    inside the finish's transaction).

    A title's own generation: its text, cleaned, becomes the title (`_title_apply`). An answer that
    ended with text in a conversation still untitled, and with no title asked for yet: the title is
    asked for once this transaction commits (`conversation_title_request`). Only this answer's
    conversation is read, in one statement that finds nothing for a titled one, on the way to the
    answer's `done`; the request itself is made after the commit."""
    if generation.purpose == Generation.Purpose.TITLE:
        _title_apply(generation=generation)
        return
    if generation.status == Generation.Status.FAILED or not generation.text.strip():
        return
    answer = (
        Message.objects.filter(
            generation_id=generation.id,
            role=Message.Role.ASSISTANT,
            conversation__title="",
            conversation__title_generation__isnull=True,
        )
        .values_list("id", "conversation_id")
        .first()
    )
    if answer is not None:
        answer_id, conversation_id = answer
        transaction.on_commit(
            lambda: conversation_title_request(conversation_id=conversation_id, answer_id=answer_id), robust=True
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
    cut, only punctuation): the first message's first words instead."""
    row = Conversation.objects.filter(title_generation_id=generation.id).values_list("id", "user_id").first()
    if row is None:
        return
    conversation_id, user_id = row
    usable = generation.status == Generation.Status.COMPLETE and generation.finish_reason != CONTENT_FILTER
    title = title_clean(generation.text) if usable else ""
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
        _title_announce(user_id=user_id, conversation_id=conversation_id, title=title)


def _title_announce(*, user_id: int, conversation_id: int, title: str) -> None:
    """Once the caller's transaction commits, tell the owner's open pages (every socket of theirs,
    in whichever process) the conversation's title: the header, the list and the tab follow."""
    event = {"type": "conversation.title", "conversation": conversation_id, "title": title}
    transaction.on_commit(lambda: user_sockets_tell(user_id=user_id, event=event), robust=True)


# --- sharing ------------------------------------------------------------------------------------


def conversation_share(*, conversation: Conversation) -> SharedConversation:
    """A read-only link to a snapshot of the branch on screen now (the one the chat page shows,
    `Tree.active_path`); the link it has, if it has one (revoke it to share a newer snapshot). Its
    token is 256 random bits. Other branches (a question edited away and its answers, the other
    regenerations of an answer) stay out, and so does text that was not shown as the
    conversation's own: messages moderation held back, and answers still being written or without
    text."""
    existing = SharedConversation.objects.filter(conversation=conversation).first()
    if existing is not None:
        return existing
    branch = message_tree_for_prompt(conversation=conversation).active_path(conversation.active_leaf_id)
    snapshot = [{"role": m.role, "content": m.content} for m in branch if _shown_in_share(m)]
    try:
        with transaction.atomic():
            return SharedConversation.objects.create(
                conversation=conversation,
                token=secrets.token_urlsafe(32),
                title=conversation.display_title,
                messages=snapshot,
            )
    except IntegrityError:  # shared at the same moment from another tab: that share is the one
        return SharedConversation.objects.get(conversation=conversation)


def _shown_in_share(message: Message) -> bool:
    if message.role not in (Message.Role.USER, Message.Role.ASSISTANT) or not message.content:
        return False
    if message.is_in_progress:
        return False
    return not (message.role == Message.Role.USER and message.status == Message.Status.FLAGGED)


def conversation_share_revoke(*, conversation: Conversation) -> bool:
    """Take the conversation's shared link down: it answers 404 from now on. False if it had none."""
    deleted, _ = SharedConversation.objects.filter(conversation=conversation).delete()
    return bool(deleted)
