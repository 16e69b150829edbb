"""Signals other apps hook their own services onto; no business rule lives in a receiver."""

from django.dispatch import Signal

# Sent once the transaction that deactivated an account has committed, with `user_id`: whatever
# the account still has queued or running must stop (inference hooks its generations onto it).
user_deactivated = Signal()
# Sent with `status` (429 or 503) and `code` when a request is turned away before it reaches an engine
# (a rate limit, a quota, a full queue, an unavailable check): observability counts them by channel.
request_refused = Signal()
