"""Signals other apps hook their own services onto; no business rule lives in a receiver."""

from django.dispatch import Signal

# Sent once the transaction that deactivated an account has committed, with `user_id`: whatever
# the account still has queued or running must stop (inference hooks its generations onto it).
user_deactivated = Signal()
