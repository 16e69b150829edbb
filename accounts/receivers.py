"""Hooks accounts' services onto other apps' and Django's signals; the rules live in accounts.services."""

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from accounts.models import User
from accounts.selectors import user_access_fields
from accounts.services import user_access_after_save, user_access_changed, user_session_record

ACCESS_FIELDS = {"is_active", "password"}


@receiver(pre_save, sender=User)
def on_user_saving(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    # What the row held, to tell a deactivation or a new password from any other save. A save of
    # other fields only (a sign-in's last_login, a tier) reads nothing.
    if raw or instance._state.adding or (update_fields is not None and not ACCESS_FIELDS & set(update_fields)):
        return
    instance._access_before = user_access_fields(user_id=instance.pk)


@receiver(post_save, sender=User)
def on_user_saved(sender, instance, created=False, **kwargs) -> None:
    before = instance.__dict__.pop("_access_before", None)
    if before is not None and not created:
        user_access_after_save(user=instance, was_active=before[0], old_password=before[1])


@receiver(post_delete, sender=User)
def on_user_deleted(sender, instance, **kwargs) -> None:
    user_access_changed(user_id=instance.pk)


@receiver(user_logged_in)
def on_user_logged_in(sender, request, user, **kwargs) -> None:
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        user_session_record(
            user=user,
            session_key=session_key,
            user_agent=request.META.get("HTTP_USER_AGENT", ""),
            address=request.META.get("REMOTE_ADDR", ""),
        )


@receiver(user_logged_out)
def on_user_logged_out(sender, request, user, **kwargs) -> None:
    session = getattr(request, "session", None)
    session_key = getattr(session, "session_key", None)
    if user is not None and session is not None and session_key:
        # Django sends this signal before it ends the session. It ends here first, so that a page
        # which reloads when its socket closes finds itself signed out, and a socket opened in the
        # meantime is refused; Django's own flush after this is then a no-op.
        session.flush()
        user_access_changed(user_id=user.pk, session_key=session_key)
