"""Signals other apps hook their own services onto; no business rule lives in a receiver."""

from django.dispatch import Signal

# Sent once the transaction that deactivated an account has committed, with `user_id`: whatever
# the account still has queued or running must stop (inference hooks its generations onto it).
user_deactivated = Signal()
# Sent with `user` when a quota is checked: each receiver returns the tokens the user's unfinished
# work in its app may still use (inference answers for its generations), counted against the quota.
quota_tokens_reserved = Signal()
