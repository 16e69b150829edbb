from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiKey, User
from accounts.services import (
    Admission,
    RequestLimits,
    admission_refund,
    request_limits,
    request_size_check,
)
from chatsite.database import DatabaseCall
from chatsite.errors import ClientError
from conversations.branches import Tree
from conversations.images import (
    AttachedImage,
    content_with_image_text,
    image_block,
    message_images_link,
    message_images_resolve,
    text_with_images,
)
from conversations.models import Conversation, Message, MessageImage
from conversations.prompts import Turn
from conversations.requests import ACTIVE_BRANCH, Parent, SendRequest
from conversations.selectors import (
    conversation_get_for_send,
    conversation_has_message_in_progress,
    default_model_for_project,
    default_model_for_user,
    message_tree_for_prompt,
    project_get_for_user,
)
from conversations.services.answering import (
    answer_queue,
    citations_save,
    memory_extend_after_commit,
    passages_for,
    prompt_for,
)
from conversations.services.conversations import (
    conversation_create,
    conversation_route,
    model_name_stored,
    prompt_measure,
)
from documents.retrieval import (
    NOTHING,
    Retrieved,
)
from inference.engine.tokenizers import (
    count_tokens,
    tokenizer_for,
)
from inference.held import HeldAnswer, held_verdict_wait_sync, with_input_check
from inference.models import Generation, GenerationId, ModelDeployment
from inference.openai.tools import tool_sampling, tools_in_prompt
from moderation.models import Flag
from moderation.services import (
    InputCheck,
    Verdict,
    flag_create,
    input_moderate,
    verdict_of_flag,
)
from orchestration.routing import route
from orchestration.tools.loop import LoopLimits, ToolPlan, tool_plan_for

logger = logging.getLogger(__name__)


# What a message held back by moderation says when the verdict that held it is gone.
HELD_BACK = "This message wasn't sent to the assistant: an automatic safety check held it back."


@dataclass(frozen=True)
class SentMessage:
    """What `message_send` did. A message held back by moderation has no answer and no generation.

    `pending`: the verdict on the message is still to be taken (its scores were not in when the
    transaction had done everything else); the answer is committed held, and what the send did is
    known only once the caller has settled it (`settled`, or `message_send_checked` from async
    code)."""

    conversation: Conversation
    conversation_created: bool
    user_message: Message
    assistant_message: Message | None
    generation: Generation | None
    blocked_reason: str = ""
    warning: str = ""
    # True when the message had been sent before (its `client_id`) and this is what that send saved.
    replayed: bool = False
    pending: HeldMessage | None = None
    # The ids of the message and of those beside it (edits of one another), oldest first.
    siblings: tuple[int, ...] = ()
    # The tools the answer is offered, when it runs the tool loop (orchestration.tools.loop).
    tools: ToolPlan | None = None

    @property
    def blocked(self) -> bool:
        return self.generation is None

    def settled(self, check: InputCheck) -> SentMessage:
        """What the send did, its pending verdict (if any) taken now from `check`, waiting for its
        scores: for sync callers."""
        return self.pending.settle(check) if self.pending is not None else self


