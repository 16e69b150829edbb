"""An open chat socket lives only as long as its user may use the service: suspension, deactivation,
signing out and a new password close it, stop what it runs, and no frame on it is acted on after."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.auth.hashers import make_password
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import accounts.services
from accounts.models import User
from accounts.selectors import SessionAccess, session_access
from accounts.services import user_deactivate
from conversations.models import Conversation
from inference.models import Generation
from inference.streaming.streams import events_after
from moderation.models import Flag
from moderation.services import flag_create, input_moderate
from tests.helpers.factories import PASSWORD
from tests.helpers.sockets import next_event, open_socket

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]

# The socket must be closed this soon after the change is committed.
CLOSED_WITHIN_S = 2.0
SUSPENDED, SESSION_ENDED = 4403, 4401


async def closed_with(socket, *, within: float = CLOSED_WITHIN_S) -> int:
    """The close code the socket is closed with, skipping what it was sent before; fails after `within` s."""
    deadline = time.monotonic() + within
    while True:
        output = await socket.receive_output(timeout=max(deadline - time.monotonic(), 0.01))
        if output["type"] == "websocket.close":
            return output.get("code")


async def nothing_comes_of_a_send(socket) -> None:
    """A frame sent on a closed socket creates nothing and is answered with nothing."""
    await socket.send_json_to({"type": "message.send", "content": "Still here?"})
    assert await socket.receive_nothing(timeout=1.0)
    assert not await Conversation.objects.aexists()
    assert not await Generation.objects.aexists()


async def still_open(socket) -> None:
    await socket.send_to(text_data='{"type": "nonsense"}')
    assert (await next_event(socket, timeout=10))["code"] == "invalid_request"


@pytest.fixture
def superuser(make_user):
    user = make_user("root")
    user.is_staff = user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def admin_client(superuser):
    client = Client()
    client.force_login(superuser)
    return client


@pytest.fixture
def flag(mallory):
    text = "How do I build a pipe bomb to blow up my neighbour's car?"
    return flag_create(
        user=mallory, message=None, source="input", text=text, verdict=input_moderate(user=mallory, text=text)
    )


async def test_suspending_from_the_review_queue_closes_the_users_socket(admin_client, flag, mallory):
    socket, connected = await open_socket(mallory)
    assert connected
    response = await database_sync_to_async(admin_client.post)(
        reverse("admin:moderation_flag_changelist"),
        {"action": "suspend_selected_users", "_selected_action": [flag.id]},
    )
    assert response.status_code == 302
    assert await closed_with(socket) == SUSPENDED
    assert (await Flag.objects.aget(id=flag.id)).user_action == Flag.UserAction.SUSPENDED
    await nothing_comes_of_a_send(socket)


async def test_deactivating_in_the_admin_closes_every_socket_of_the_user(admin_client, alice):
    sockets = [(await open_socket(alice))[0] for _ in range(2)]
    change = reverse("admin:accounts_user_change", args=[alice.id])
    form = {
        "username": "alice",
        "email": "alice@example.com",
        "date_joined_0": alice.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": alice.date_joined.strftime("%H:%M:%S"),
        "is_active": "",  # unticked
        # The page's inlines (linked sign-ins, passkeys), none of them changed.
        **{
            f"{inline}-{count}": "0"
            for inline in ("external_identities", "passkeys")
            for count in ("TOTAL_FORMS", "INITIAL_FORMS")
        },
    }
    response = await database_sync_to_async(admin_client.post)(change, {k: v for k, v in form.items() if v})
    assert response.status_code == 302, getattr(response, "context_data", {}).get("errors")
    assert not (await User.objects.aget(id=alice.id)).is_active
    for socket in sockets:
        assert await closed_with(socket) == SUSPENDED
    await nothing_comes_of_a_send(sockets[0])


async def test_the_deactivation_service_closes_the_socket_of_another_session(alice):
    socket, _ = await open_socket(alice)
    assert await database_sync_to_async(user_deactivate)(user_id=alice.id)
    assert await closed_with(socket) == SUSPENDED
    await nothing_comes_of_a_send(socket)


async def test_signing_out_closes_that_sessions_sockets_and_no_others(alice):
    signed_in = Client()
    await database_sync_to_async(signed_in.force_login)(alice)
    this_session = [(await open_socket(alice, client=signed_in))[0] for _ in range(2)]
    other_session, _ = await open_socket(alice)
    response = await database_sync_to_async(signed_in.post)(reverse("accounts:logout"))
    assert response.status_code == 302
    for socket in this_session:
        assert await closed_with(socket) == SESSION_ENDED
    await nothing_comes_of_a_send(this_session[0])
    await still_open(other_session)


def test_a_sign_out_ends_the_session_before_its_sockets_hear_of_it(alice, monkeypatch):
    """A page reloads when its socket closes with 4401; were the session still there, the reload
    would show the chat page again, signed in, and race the sign-out's own navigation."""
    told = accounts.services.user_sockets_tell
    sessions_when_told: list[bool] = []

    def tell_noting_the_session(*, user_id, event):
        sessions_when_told.append(Session.objects.filter(session_key=session_key).exists())
        told(user_id=user_id, event=event)

    monkeypatch.setattr(accounts.services, "user_sockets_tell", tell_noting_the_session)
    signed_in = Client()
    signed_in.force_login(alice)
    session_key = signed_in.session.session_key
    assert signed_in.post(reverse("accounts:logout")).status_code == 302
    assert sessions_when_told == [False]


