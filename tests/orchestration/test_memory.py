"""Memory for long conversations: turns that fall out of the window are summarized, incrementally, in
the background, and the prompt is system prompt + summary + the newest turns, always within the
window. Driven through message_send with the real tokenizer and a deployment whose window is tiny;
the generations are ended with generation_finish (what a runner calls), so no engine runs."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection

from billing.models import UsageRecord
from billing.selectors import usage_tokens_since
from conversations.models import ConversationSummary, Message
from conversations.prompts import Turn
from conversations.requests import SendRequest
from conversations.services import message_send
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.engine.tokenizers import count_tokens, tokenizer_for
from inference.models import Generation
from inference.selectors import generation_tokens_reserved_for_user
from inference.services import SERVICE_PRIORITY, generation_finish
from orchestration.memory import SUMMARY_HEADING, Memory, prompt_assemble, summary_max_tokens

WINDOW = 512


@pytest.fixture(autouse=True)
def summaries_on(settings):
    settings.CHAT_SUMMARIES = True


@pytest.fixture
def tiny_window(default_deployment):
    default_deployment.max_context = WINDOW
    default_deployment.default_max_tokens = 64
    default_deployment.save()
    return default_deployment


@pytest.fixture
def tokenizer():
    return tokenizer_for(str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"]))


def words(tag: str, n: int = 20) -> str:
    return " ".join(f"{tag}w{j}" for j in range(n))


class Chat:
    """One conversation, sent to and answered the way the service does, its summaries asked for
    after each send commits (only those: no engine runs here)."""

    def __init__(self, user, capture, tokenizer) -> None:
        self.user, self.capture, self.tokenizer = user, capture, tokenizer
        self.conversation_id = None
        self.sent = []

    def send(self, i: int):
        registered = len(connection.run_on_commit)
        sent = message_send(
            user=self.user, request=SendRequest(content=f"Q{i} {words(f'q{i}')}", conversation_id=self.conversation_id)
        )
        # What runs once the send commits (the test's transaction never does): the summary's request.
        for _, callback, robust in connection.run_on_commit[registered:]:
            if "memory_extend_after_commit" in getattr(callback, "__qualname__", ""):
                try:
                    callback()
                except Exception:
                    assert robust  # logged, as Django runs a robust callback, and the send stands
        self.conversation_id = sent.conversation.id
        self.sent.append(sent)
        return sent

    def answer(self, sent, i: int) -> None:
        text = f"A{i} {words(f'a{i}')}"
        generation_finish(
            generation_id=sent.generation.id,
            status="complete",
            text=text,
            finish_reason="stop",
            completion_tokens=count_tokens(self.tokenizer, text),
        )

    def exchange(self, i: int):
        sent = self.send(i)
        self.answer(sent, i)
        return sent

    def prompt_text(self, sent) -> str:
        return self.tokenizer.decode(sent.generation.prompt_token_ids)


def pending_summary(conversation_id) -> ConversationSummary | None:
    return ConversationSummary.objects.filter(conversation_id=conversation_id, status="pending").first()


def summary_write(summary: ConversationSummary, text: str, *, status: str = "complete") -> None:
    generation_finish(generation_id=summary.generation_id, status=status, text=text, finish_reason="stop")


@pytest.fixture
def chat(alice, tiny_window, tokenizer, django_capture_on_commit_callbacks):
    return Chat(alice, django_capture_on_commit_callbacks, tokenizer)


def test_turns_falling_out_of_the_window_are_summarized_and_the_prompt_holds_the_summary_and_the_newest_turns(
    chat, tokenizer
):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
        assert i < 10, "the window never overflowed"
    first = pending_summary(chat.conversation_id)
    # Asked for from the oldest turns on, by a low-priority generation of the service's own.
    summarizing = first.generation
    assert summarizing.purpose == Generation.Purpose.SUMMARY and summarizing.priority == SERVICE_PRIORITY
    assert summarizing.deployment == chat.sent[0].conversation.deployment  # its utility model: itself
    asked = tokenizer.decode(summarizing.prompt_token_ids)
    assert "Q0 q0w0" in asked and "A0 a0w0" in asked
    assert summarizing.sampling["max_tokens"] == summary_max_tokens(WINDOW)
    # Until it is written, the prompt is the sliding window: the oldest turns are gone.
    waiting = chat.exchange(i)
    assert "Q0 q0w0" not in chat.prompt_text(waiting) and SUMMARY_HEADING not in chat.prompt_text(waiting)

    summary_write(first, "The user asked about q0 and q1; the assistant listed words.")
    first.refresh_from_db()
    assert first.status == "ready" and first.through_id is not None

    sent = chat.send(i + 1)
    text = chat.prompt_text(sent)
    assert SUMMARY_HEADING in text and "The user asked about q0 and q1" in text
    assert text.index("You are a helpful assistant.") < text.index(SUMMARY_HEADING) < text.index(f"Q{i + 1} ")
    assert f"Q{i + 1} q{i + 1}w0 " in text and f"q{i + 1}w19" in text  # the newest message, whole
    assert f"Q{i} q{i}w0" in text and f"A{i} a{i}w0" in text  # and the turns before it, verbatim
    assert "Q0 q0w0" not in text  # the summarized ones only in the summary
    assert len(sent.generation.prompt_token_ids) + sent.generation.sampling["max_tokens"] <= WINDOW


def test_the_summary_grows_incrementally_from_the_old_summary_and_the_new_turns_only(chat, tokenizer):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    first = pending_summary(chat.conversation_id)
    summary_write(first, "SUMMARY-ONE covers the first questions.")
    first.refresh_from_db()
    first_covered = set(Message.objects.filter(id__lte=first.through_id).values_list("content", flat=True))

    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
        assert i < 20, "the window never overflowed again"
    second = pending_summary(chat.conversation_id)
    assert second.previous == first and second.through_id > first.through_id
    asked = tokenizer.decode(second.generation.prompt_token_ids)
    assert "SUMMARY-ONE covers the first questions." in asked
    # The turns the first summary covers are not sent again: only those that fell out since.
    for content in first_covered:
        assert content.split()[0] + " " + content.split()[1] not in asked
    newly = Message.objects.filter(id__gt=first.through_id, id__lte=second.through_id).order_by("id")
    assert newly.exists()
    for message in newly:
        assert " ".join(message.content.split()[:2]) in asked

    summary_write(second, "SUMMARY-TWO extends SUMMARY-ONE.")
    sent = chat.send(i)
    text = chat.prompt_text(sent)
    assert "SUMMARY-TWO extends SUMMARY-ONE." in text and "SUMMARY-ONE covers" not in text
    assert len(sent.generation.prompt_token_ids) + sent.generation.sampling["max_tokens"] <= WINDOW


def test_a_failed_summary_falls_back_to_the_sliding_window_without_failing_the_message(chat):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    summary = pending_summary(chat.conversation_id)
    summary_write(summary, "", status="failed")
    summary.refresh_from_db()
    assert summary.status == "failed"

    sent = chat.send(i)
    assert sent.generation.status == Generation.Status.QUEUED
    assert sent.assistant_message.status == Message.Status.PENDING
    text = chat.prompt_text(sent)
    assert SUMMARY_HEADING not in text and f"Q{i} q{i}w0 " in text and f"q{i}w19" in text
    assert len(sent.generation.prompt_token_ids) + sent.generation.sampling["max_tokens"] <= WINDOW
    # And a new summary is asked for, from the turns the failed one was to cover.
    again = pending_summary(chat.conversation_id)
    assert again is not None and again.previous is None


def test_a_summary_that_cannot_be_asked_for_does_not_fail_the_message(chat, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("the utility model is gone")

    monkeypatch.setattr("conversations.services.answering.summary_extend", broken)
    i = 0
    for i in range(6):
        sent = chat.exchange(i)
    assert sent.generation.prompt_token_ids and not ConversationSummary.objects.exists()
    assert Message.objects.filter(status="complete").count() == 12


def test_a_summary_cut_by_output_moderation_is_not_used(chat):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    summary = pending_summary(chat.conversation_id)
    generation_finish(generation_id=summary.generation_id, status="stopped", text="Bad", finish_reason="content_filter")
    summary.refresh_from_db()
    assert summary.status == "failed" and summary.text == ""


def test_the_house_pays_for_summaries_and_the_ledger_records_them(chat, alice):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    summary = pending_summary(chat.conversation_id)
    assert generation_tokens_reserved_for_user(user=alice) == 0  # queued, reserving nothing of the quota
    used = usage_tokens_since(user=alice, since=summary.created_at.replace(year=2000))
    generation_finish(
        generation_id=summary.generation_id, status="complete", text="Short.", finish_reason="stop", completion_tokens=3
    )
    row = UsageRecord.objects.get(generation_id=summary.generation_id)
    assert row.kind == UsageRecord.Kind.SUMMARY and row.cost == 0
    assert usage_tokens_since(user=alice, since=summary.created_at.replace(year=2000)) == used


def test_a_summary_serves_only_the_branch_it_was_written_on(chat, tokenizer):
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    summary_write(pending_summary(chat.conversation_id), "SUMMARY OF THE FIRST BRANCH.")
    # An edit of the first message starts a branch of its own, which the summary does not cover.
    with chat.capture():
        edit = message_send(
            user=chat.user,
            request=SendRequest(content="A different start", conversation_id=chat.conversation_id, parent=None),
        )
    assert "SUMMARY OF THE FIRST BRANCH." not in tokenizer.decode(edit.generation.prompt_token_ids)


def test_the_policy_keeps_everything_within_the_window_with_a_context_block(tokenizer):
    from inference.engine.tokenizers import render_chat

    turns = [
        Turn(role=("user", "assistant")[k % 2], content=f"turn {k} " + words(f"t{k}"), token_count=90, key=k)
        for k in range(11)
    ]
    prompt = prompt_assemble(
        system_prompt="You are a helpful assistant.",
        turns=turns,
        render=lambda messages: render_chat(tokenizer, messages),
        max_context=WINDOW,
        max_output=64,
        min_output=16,
        context=["Quoted material: the documents say hello."],
        memory=Memory(text="Earlier they said hello.", covers=4),
    )
    text = tokenizer.decode(prompt.token_ids)
    assert prompt.summary_kept and prompt.context_kept
    assert "Quoted material" in text and "Earlier they said hello." in text
    assert "turn 3 " not in text  # covered by the summary, never verbatim
    assert len(prompt.token_ids) + prompt.max_tokens <= WINDOW
    assert prompt.unsummarized == ((4, prompt.turns_dropped) if prompt.turns_dropped > 4 else (0, 0))


def test_summaries_can_be_switched_off(chat, settings):
    settings.CHAT_SUMMARIES = False
    for i in range(6):
        chat.exchange(i)
    assert not ConversationSummary.objects.exists()
    assert settings.CHAT_SUMMARIES is False


def test_the_conversations_api_returns_the_summary_of_the_branch(chat, alice):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(alice)
    i = 0
    while pending_summary(chat.conversation_id) is None:
        chat.exchange(i)
        i += 1
    url = f"/api/conversations/{chat.conversation_id}/"
    assert client.get(url).json()["summary"] is None  # not written yet
    summary = pending_summary(chat.conversation_id)
    summary_write(summary, "They talked about q0.")
    body = client.get(url).json()
    assert body["summary"]["text"] == "They talked about q0."
    assert body["summary"]["through"] == summary.through_id
    assert summary.through_id in [m["id"] for m in body["messages"]]
