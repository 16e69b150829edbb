"""What answers and conversations cost, on the chat page and in an answer's `done`: only ever shown
to the conversation's owner, never on a shared copy."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from accounts.models import Tier
from accounts.services import user_set_tier
from billing.models import UsageRecord
from conversations.costs import answer_usage_for_messages, conversation_usage_total, generation_done_costs
from conversations.models import Message
from conversations.requests import SendRequest
from conversations.services import conversation_share, message_send
from tests.accounts.conftest import run_to_end


def _on_pro(user) -> None:
    user_set_tier(user=user, tier=Tier.objects.get(name="pro"))


def _answered(user, *, content="hi", conversation_id=None, prompt_tokens=1000, completion_tokens=2000):
    sent = message_send(user=user, request=SendRequest(content=content, conversation_id=conversation_id))
    run_to_end(sent.generation, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return sent


def test_the_chat_page_shows_each_answers_tokens_and_cost_and_the_conversations_total(client, alice):
    _on_pro(alice)  # 0.0002 prompt, 0.0006 completion per 1,000 tokens
    first = _answered(alice)
    _answered(alice, conversation_id=first.conversation.id, prompt_tokens=3000, completion_tokens=1000)
    client.force_login(alice)
    html = client.get(reverse("conversations:conversation", args=[first.conversation.id])).content.decode()
    answer = re.search(
        rf'<article class="message assistant[^>]*data-message="{first.assistant_message.id}"[^>]*>', html
    )
    assert answer is not None
    tag = answer.group(0)
    assert 'data-usage-prompt="1000"' in tag and 'data-usage-completion="2000"' in tag
    assert 'data-usage-cached="0"' in tag and 'data-usage-cost="$0.0014"' in tag
    # 3,000 + 4,000 tokens; 0.0014 + 0.0012.
    assert '<span id="conversation-usage" class="conversation-usage"' in html
    assert "7,000 tokens · $0.0026</span>" in html
    assert 'id="quota" class="quota quota-compact" data-state="ok"' in html


def test_a_plan_that_does_not_price_tokens_shows_tokens_and_no_cost(client, alice):
    sent = _answered(alice)  # the free plan prices nothing
    client.force_login(alice)
    html = client.get(reverse("conversations:conversation", args=[sent.conversation.id])).content.decode()
    assert 'data-usage-prompt="1000"' in html and 'data-usage-cost=""' in html
    assert "3,000 tokens</span>" in html


def test_another_users_answers_and_conversations_read_as_having_no_usage(alice, mallory):
    _on_pro(alice)
    sent = _answered(alice)
    answer = Message.objects.get(id=sent.assistant_message.id)
    assert answer_usage_for_messages(user=mallory, messages=[answer]) == {}
    assert conversation_usage_total(user=mallory, conversation_id=sent.conversation.id).tokens == 0
    costs = generation_done_costs(user=mallory, generation_id=str(sent.generation.id))
    assert costs["cost"] is None and "conversation_usage" not in costs

    own = generation_done_costs(user=alice, generation_id=str(sent.generation.id))
    assert own["cost"] == {"amount": 0.0014, "currency": "USD", "text": "$0.0014"}
    assert own["conversation_usage"] == {
        "conversation": sent.conversation.id,
        "tokens": 3000,
        "cost": {"amount": 0.0014, "currency": "USD", "text": "$0.0014"},
        "text": "3,000 tokens · $0.0014",
    }
    assert own["quota"]["state"] == "ok" and "tokens left today" in own["quota"]["text"]


def test_a_shared_copy_shows_no_tokens_and_no_costs(client, alice):
    _on_pro(alice)
    sent = _answered(alice)
    share = conversation_share(conversation=sent.conversation)
    html = client.get(reverse("conversations:shared", args=[share.token])).content.decode()
    assert UsageRecord.objects.get().cost > 0
    assert "answer" in html  # the answer itself is there
    for private in ("data-usage", "usage-", "$0.", "tokens", "quota", "costs.js"):
        assert private not in html


def test_the_usage_page_shows_costs_in_the_currency_and_what_is_left_of_the_plan(client, alice, settings):
    Tier.objects.filter(name="free").update(tokens_per_day=5000, tokens_per_month=500_000)
    _answered(alice, prompt_tokens=3000, completion_tokens=1000)
    client.force_login(alice)
    html = client.get(reverse("billing:usage")).content.decode()
    assert "0.000000" not in html
    assert 'id="total-cost">$0.00<' in html
    assert 'data-state="warning" data-period="day"' in html  # 4,000 of 5,000 used
    assert "1,000 of 5,000 tokens left today · resets in" in html
    assert "496,000 of 500,000 tokens left this month" in html
    settings.BILLING_CURRENCY = "CHF"
    html = client.get(reverse("billing:usage")).content.decode()
    assert 'id="total-cost">0.00 CHF<' in html
    statement = client.get(reverse("billing:usage_statement")).content.decode()
    assert statement.splitlines()[0].endswith("cost (CHF)")


@pytest.mark.topology
def test_an_answers_done_reads_its_cost_and_its_conversations_total_in_one_statement(alice, django_assert_num_queries):
    # Every answer's end reads these: the quota's figures (the tier, what is reserved, one sum for
    # every period) and one statement for the answer's row, its conversation and the total.
    _on_pro(alice)  # a day's and a month's quota
    first = _answered(alice)
    sent = _answered(alice, conversation_id=first.conversation.id, prompt_tokens=3000, completion_tokens=1000)
    _answered(alice, content="another conversation")
    with django_assert_num_queries(4):
        costs = generation_done_costs(user=alice, generation_id=str(sent.generation.id))
    assert costs["cost"] == {"amount": 0.0012, "currency": "USD", "text": "$0.0012"}
    assert costs["conversation_usage"] == {
        "conversation": first.conversation.id,
        "tokens": 7000,
        "cost": {"amount": 0.0026, "currency": "USD", "text": "$0.0026"},
        "text": "7,000 tokens · $0.0026",
    }


@pytest.mark.topology
def test_an_answer_not_yet_on_the_ledger_has_no_cost_and_its_conversation_the_others_total(alice):
    _on_pro(alice)
    unanswered = message_send(user=alice, request=SendRequest(content="hi"))
    costs = generation_done_costs(user=alice, generation_id=str(unanswered.generation.id))
    assert costs["cost"] is None
    assert costs["conversation_usage"] == {
        "conversation": unanswered.conversation.id,
        "tokens": 0,
        "cost": None,
        "text": "0 tokens",
    }
    run_to_end(unanswered.generation, prompt_tokens=1000, completion_tokens=2000)
    pending = message_send(user=alice, request=SendRequest(content="again", conversation_id=unanswered.conversation.id))
    costs = generation_done_costs(user=alice, generation_id=str(pending.generation.id))
    assert costs["cost"] is None
    assert costs["conversation_usage"]["tokens"] == 3000
    assert costs["conversation_usage"]["text"] == "3,000 tokens · $0.0014"


def test_an_answer_on_a_plan_that_prices_nothing_has_a_total_and_no_cost(alice):
    sent = _answered(alice)  # the free plan
    costs = generation_done_costs(user=alice, generation_id=str(sent.generation.id))
    assert costs["cost"] is None
    assert costs["conversation_usage"] == {
        "conversation": sent.conversation.id,
        "tokens": 3000,
        "cost": None,
        "text": "3,000 tokens",
    }