def message_send(
    *,
    user: User,
    request: SendRequest,
    api_key: ApiKey | None = None,
    check: InputCheck | None = None,
    run_tools: bool = False,
) -> SentMessage:
    """Save the user's message and a pending answer, and queue the answer's generation.

    All or nothing: a refused message (too long for the window, a conversation already answering,
    a model the plan does not include, a rate limit or quota reached, a full queue) leaves no rows
    behind. The generation is dispatched only after the transaction commits. A message input
    moderation blocks is saved as flagged, with its flag, and gets no answer.

    `check` is input moderation's check of the message, its verdict taken here under the tier the
    transaction reads (the chat socket and the send API make one whose scoring begins only when
    asked, `InputCheck.deferred`); without one, the message is classified here, before the
    transaction.

    A check whose scores are not in when the transaction has done everything else does not hold
    the transaction up: the answer is committed held (`generation_create(awaiting_verdict=True)`)
    and dispatched, so the engine starts on it while the message is scored, and the send returns
    with its verdict `pending`. The runner shows none of a held answer until the verdict lets it
    through; a verdict that blocks takes the answer back (never shown, never charged) and keeps the
    message flagged, so what settling returns is what this would have returned had the verdict come
    first (`inference.held`). An async caller awaits the scores on its event loop and settles in a
    call of its own (`message_send_checked`), so that no database thread waits for the scores.

    `request.client_id` is the sender's own id for the message: a message is saved once per id. A
    send whose id the user has sent before saves nothing and returns what the first send saved
    (`replayed`), so a client whose connection dropped before it heard whether its message arrived
    can send it again. `run_tools`: the caller drives the answer's tool loop (the chat socket), so the
    answer is offered the conversation's tools; a caller that cannot refuses a message that asks for
    a tool. `request.retry` says it may have been sent before, and the id is looked up
    first; a first send skips that look-up (one round trip fewer before the first token), and the
    unique constraint on the id still catches one that arrives twice.

    `request.parent`: the message the new one follows, in the conversation's tree
    (conversations.branches): an answer, or a message moderation held back; None to start a new
    branch from the beginning (an edit of the first message); ACTIVE_BRANCH, the leaf of the branch
    on screen. A new message beside one sent before is an edit: the old branch stays. Its prompt is
    that branch alone, root to `parent`.
    """
    client_id, conversation_id = request.client_id, request.conversation_id
    if request.tool is not None and not run_tools:
        raise ClientError("Tools run in the chat page's conversations.", code="tool_unavailable", param="tool")
    if request.retry and client_id is not None:
        earlier = _message_sent_earlier(user=user, client_id=client_id, conversation_id=conversation_id)
        if earlier is not None:
            return earlier
    # The user's own images, read (their text known) before anything is saved; a clear refusal otherwise.
    images = message_images_resolve(user=user, ids=request.images)
    if check is None:
        # Classified before the transaction opens, so no lock is held while the classifier runs.
        check = InputCheck.decided(input_moderate(user=user, text=text_with_images(request.content, images)))
    # Before the transaction too: the search reads only the user's own files, whatever the id names.
    retrieved = passages_for(
        user_id=user.id, conversation_id=conversation_id, project_id=request.project_id, text=request.content
    )
    try:
        return _message_save(
            user=user,
            request=request,
            check=check,
            api_key=api_key,
            retrieved=retrieved,
            images=images,
            run_tools=run_tools,
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


async def message_send_checked(
    call: DatabaseCall, *, user: User, request: SendRequest, api_key: ApiKey | None = None, run_tools: bool = False
) -> SentMessage:
    """`message_send` from async code (the chat socket, the send API), through `call` (how the
    caller reaches the database from its loop), with input moderation's check of the message
    scored after the commit and its pending verdict settled.

    The scores are awaited here, on the event loop: a send that waited for them itself would hold a
    database thread meanwhile (on SQLite the process's only one, which the answer's own claim
    needs). Both database calls run to their end even if the caller is cancelled (its socket
    closed), so committed work is always released or withdrawn."""

    async def send(check: InputCheck) -> SentMessage:
        sent = await call(message_send)(user=user, request=request, api_key=api_key, check=check, run_tools=run_tools)
        return sent if sent.pending is None else await sent.pending.settled(call, check)

    # What the message's images say is judged with it.
    images = await call(message_images_resolve)(user=user, ids=request.images) if request.images else []
    return await with_input_check(text_with_images(request.content, images), send)


def _parent_resolve(*, tree: Tree, conversation: Conversation, parent: Parent) -> int | None:
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


def _message_sent_earlier(*, user: User, client_id: uuid.UUID, conversation_id: int | None) -> SentMessage | None:
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
    generation = answer.generation if answer is not None else None
    if generation is not None and generation.awaiting_verdict:
        # The first send is still judging the message: answer with what its verdict makes of it.
        held_verdict_wait_sync(generation_id=generation.id)
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
    siblings: tuple[int, ...]
    answer: Message
    generation: Generation
    admission: Admission
    tools: ToolPlan | None = None

    def sent(self, conversation: Conversation, created: bool) -> SentMessage:
        return SentMessage(
            conversation,
            created,
            self.user_message,
            self.answer,
            self.generation,
            siblings=self.siblings,
            tools=self.tools,
        )


@dataclass(frozen=True)
class HeldMessage(HeldAnswer[SentMessage]):
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
        return replace(self.sent, assistant_message=None, generation=None, blocked_reason=verdict.explanation())


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
    request: SendRequest,
    check: InputCheck,
    api_key: ApiKey | None,
    retrieved: Retrieved,
    images: list[AttachedImage],
    run_tools: bool = False,
) -> SentMessage:
    # What an allowed message needs (its prompt, its rows, its generation and its charge on the rate
    # limits) does not depend on the verdict, so it is done while the scores may still be coming. A
    # blocked message rolls all of it back (the dispatch registered in it goes too) and is saved
    # flagged in a second transaction: the rare path pays for the block, instead of every send paying
    # a savepoint's two round trips on the way to its first token.
    try:
        return _message_save_allowed(
            user=user,
            request=request,
            check=check,
            api_key=api_key,
            retrieved=retrieved,
            images=images,
            run_tools=run_tools,
        )
    except _Blocked as blocked:
        return _message_save_blocked(user=user, request=request, blocked=blocked, images=images)


