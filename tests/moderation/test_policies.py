"""Moderation policies: one per tier (a foreign key to the tier), one global, edited in the admin."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from accounts.models import Tier
from accounts.selectors import tier_for_user
from accounts.services import user_set_tier
from moderation.models import ModerationPolicy
from moderation.selectors import POLICY_VERSION_KEY, policy_for_user


def test_one_active_policy_per_tier_and_one_global(db, make_policy):
    make_policy({}, name="global")
    make_policy({}, tier_name="pro", name="pro")
    with pytest.raises(IntegrityError), transaction.atomic():
        ModerationPolicy.objects.create(name="a second global")
    with pytest.raises(IntegrityError), transaction.atomic():
        ModerationPolicy.objects.create(name="a second pro", tier=Tier.objects.get(name="pro"))
    # Inactive drafts are allowed beside the active ones.
    ModerationPolicy.objects.create(name="pro draft", tier=Tier.objects.get(name="pro"), is_active=False)


def test_a_policy_follows_its_tier_through_a_rename(alice, make_policy):
    make_policy({"illicit": (0.9, "warn")}, tier_name="pro", name="pro policy")
    pro = Tier.objects.get(name="pro")
    user_set_tier(user=alice, tier=pro)
    pro.name = "professional"
    pro.save()
    assert policy_for_user(user=alice).name == "pro policy"


def test_the_admin_offers_tiers_to_choose_from(admin_client):
    response = admin_client.get("/admin/moderation/moderationpolicy/add/")
    assert response.status_code == 200
    assert b'name="tier"' in response.content
    assert f'value="{Tier.objects.get(name="enterprise").id}"'.encode() in response.content


@pytest.mark.django_db(transaction=True)
def test_the_migration_points_named_tier_policies_at_their_tiers(latest_schema_after):
    before = [("moderation", "0002_default_policy_and_moderators")]
    after = [("moderation", "0003_policy_tier_foreign_key")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("moderation", "ModerationPolicy")
    old.objects.create(name="for pro", tier_name="pro")
    old.objects.create(name="for a tier that does not exist", tier_name="gold")
    old.objects.create(name="a global draft", tier_name="", is_active=False)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)

    assert ModerationPolicy.objects.get(name="for pro").tier == Tier.objects.get(name="pro")
    assert ModerationPolicy.objects.get(name="for pro").is_active
    orphan = ModerationPolicy.objects.get(name="for a tier that does not exist")
    assert orphan.tier is None and not orphan.is_active
    assert ModerationPolicy.objects.get(name="a global draft").tier is None


def test_a_policy_is_read_from_the_cache_until_it_changes(alice, make_policy, django_assert_num_queries):
    policy = make_policy({"illicit": (0.9, "warn")}, name="global")
    assert policy_for_user(user=alice).rules["illicit"] == (0.9, "warn")
    with django_assert_num_queries(1):  # the user's tier, read fresh; the policy and its rules cached
        assert policy_for_user(user=alice).rules["illicit"] == (0.9, "warn")

    rule = policy.rules.get(category="illicit")
    rule.threshold = 0.5
    rule.save()
    assert policy_for_user(user=alice).rules["illicit"] == (0.5, "warn")
    policy.moderate_input = False
    policy.save()
    assert not policy_for_user(user=alice).moderate_input
    policy.delete()
    assert policy_for_user(user=alice).policy_id is None


def test_rows_cached_by_another_process_during_a_change_are_not_served_after_it(
    alice, make_policy, django_capture_on_commit_callbacks
):
    policy = make_policy({"illicit": (0.9, "warn")}, name="global")
    before = policy_for_user(user=alice)
    with django_capture_on_commit_callbacks(execute=True):
        rule = policy.rules.get(category="illicit")
        rule.threshold = 0.5
        rule.save()
        # Before the commit, another process reads the old rows and caches them under the new version.
        stale_key = f"moderation:policy:{cache.get(POLICY_VERSION_KEY)}:{tier_for_user(user=alice).id}"
        cache.set(stale_key, before)
        assert policy_for_user(user=alice) == before
    assert policy_for_user(user=alice).rules["illicit"] == (0.5, "warn")
