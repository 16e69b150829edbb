"""Signals other apps hook their own services onto; no business rule lives in a receiver."""

from django.dispatch import Signal

# Sent inside generation_finish's transaction with `generation` (the finished row).
generation_finished = Signal()
# Sent by generation_mark_started, in a transaction, with `generation` (claimed and running).
generation_started = Signal()
# Sent by a runner, on its event loop, with `generation` when the answer's first text is about to be
# shown (claimed, released): receivers time it (observability) and must return at once.
generation_first_token = Signal()
# Sent by the ASGI lifespan once the server has started (no arguments): background work of this
# process that must resume after a restart starts here. Receivers must return at once.
server_started = Signal()
