"""What is left of a plan this period, and when it resets, as the sidebar and the usage page say it."""

from __future__ import annotations

import datetime as dt

from accounts.models import Tier
from accounts.selectors import (
    QuotaLevel,
    QuotaPeriod,
    QuotaStatus,
    quota_periods,
    quota_status_for_user,
    time_until_words,
)
from conversations.requests import SendRequest
from conversations.services import message_send
from tests.accounts.conftest import run_to_end

UTC = dt.UTC


def test_a_day_resets_at_the_next_midnight_and_a_month_on_the_first_of_the_next_in_utc():
    tier = Tier(name="t", tokens_per_day=1000, tokens_per_month=20000)
    now = dt.datetime(2026, 12, 31, 22, 30, tzinfo=UTC)
    day, month = quota_periods(tier=tier, now=now)
    assert (day.name, day.since, day.resets_at) == (
        "day",
        dt.datetime(2026, 12, 31, tzinfo=UTC),
        dt.datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert (month.name, month.since, month.resets_at) == (
        "month",
        dt.datetime(2026, 12, 1, tzinfo=UTC),
        dt.datetime(2027, 1, 1, tzinfo=UTC),
    )
    # A time given in another zone is the same instant: the periods stay UTC's.
    elsewhere = now.astimezone(dt.timezone(dt.timedelta(hours=5)))  # already 1 January there
    assert quota_periods(tier=tier, now=elsewhere)[0].resets_at == dt.datetime(2027, 1, 1, tzinfo=UTC)
    assert quota_periods(tier=Tier(name="unlimited"), now=now) == []


def test_the_time_to_a_reset_reads_in_minutes_hours_or_days():
    now = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert time_until_words(now=now, then=now + dt.timedelta(seconds=20)) == "in 1 minute"
    assert time_until_words(now=now, then=now + dt.timedelta(minutes=42, seconds=5)) == "in 43 minutes"
    assert time_until_words(now=now, then=now + dt.timedelta(hours=13, minutes=1)) == "in 14 hours"
    assert time_until_words(now=now, then=now + dt.timedelta(hours=1)) == "in 1 hour"
    assert time_until_words(now=now, then=now + dt.timedelta(days=29, hours=14)) == "in 29 days"


def _level(limit: int, used: int, name: str = "day", hours_left: int = 5) -> QuotaLevel:
    now = dt.datetime(2026, 12, 2, 19, 0, tzinfo=UTC)
    period = QuotaPeriod(name, limit, now.replace(hour=0), now + dt.timedelta(hours=hours_left))
    return QuotaLevel(period, used=used, now=now)


def test_the_words_say_what_is_left_and_warn_from_eighty_percent():
    assert _level(50_000, 37_600).text == "12,400 of 50,000 tokens left today · resets in 5 hours"
    assert _level(50_000, 37_600).state == "ok"
    assert _level(50_000, 40_000).state == "warning"
    month = _level(500_000, 100, name="month", hours_left=24 * 29)
    assert month.text == "499,900 of 500,000 tokens left this month · resets in 29 days"


def test_run_out_says_that_messages_are_refused_until_the_reset():
    level = _level(1_000, 1_200)
    assert (level.state, level.left, level.shown_used) == ("exhausted", 0, 1_000)
    assert level.text == (
        "You have used all 1,000 of today's tokens. Messages are refused until the quota resets in 5 hours "
        "(2026-12-03 00:00 UTC)."
    )


def test_the_quota_that_refuses_first_is_the_one_shown_and_no_quota_is_unlimited():
    day, month = _level(10_000, 9_000), _level(500_000, 9_000, name="month", hours_left=24 * 29)
    status = QuotaStatus(levels=(day, month))
    assert status.binding is day
    assert status.state == "warning"
    assert status.as_json() == {"state": "warning", "text": day.text, "limit": 10_000, "used": 9_000}
    # A quota nearly used warns even while another leaves less.
    nearly = QuotaStatus(levels=(_level(2_000, 1_000), _level(100_000, 90_000, name="month")))
    assert nearly.binding.limit == 2_000 and nearly.binding.state == "ok" and nearly.state == "warning"
    unlimited = QuotaStatus(levels=())
    assert (unlimited.state, unlimited.text) == ("unlimited", "Unlimited tokens on your plan")
    assert unlimited.as_json() == {
        "state": "unlimited",
        "text": "Unlimited tokens on your plan",
        "limit": None,
        "used": None,
    }


def test_a_users_quota_counts_their_ledger_and_their_unfinished_answers(alice, bob, put_on_tier):
    Tier.objects.filter(name="free").update(tokens_per_day=10_000, tokens_per_month=None)
    run_to_end(
        message_send(user=alice, request=SendRequest(content="hi")).generation, prompt_tokens=900, completion_tokens=100
    )
    status = quota_status_for_user(user=alice)
    assert (status.binding.used, status.binding.left, status.state) == (1_000, 9_000, "ok")
    # A queued answer holds its prompt and its max_tokens against the quota, as the check does.
    message_send(user=alice, request=SendRequest(content="more"))
    assert quota_status_for_user(user=alice).binding.used > 1_000
    assert quota_status_for_user(user=bob).binding.used == 0  # only one's own usage
    put_on_tier(alice, "enterprise")
    assert quota_status_for_user(user=alice).state == "unlimited"
