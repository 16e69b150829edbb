"""The Celery broker's transport: kombu's Redis transport, with a fix for losing Redis mid-poll.

A worker that lost Redis while it held unacknowledged tasks (every GPU worker that is answering)
stopped consuming for good, with `Unrecoverable error: AttributeError("'NoneType' object has no
attribute 'hostname'")` right after `Restoring N unacknowledged message(s)`. The sequence, in
celery 5.7.0 and kombu 5.7.0:

1. The consumer's connection fails; Celery (`Consumer.on_connection_error_after_connected`) first
   calls `connection.collect()`, which closes each channel and then detaches the transport from its
   connection (`transport.client = None`).
2. A channel waiting in BRPOP for the next task reads that BRPOP's reply as it closes
   (`Channel.close`, `_brpop_read`). Redis being gone, the read raises a connection error before the
   channel is marked closed: its close stops there, and `collect` ignores the error.
3. Celery then closes the connection again (celery/celery#10242, to release the socket). The
   half-closed channel runs its close once more, now to the end: restoring its unacknowledged tasks
   needs a connection pool, built from the detached client, and `None.hostname` raises. That is not
   a connection error, so Celery takes it for a fatal one: the consumer stops, the process waits to
   join the vLLM engine process it never stops, and tasks queue up behind it unread.

The fix: a channel that closes while its BRPOP is in flight treats a connection error on that read
as the end of the BRPOP (its reply is gone with the connection) and goes on closing, so the first
close completes while the client is still attached; the second finds the channel closed. The
restore itself fails with a connection error while Redis is away (Celery ignores that); the tasks
stay in Redis's unacknowledged set, which Redis gives out again after the visibility timeout, and
the claim makes a second delivery harmless.

It subclasses kombu's private `Channel.close` flow (`_in_poll`, `_brpop_read`): KOMBU_VERSIONS says
which kombu it was written against, and tests/inference/test_redis_faults.py fails when an installed
kombu differs or no longer needs it.
"""

from __future__ import annotations

import logging
from queue import Empty

import kombu
from kombu.transport import redis

logger = logging.getLogger(__name__)

KOMBU_VERSIONS = ("5.7.",)  # the kombu releases whose Redis Channel.close this was checked against

if not kombu.__version__.startswith(KOMBU_VERSIONS):
    logger.warning(
        "chatsite.broker was written for kombu %s, not %s: check that its fix still applies",
        ", ".join(KOMBU_VERSIONS),
        kombu.__version__,
    )


class Channel(redis.Channel):
    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()
            except (Empty, *self.connection_errors):
                pass  # the reply went with the connection; kombu resets _in_poll either way
        super().close()


class Transport(redis.Transport):
    Channel = Channel