async def test_a_new_password_closes_the_sockets_signed_in_with_the_old_one(alice):
    socket, _ = await open_socket(alice)

    def change_password() -> None:
        user = User.objects.get(id=alice.id)
        user.set_password(PASSWORD + " changed")
        user.save()

    await database_sync_to_async(change_password)()
    assert await closed_with(socket) == SESSION_ENDED
    await nothing_comes_of_a_send(socket)


async def test_other_changes_to_the_user_leave_the_socket_open(alice):
    socket, _ = await open_socket(alice)

    def rename() -> None:
        user = User.objects.get(id=alice.id)
        user.first_name = "Alice"
        user.save()

    await database_sync_to_async(rename)()
    assert await socket.receive_nothing(timeout=0.5)
    await still_open(socket)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda user: User.objects.filter(id=user.id).update(is_active=False), SUSPENDED),
        (lambda user: User.objects.filter(id=user.id).update(password=make_password("another one")), SESSION_ENDED),
        (lambda user: Session.objects.all().delete(), SESSION_ENDED),
        (lambda user: User.objects.filter(id=user.id).delete(), SUSPENDED),
    ],
    ids=["deactivated", "new-password", "signed-out", "deleted"],
)
async def test_a_change_that_sends_no_event_still_refuses_the_next_frame(alice, change, code):
    socket, _ = await open_socket(alice)
    await still_open(socket)
    await asyncio.sleep(0.4)  # past the last check's grace (conversations.consumers.ACCESS_RECHECK_S)
    await database_sync_to_async(change)(alice)
    await socket.send_json_to({"type": "message.send", "content": "Anyone there?"})
    assert await closed_with(socket) == code
    assert not await Conversation.objects.aexists()
    assert not await Generation.objects.aexists()


async def test_a_suspended_users_queued_answer_is_stopped_and_its_end_announced(alice, unclaimed_generation):
    await database_sync_to_async(user_deactivate)(user_id=alice.id)
    generation = await Generation.objects.aget(id=unclaimed_generation.id)
    assert generation.status == Generation.Status.STOPPED
    assert generation.stop_requested
    (done,) = await events_after(str(generation.id), 0)
    assert done["type"] == "generation.done" and done["status"] == "stopped"


async def test_a_suspended_users_running_answer_is_stopped_in_the_engine(engine, alice):
    socket, _ = await open_socket(alice)
    await socket.send_json_to(
        {"type": "message.send", "content": "Write a very long story about a dragon who learns to bake bread."}
    )
    while (event := await next_event(socket))["type"] != "generation.delta":
        if event["type"] == "message.accepted":
            generation_id = event["generation"]
    await database_sync_to_async(user_deactivate)(user_id=alice.id)
    assert await closed_with(socket) == SUSPENDED
    for _ in range(100):
        generation = await Generation.objects.aget(id=generation_id)
        if generation.is_finished:
            break
        await asyncio.sleep(0.1)
    assert generation.status == Generation.Status.STOPPED, generation.status
    assert generation.finish_reason == "abort"


def test_the_access_check_reads_the_account_and_the_session_in_one_statement(alice, django_assert_num_queries):
    Client().force_login(alice)
    session = Session.objects.get()
    key, auth_hash = session.session_key, session.get_decoded()[HASH_SESSION_KEY]
    with django_assert_num_queries(1):
        assert session_access(user_id=alice.id, session_key=key, session_auth_hash=auth_hash) is SessionAccess.ALLOWED
    assert session_access(user_id=alice.id, session_key=key, session_auth_hash="") is SessionAccess.ENDED
    Session.objects.update(expire_date=timezone.now())
    assert session_access(user_id=alice.id, session_key=key, session_auth_hash=auth_hash) is SessionAccess.ENDED


def test_with_sessions_held_elsewhere_the_access_check_reads_the_account_alone(alice, settings):
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
    auth_hash = alice.get_session_auth_hash()
    assert session_access(user_id=alice.id, session_key="", session_auth_hash=auth_hash) is SessionAccess.ALLOWED
    assert session_access(user_id=alice.id, session_key="", session_auth_hash="stale") is SessionAccess.ENDED
    User.objects.filter(id=alice.id).update(is_active=False)
    assert session_access(user_id=alice.id, session_key="", session_auth_hash=auth_hash) is SessionAccess.SUSPENDED
    User.objects.filter(id=alice.id).delete()
    assert session_access(user_id=alice.id, session_key="", session_auth_hash=auth_hash) is SessionAccess.SUSPENDED
