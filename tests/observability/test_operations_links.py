"""Staff reach the operations page from the chat page and from every admin page; nobody else is shown it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db

OPERATIONS = "/admin/operations/"


def test_staff_find_the_operations_page_from_the_admin_and_the_chat(client, default_deployment):
    staff = get_user_model().objects.create_user(username="sam", password="a long enough password 1", is_staff=True)
    client.force_login(staff)
    admin_index = client.get(reverse("admin:index")).content.decode()
    assert f'href="{OPERATIONS}"' in admin_index
    assert "favicon.svg" in admin_index  # the admin carries the site's icon too
    assert f'href="{OPERATIONS}"' in client.get(reverse("conversations:chat")).content.decode()


def test_people_who_are_not_staff_are_not_shown_the_operations_page(client, alice):
    client.force_login(alice)
    assert OPERATIONS not in client.get(reverse("conversations:chat")).content.decode()
