"""Models moved between apps keep their rows: a database as it was before the moves (main's
migrations, rows in every table concerned) migrates in place, and each row is found again through
its model's new home, its relations and content type with it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.topology]

# The migrations as they were before the ledger, citations, summaries, flags' messages and attached
# files moved (None: the app did not exist).
BEFORE = [
    ("accounts", "0010_file_search_and_request_limits"),
    ("inference", "0014_deployment_engine"),
    ("billing", None),
    ("documents", "0003_processing_limits_and_usage"),
    ("moderation", "0003_policy_tier_foreign_key"),
    ("orchestration", "0001_summaries_and_response_cache"),
    ("conversations", "0006_conversation_model_name"),
]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def _seed(apps) -> dict[str, int]:
    """Rows in every table that moves or is rewired, through the models as they were."""
    tier = apps.get_model("accounts", "Tier").objects.get(name="free")
    deployment = apps.get_model("inference", "ModelDeployment").objects.create(name="moved-model", model="x")
    tier.deployments.add(deployment)
    apps.get_model("accounts", "TierModelPrice").objects.create(
        tier=tier, deployment=deployment, prompt_price_per_1k=Decimal("0.123")
    )
    user = apps.get_model("accounts", "User").objects.create(username="moved")
    generation = apps.get_model("inference", "Generation").objects.create(
        user=user, deployment=deployment, status="complete", prompt_token_ids=[1], prompt_tokens=5, completion_tokens=7
    )
    apps.get_model("accounts", "UsageRecord").objects.create(
        user=user, generation=generation, deployment=deployment, tier=tier, status="complete", cost=Decimal("0.5")
    )
    conversation = apps.get_model("conversations", "Conversation").objects.create(user=user, deployment=deployment)
    message = apps.get_model("conversations", "Message")
    question = message.objects.create(conversation=conversation, role="user", content="hello")
    answer = message.objects.create(conversation=conversation, role="assistant", parent=question, generation=generation)
    flag = apps.get_model("moderation", "Flag")
    flag.objects.create(message=question, user=user, source="input", text="hello", action="warn")
    flag.objects.create(message=None, user=user, source="output", text="never saved", action="block")
    document = apps.get_model("documents", "Document").objects.create(
        owner=user, conversation=conversation, name="a.txt", kind="text", size=1, sha256="0", data=b"a"
    )
    apps.get_model("documents", "Citation").objects.create(owner=user, message=answer, document=document, number=1)
    apps.get_model("orchestration", "ConversationSummary").objects.create(
        conversation=conversation, through=answer, status="ready", text="so far"
    )
    return {"user": user.id, "deployment": deployment.id, "question": question.id, "answer": answer.id}


def test_a_database_from_before_the_moves_migrates_in_place_with_its_rows():
    from accounts.models import Tier
    from billing.models import TierModelPrice, UsageRecord
    from conversations.models import Citation, Conversation, ConversationSummary, Message
    from documents.models import Document
    from inference.models import ModelDeployment
    from moderation.models import Flag
    from moderation.selectors import flag_context

    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    _migrate(BEFORE)
    try:
        ids = _seed(MigrationExecutor(connection).loader.project_state([t for t in BEFORE if t[1]]).apps)
    finally:
        _migrate(leaves)

    free, deployment = Tier.objects.get(name="free"), ModelDeployment.objects.get(id=ids["deployment"])
    assert free in deployment.tiers.all() and deployment in free.deployments.all()
    assert TierModelPrice.objects.get(tier=free, deployment=deployment).prompt_price_per_1k == Decimal("0.123")
    record = UsageRecord.objects.get(user_id=ids["user"])
    assert record.cost == Decimal("0.5") and record.generation.usage_record == record
    question, answer = Message.objects.get(id=ids["question"]), Message.objects.get(id=ids["answer"])
    flagged = Flag.objects.get(message=question)
    assert flag_context(flag=flagged).message_id == question.id
    assert Flag.objects.filter(user_id=ids["user"]).count() == 2
    assert Citation.objects.get(message=answer).document.name == "a.txt"
    assert ConversationSummary.objects.get(through=answer).text == "so far"
    document = Document.objects.get(owner_id=ids["user"])
    assert document.conversation_id == question.conversation_id

    # Deleting the conversation still takes what it took before: messages, their flags and citations,
    # its summaries and attached files; the ledger keeps its rows.
    Conversation.objects.filter(id=question.conversation_id).delete()
    assert list(Flag.objects.filter(user_id=ids["user"]).values_list("text", flat=True)) == ["never saved"]
    assert not Citation.objects.exists() and not ConversationSummary.objects.exists()
    assert not Document.objects.filter(owner_id=ids["user"]).exists()
    assert UsageRecord.objects.filter(user_id=ids["user"]).count() == 1