@transaction.atomic
def _message_save_allowed(
    *,
    user: User,
    request: SendRequest,
    check: InputCheck,
    api_key: ApiKey | None,
    retrieved: Retrieved,
    images: list[AttachedImage],
    run_tools: bool = False,
) -> SentMessage:
    """The message saved and its answer queued; raises `_Blocked` (after giving its charge back) when
    the verdict blocks it. A refusal (too long for the window, a limit reached) waits for the verdict
    as well: a message moderation blocks is kept flagged whatever else is wrong with it. Scores not in
    yet hold the answer instead of the transaction: it is committed held, and returned with its
    verdict pending, to be taken after the commit while the engine starts on it."""
    content = request.content
    created = request.conversation_id is None
    if request.conversation_id is None:
        project = None
        if request.project_id is not None:
            project = project_get_for_user(user=user, project_id=request.project_id)
            if project is None:
                raise ClientError("That project does not exist.", code="not_found", status=404, param="project")
        asked = request.model or (
            default_model_for_project(user=user, project=project) if project else default_model_for_user(user=user)
        )
        # With its queue's length, read in the same statement for generation_admit.
        routed = route(user=user, model=asked, prompt_tokens=prompt_measure(path=[], content=content))
        deployment = routed.deployment
        # Untitled: the title is written once an answer has ended (conversation_title_request), so
        # a message moderation holds back never names the conversation.
        conversation = conversation_create(
            user=user,
            deployment=deployment,
            model_name=model_name_stored(asked, deployment),
            project_id=project.id if project else None,
        )
        tree = Tree.of([])
        parent_id = _parent_resolve(tree=tree, conversation=conversation, parent=request.parent)
    else:
        # Locked: sends into one conversation are serialised.
        found = conversation_get_for_send(user=user, conversation_id=request.conversation_id)
        if found is None:
            raise ClientError("That conversation does not exist.", code="not_found", status=404, param="conversation")
        conversation = found
        if conversation_has_message_in_progress(conversation=conversation):
            raise ClientError(
                "An answer is still being written in this conversation. Wait for it or stop it first.",
                code="generation_in_progress",
                status=409,
            )
        # Every branch, to find the one the message goes on.
        tree = message_tree_for_prompt(conversation=conversation)
        parent_id = _parent_resolve(tree=tree, conversation=conversation, parent=request.parent)
        # The model switches when `model` names another, and its gate comes next (`request_limits`
        # refuses a model the plan excludes): a refused send rolls the switch back.
        routed = conversation_route(
            user=user,
            conversation=conversation,
            model=request.model,
            prompt_tokens=prompt_measure(path=tree.path_to(parent_id), content=content),
        )
        deployment = routed.deployment

    # The plan first: a model it does not include is refused before anything is loaded for it.
    limits = request_limits(user=user, deployment=deployment, api_key=api_key)
    # Before the message is tokenized or its verdict asked for (which starts the scoring): a message
    # that cannot fit is refused unsaved, unscored and uncharged.
    request_size_check(chars=len(content), limits=limits)
    if request.tools is not None and request.tools != conversation.tools_enabled:
        conversation.tools_enabled = request.tools
        Conversation.objects.filter(id=conversation.id).update(tools_enabled=request.tools)
    plan = None
    if run_tools:
        plan = tool_plan_for(
            deployment_id=deployment.id,
            tool_parser=deployment.tool_parser,
            tier_id=limits.tier.id,
            enabled=conversation.tools_enabled,
            forced=request.tool,
        )
    verdict = check.verdict_if_scored(tier_id=limits.tier.id)
    queued: _QueuedAnswer | None = None
    kept = False
    try:
        refused = None
        try:
            queued = _message_queue(
                user=user,
                conversation=conversation,
                deployment=deployment,
                request=request,
                limits=limits,
                api_key=api_key,
                history=not created,
                held=verdict is None,
                tree=tree,
                parent_id=parent_id,
                routing_reason=routed.reason,
                retrieved=retrieved,
                images=images,
                plan=plan,
            )
        except ClientError as exc:
            refused = exc
        if queued is not None and verdict is None:
            kept = True
            sent = queued.sent(conversation, created)
            held = HeldMessage(
                user=user,
                text=text_with_images(content, images),
                generations=[queued.generation],
                admissions=[queued.admission],
                tier_id=limits.tier.id,
                sent=sent,
            )
            return replace(sent, pending=held)
        verdict = verdict or check.verdict(tier_id=limits.tier.id)
        if verdict.blocks:
            raise _Blocked(verdict=verdict, conversation=conversation, parent_id=parent_id)
        if refused is not None or queued is None:
            raise refused or RuntimeError("a send neither queued nor refused")
        kept = True
    finally:  # a charge the answer does not keep (blocked, refused, failed) is given back
        if queued is not None and not kept:
            admission_refund(admission=queued.admission)
    warning = ""
    if verdict.action == "warn":
        flag_create(user=user, message=queued.user_message, source="input", text=content, verdict=verdict)
        warning = verdict.warning()
    return replace(queued.sent(conversation, created), warning=warning)


