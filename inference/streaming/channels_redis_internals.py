"""Every reach into channels_redis's private parts, in one module, behind a check of the release it was
written for.

The replay buffer (`streams.ReplayBuffer`) appends an event and publishes it to the socket's group in
one Redis pipeline, one round trip per event instead of two. For that it needs three things
channels_redis keeps to itself on its pub/sub layer (`RedisPubSubChannelLayer`):

- `_get_layer()`: the event loop's own side of the layer;
- that side's `_shards`, each with its `host`: to know the layer's one Redis is the buffer's;
- `_get_group_channel_name(group)`: the Redis channel a group's messages are published on.

On any other channels_redis release `internals_supported()` is false: the buffer logs a warning once
and appends and publishes through the layer's public `group_send`, two round trips an event, and
tests/inference/test_channels_redis_internals.py fails until each reach is checked on the new release
and `WRITTEN_FOR` moves with the pin in requirements/base.txt. The check runs at start-up too
(`inference.apps`), so a changed release says so in the log before the first answer.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

logger = logging.getLogger(__name__)

# The channels_redis release every reach below was written for and checked against.
WRITTEN_FOR = "4.3.0"


def channels_redis_release() -> str:
    from importlib.metadata import version

    return version("channels_redis")


def internals_missing() -> list[str]:
    """What the reaches below expect of channels_redis and do not find there, in words; empty when all is found."""
    from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer

    missing = []
    if not callable(getattr(RedisPubSubChannelLayer, "_get_layer", None)):
        missing.append("RedisPubSubChannelLayer._get_layer()")
    if not callable(getattr(RedisPubSubLoopLayer, "_get_group_channel_name", None)):
        missing.append("RedisPubSubLoopLayer._get_group_channel_name(group)")
    if "self._shards" not in inspect.getsource(RedisPubSubLoopLayer.__init__):
        missing.append("RedisPubSubLoopLayer._shards")
    return missing


@functools.cache
def internals_supported() -> bool:
    """Whether the installed channels_redis is the release these reaches were written for and has what
    they use. Logs once why not."""
    release = channels_redis_release()
    if release != WRITTEN_FOR:
        logger.warning(
            "channels_redis %s is not %s, the release inference/streaming/channels_redis_internals.py was "
            "written for: each stream event is appended and published in two round trips instead of one",
            release,
            WRITTEN_FOR,
        )
        return False
    missing = internals_missing()
    if missing:
        logger.warning(
            "channels_redis %s lacks what inference/streaming/channels_redis_internals.py uses: %s",
            release,
            ", ".join(missing),
        )
        return False
    return True


def pubsub_on(layer: Any, url: str) -> Any:
    """This event loop's side of `layer` when it is a Redis pub/sub layer whose one host is `url`, else
    None (another layer, several shards, another Redis, or a channels_redis these reaches do not know)."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    if not isinstance(layer, RedisPubSubChannelLayer) or not internals_supported():
        return None
    pubsub = layer._get_layer()
    shards = pubsub._shards
    return pubsub if len(shards) == 1 and shards[0].host.get("address") == url else None


def group_channel(pubsub: Any, group: str) -> str:
    """The Redis channel `pubsub` (from `pubsub_on`) publishes a group's messages on, exactly as its own
    `group_send` names it."""
    return pubsub._get_group_channel_name(group)
