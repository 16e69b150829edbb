from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import IntegrityError
from django.urls import reverse

from accounts.models import Tier, User
from accounts.selectors import tier_for_user, tier_for_user_id_or_none
from tests.helpers.factories import PASSWORD


def test_the_four_tiers_exist_with_free_as_the_default(db):
    assert set(Tier.objects.values_list("name", flat=True)) == {"free", "pro", "enterprise", "admin"}
    assert Tier.objects.get(is_default=True).name == "free"
    priorities = dict(Tier.objects.values_list("name", "priority"))
    assert priorities["admin"] < priorities["enterprise"] < priorities["pro"] < priorities["free"]


def test_a_new_user_gets_the_free_tier(client, db):
    client.post(
        reverse("accounts:signup"),
        {"username": "carol", "email": "carol@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert User.objects.get(username="carol").tier.name == "free"


def test_a_user_without_a_tier_is_on_the_default_one(alice):
    User.objects.filter(id=alice.id).update(tier=None)
    assert tier_for_user(user=alice).name == "free"


def test_an_admin_changing_a_users_tier_applies_to_their_next_request(alice):
    stale = User.objects.get(id=alice.id)  # e.g. the user an open socket holds
    User.objects.filter(id=alice.id).update(tier=Tier.objects.get(name="pro"))
    assert tier_for_user(user=stale).name == "pro"


def test_a_users_tier_is_one_read_whether_their_own_or_the_default(alice, django_assert_num_queries):
    User.objects.filter(id=alice.id).update(tier=Tier.objects.get(name="pro"))
    with django_assert_num_queries(1):
        assert tier_for_user_id_or_none(user_id=alice.id).name == "pro"
    User.objects.filter(id=alice.id).update(tier=None)
    with django_assert_num_queries(1):
        assert tier_for_user_id_or_none(user_id=alice.id).name == "free"


def test_with_no_tier_of_their_own_and_no_default_a_user_has_none(alice):
    User.objects.filter(id=alice.id).update(tier=None)
    Tier.objects.filter(is_default=True).update(is_default=False)
    assert tier_for_user_id_or_none(user_id=alice.id) is None


def test_only_one_tier_can_be_the_default(db):
    with pytest.raises(IntegrityError):
        Tier.objects.filter(name="pro").update(is_default=True)


def test_the_staff_groups_carry_djangos_own_permissions(db):
    moderators = Group.objects.get(name="Moderators")
    # review_flag is what the review queue in the admin checks; review_moderation came first.
    assert set(moderators.permissions.values_list("codename", flat=True)) == {"review_moderation", "review_flag"}
    managers = Group.objects.get(name="Deployment managers")
    assert "change_modeldeployment" in set(managers.permissions.values_list("codename", flat=True))


def test_a_deployment_manager_may_change_deployments_but_not_tiers(alice):
    alice.groups.add(Group.objects.get(name="Deployment managers"))
    alice = User.objects.get(id=alice.id)  # permissions are cached per instance
    assert alice.has_perm("inference.change_modeldeployment")
    assert not alice.has_perm("accounts.change_tier")
    assert not alice.has_perm("accounts.review_moderation")


def test_a_second_default_tier_is_a_form_error_not_a_crash(admin_client, db):
    pro = Tier.objects.get(name="pro")
    response = admin_client.post(
        reverse("admin:accounts_tier_change", args=[pro.id]),
        {
            "name": "pro",
            "display_name": "Pro",
            "is_default": "on",
            "priority": 2,
            "prices-TOTAL_FORMS": 0,
            "prices-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors
    assert Tier.objects.get(is_default=True).name == "free"