@transaction.atomic
def _message_save_blocked(
    *, user: User, request: SendRequest, blocked: _Blocked, images: list[AttachedImage]
) -> SentMessage:
    """A message input moderation blocked, saved flagged with its flag, and no answer. A conversation
    the message was to start is created here: the one its first transaction created was rolled back."""
    conversation, content = blocked.conversation, request.content
    created = request.conversation_id is None
    if created:
        # Its deployment as the rolled-back row had it (no read).
        conversation = conversation_create(
            user=user, deployment=conversation.deployment, project_id=conversation.project_id
        )
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
        client_id=request.client_id,
        parent_id=None if created else blocked.parent_id,
        image_count=len(images),
    )
    message_images_link(message=user_message, images=images, sent_as=MessageImage.SentAs.TEXT)
    flag_create(
        user=user, message=user_message, source="input", text=text_with_images(content, images), verdict=blocked.verdict
    )
    if not created:
        Conversation.objects.filter(id=conversation.id).update(updated_at=timezone.now(), active_leaf=user_message)
    return SentMessage(conversation, created, user_message, None, None, blocked_reason=blocked.verdict.explanation())


def held_message_recover(*, generation_id: GenerationId) -> HeldMessage | None:
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
    return HeldMessage(
        user=conversation.user,
        text=answer.parent.content,
        generations=[answer.generation],
        admissions=[],
        tier_id=None,
        sent=sent,
    )


