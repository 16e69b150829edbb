from __future__ import annotations

import datetime as dt
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from accounts.models import ApiKey
from accounts.services import api_key_authenticate


def createapikey(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("createapikey", *args, stdout=out, stderr=err)
    return out.getvalue()


def test_it_prints_only_a_working_key_with_the_default_scopes(alice):
    out = createapikey("alice")
    key = out.strip()
    assert out == key + "\n" and key.startswith("cs_")
    api_key = api_key_authenticate(key=key)
    assert api_key.user == alice
    assert api_key.scopes == ["chat", "embeddings", "models:read"]
    assert api_key.expires_at is None


def test_it_takes_scopes_a_name_and_an_expiry_in_days(alice):
    key = createapikey(
        "alice", "--scopes", "conversations:read, conversations:write", "--name", "ci", "--expires", "30d"
    )
    api_key = api_key_authenticate(key=key.strip())
    assert api_key.name == "ci"
    assert api_key.scopes == ["conversations:read", "conversations:write"]
    assert abs(api_key.expires_at - (timezone.now() + dt.timedelta(days=30))) < dt.timedelta(minutes=1)


def test_it_takes_an_expiry_date(alice):
    createapikey("alice", "--expires", "2999-01-01")
    assert ApiKey.objects.get().expires_at == dt.datetime(2999, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nobody"], "No user"),
        (["alice", "--scopes", "chat,admin"], "Unknown scope"),
        (["alice", "--scopes", ","], "Unknown scope"),
        (["alice", "--expires", "tomorrow"], "--expires must be"),
        (["alice", "--expires", "2000-01-01"], "in the future"),
        (["alice", "--expires", "0d"], "at least 1d"),
        (["alice", "--name", " "], "name"),
    ],
)
def test_it_refuses_bad_arguments_and_creates_nothing(alice, args, message):
    with pytest.raises(CommandError, match=message):
        createapikey(*args)
    assert not ApiKey.objects.exists()
