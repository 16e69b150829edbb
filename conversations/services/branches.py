from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from accounts.models import User
from accounts.services import (
    request_limits,
)
from chatsite.errors import ClientError
from conversations.citations import retrieved_for_answer
from conversations.models import Conversation, Message
from conversations.requests import AnswerRequest
from conversations.selectors import (
    conversation_has_message_in_progress,
    message_tree_for_prompt,
)
from conversations.services.answering import answer_queue, citations_save, passages_for, prompt_for
from conversations.services.conversations import conversation_route, prompt_measure
from documents.retrieval import NOTHING
from inference.models import Generation

logger = logging.getLogger(__name__)


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


def _answer_get(*, user: User, message_id: int) -> Message:
    """The user's own answer `request.message_id`, its conversation locked; 404 for anything else."""
    answer = (
        Message.objects.select_related("conversation__deployment")
        .filter(id=message_id, role=Message.Role.ASSISTANT, conversation__user=user)
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
def message_regenerate(*, user: User, request: AnswerRequest) -> Regenerated:
    """Answer the question of answer `request.message_id` again: a new answer beside it (a sibling in the
    tree, with its own generation), from the same branch. The old answer stays, one branch of two.

    For an answer that failed (a worker died), was stopped, or that the user did not like.

    `request.replaces`: the generation of the newest answer to that question the client knows of. When a
    newer one exists, this request was carried out already (sent again after its socket dropped, or
    by another tab at the same moment): that answer is returned, and nothing is queued, so a repeated
    request never generates twice. While the answer asked about is itself the newest, it is answered
    again whatever generation the client names (one continued since writes it now).
    """
    replaces = request.replaces
    answer = _answer_get(user=user, message_id=request.message_id)
    conversation = answer.conversation
    # Read under the lock: a regenerate that raced this one has added its answer by now.
    answers = Message.objects.filter(
        conversation=conversation, parent_id=answer.parent_id, role=Message.Role.ASSISTANT
    ).order_by("id")
    siblings = list(answers.values_list("id", "generation_id"))
    newest_id, newest_generation = siblings[-1]
    # Carried out already only when a newer answer than this one exists: this answer's own
    # generation changes when it is continued, and a continuation is not a regeneration.
    if replaces is not None and newest_id != answer.id and newest_generation not in (None, replaces):
        newest = Message.objects.select_related("generation__deployment").get(id=newest_id)
        assert newest.generation is not None  # it has one: `newest_generation`
        return Regenerated(newest, newest.generation, replayed=True, siblings=[i for i, _ in siblings])
    _no_answer_in_progress(conversation)
    tree = message_tree_for_prompt(conversation=conversation)
    path = tree.path_to(answer.parent_id)
    routed = conversation_route(
        user=user,
        conversation=conversation,
        model=request.model,
        prompt_tokens=prompt_measure(path=path, content=""),
        switch=False,
    )
    limits = request_limits(user=user, deployment=routed.deployment)
    question = tree.by_id.get(answer.parent_id) if answer.parent_id is not None else None
    retrieved = (
        passages_for(user_id=user.id, conversation_id=conversation.id, text=question.content)
        if question is not None and question.content
        else NOTHING
    )
    prompt = prompt_for(
        user_id=conversation.user_id,
        deployment=routed.deployment,
        limits=limits,
        path=path,
        retrieved=retrieved,
        conversation_prompt=conversation.system_prompt,
        project_id=conversation.project_id,
    )
    new = Message(conversation=conversation, role=Message.Role.ASSISTANT, parent_id=answer.parent_id)
    generation, _ = answer_queue(
        user=user,
        conversation=conversation,
        deployment=routed.deployment,
        answer=new,
        limits=limits,
        prompt=prompt,
        routing_reason=routed.reason,
    )
    citations_save(user_id=conversation.user_id, answer=new, prompt=prompt, retrieved=retrieved)
    return Regenerated(new, generation, siblings=[*(i for i, _ in siblings), new.id])


@transaction.atomic
def message_continue(*, user: User, request: AnswerRequest) -> Regenerated:
    """Continue answer `request.message_id`, which stopped at its length limit, in the same message: a new
    generation whose prompt is the branch up to the question followed by the answer so far (no end
    of turn, so the model writes on), whose text is appended to it. It quotes the passages of the
    person's files that the answer's prompt quoted, under the same numbers. Charged as any generation.

    `request.replaces`: the generation the client shows in the answer. When the answer has moved on from
    it, this request was carried out already, and that is returned; nothing is queued.
    """
    replaces = request.replaces
    answer = _answer_get(user=user, message_id=request.message_id)
    conversation = answer.conversation
    current = Message.objects.filter(id=answer.id).values_list("generation_id", flat=True).first()
    if replaces is not None and current is not None and current != replaces:
        answer.generation = Generation.objects.select_related("deployment").get(id=current)
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
    routed = conversation_route(
        user=user,
        conversation=conversation,
        model=None,
        prompt_tokens=prompt_measure(path=path, content=answer.content),
    )
    limits = request_limits(user=user, deployment=routed.deployment)
    prompt = prompt_for(
        user_id=conversation.user_id,
        deployment=routed.deployment,
        limits=limits,
        path=path,
        continuing=answer.content,
        retrieved=retrieved_for_answer(owner_id=conversation.user_id, message_id=answer.id),
        conversation_prompt=conversation.system_prompt,
        project_id=conversation.project_id,
    )
    generation, _ = answer_queue(
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
