"""The reaches into channels_redis's private parts (inference/streaming/channels_redis_internals.py)
still find what they were written for, and step aside on a release they do not know.

Each test here fails loudly when channels_redis changes under the project. Move `WRITTEN_FOR` only
after checking every reach on the new release.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from channels_redis.pubsub import RedisPubSubChannelLayer

from inference.streaming import channels_redis_internals as internals

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def another_release(monkeypatch):
    internals.internals_supported.cache_clear()
    monkeypatch.setattr(internals, "channels_redis_release", lambda: "99.0.0")
    yield
    internals.internals_supported.cache_clear()


def test_the_installed_channels_redis_is_the_release_the_reaches_were_written_for():
    assert internals.channels_redis_release() == internals.WRITTEN_FOR, (
        "channels_redis changed: check each reach in inference/streaming/channels_redis_internals.py on it, "
        "then move WRITTEN_FOR"
    )


def test_the_requirements_pin_that_release():
    text = (ROOT / "requirements" / "base.txt").read_text()
    assert re.search(rf"^channels-redis=={re.escape(internals.WRITTEN_FOR)}\s", text, re.MULTILINE)


def test_channels_redis_has_everything_the_reaches_use():
    assert internals.internals_missing() == []
    assert internals.internals_supported()


async def test_the_group_channel_is_the_one_the_layers_own_group_send_publishes_on():
    url = "redis://127.0.0.1:6379/9"
    layer = RedisPubSubChannelLayer(hosts=[url])
    pubsub = internals.pubsub_on(layer, url)
    assert pubsub is not None
    assert internals.group_channel(pubsub, "generation.x") == layer._get_layer()._get_group_channel_name("generation.x")
    assert internals.pubsub_on(layer, "redis://127.0.0.1:6379/8") is None  # another Redis than the buffer's
    assert internals.pubsub_on(object(), url) is None  # not a Redis pub/sub layer


async def test_another_release_turns_the_reaches_off_and_says_so(another_release, caplog):
    url = "redis://127.0.0.1:6379/9"
    with caplog.at_level(logging.WARNING, logger="inference.streaming.channels_redis_internals"):
        assert not internals.internals_supported()
        # The buffer then publishes through the layer's public group_send.
        assert internals.pubsub_on(RedisPubSubChannelLayer(hosts=[url]), url) is None
    assert "99.0.0" in caplog.text and "two round trips" in caplog.text