def _has_settings(conversation: Conversation) -> bool:
    return bool(conversation.system_prompt) or conversation.temperature is not None


def _message_queue(
    *,
    user: User,
    conversation: Conversation,
    deployment: ModelDeployment,
    request: SendRequest,
    limits: RequestLimits,
    api_key: ApiKey | None,
    history: bool,
    held: bool,
    tree: Tree,
    parent_id: int | None,
    routing_reason: str = "",
    retrieved: Retrieved = NOTHING,
    images: list[AttachedImage] | None = None,
    plan: ToolPlan | None = None,
) -> _QueuedAnswer:
    """The user's message saved after `parent_id`, and its answer queued, as if moderation lets it
    through (`held`: shown only once the verdict lets it through, `inference.held`).

    Its `images` go to a vision deployment as images (each held against the window at the
    deployment's `image_tokens` until the engine counts it), to any other as the text OCR read in
    them, said to be that (`conversations.images.image_block`)."""
    content = request.content
    images = images or []
    tokenizer = tokenizer_for(deployment.model_path)
    seen = bool(images) and deployment.accepts_images
    turn_text = content_with_image_text(
        content,
        [] if seen else [image_block(name=i.name, ocr_text=i.ocr_text, confidence=i.ocr_confidence) for i in images],
    )
    new_turn = Turn(
        role=Message.Role.USER,
        content=turn_text,
        token_count=count_tokens(tokenizer, turn_text),
        images=len(images) if seen else 0,
    )
    if seen:
        limits = replace(limits, max_context=limits.max_context - len(images) * deployment.image_tokens)
    path = tree.path_to(parent_id) if history else []
    tool_request = plan.request(model=deployment.name, step=1, limits=LoopLimits.from_settings()) if plan else None
    prompt = prompt_for(
        user_id=conversation.user_id,
        deployment=deployment,
        limits=limits,
        path=path,
        new_turn=new_turn,
        retrieved=retrieved,
        conversation_prompt=conversation.system_prompt,
        project_id=conversation.project_id,
        tools=tools_in_prompt(tool_request) if tool_request else None,
    )
    user_message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.USER,
        content=content,
        token_count=new_turn.token_count,
        client_id=request.client_id,
        parent_id=parent_id,
        image_count=len(images),
    )
    if images:
        sent_as = MessageImage.SentAs.IMAGE if seen else MessageImage.SentAs.TEXT
        message_images_link(message=user_message, images=images, sent_as=sent_as)
    siblings = (*tree.children.get(parent_id, []), user_message.id)
    answer = Message(conversation=conversation, role=Message.Role.ASSISTANT, parent=user_message)
    generation, admission = answer_queue(
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
        images=[image.prompt_image() for image in images] if seen else [],
        tool_sampling=tool_sampling(tool_request, deployment=deployment) if tool_request else None,
        tool_request=tool_request,
        # A first message with nothing personal in its prompt or sampling (no history, instructions,
        # project, conversation settings or files).
        cacheable=content
        if not (
            path
            or prompt.instructions_kept
            or prompt.project_instructions_kept
            or _has_settings(conversation)
            or not retrieved.empty
            or images
            or plan is not None
        )
        else "",
    )
    citations_save(user_id=conversation.user_id, answer=answer, prompt=prompt, retrieved=retrieved)
    if prompt.needs_summary:
        memory_extend_after_commit(user_id=user.id, deployment=deployment, path=path, upto=prompt.unsummarized[1])
    return _QueuedAnswer(user_message, siblings, answer, generation, admission, tools=plan)
