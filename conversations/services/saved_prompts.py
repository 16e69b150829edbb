"""The prompt library: prompts a user keeps and puts into the composer with `/command`."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from accounts.models import User
from chatsite.errors import ClientError
from conversations.models import SavedPrompt
from conversations.requests import SavedPromptRequest, is_row_id

# Enough for a library anyone browses by typing; a cap keeps a script from filling the table.
SAVED_PROMPTS_PER_USER = 100


def _duplicate(command: str) -> ClientError:
    return ClientError(f"You already have a prompt named /{command}.", code="duplicate_command", param="command")


def _own(*, user: User, prompt_id: int) -> SavedPrompt:
    """One of the user's prompts, locked for the write; another's is a 404, as a missing one."""
    prompt = None
    if is_row_id(prompt_id):
        prompt = SavedPrompt.objects.select_for_update().filter(owner=user, id=prompt_id).first()
    if prompt is None:
        raise ClientError("That prompt does not exist.", code="not_found", status=404)
    return prompt


def saved_prompt_create(*, user: User, request: SavedPromptRequest) -> SavedPrompt:
    """A new prompt in the user's library; refused when its command is taken or the library is full."""
    with transaction.atomic():
        # The owner's row, locked: two creates at once cannot both pass the count.
        User.objects.select_for_update().filter(id=user.id).first()
        if SavedPrompt.objects.filter(owner=user).count() >= SAVED_PROMPTS_PER_USER:
            raise ClientError(
                f"Your library holds at most {SAVED_PROMPTS_PER_USER} prompts: delete one first.",
                code="too_many_prompts",
            )
        if SavedPrompt.objects.filter(owner=user, command=request.command).exists():
            raise _duplicate(request.command)
        try:
            with transaction.atomic():
                return SavedPrompt.objects.create(owner=user, command=request.command, text=request.text)
        except IntegrityError:  # the same command created meanwhile
            raise _duplicate(request.command) from None


def saved_prompt_update(*, user: User, prompt_id: int, request: SavedPromptRequest) -> SavedPrompt:
    """The user's prompt with a new command and text; a command another of theirs has is refused."""
    with transaction.atomic():
        prompt = _own(user=user, prompt_id=prompt_id)
        if SavedPrompt.objects.filter(owner=user, command=request.command).exclude(id=prompt.id).exists():
            raise _duplicate(request.command)
        prompt.command, prompt.text = request.command, request.text
        try:
            with transaction.atomic():
                prompt.save(update_fields=["command", "text", "updated_at"])
        except IntegrityError:
            raise _duplicate(request.command) from None
        return prompt


def saved_prompt_delete(*, user: User, prompt_id: int) -> None:
    """The user's prompt deleted; another's, or a missing one, is a 404."""
    with transaction.atomic():
        _own(user=user, prompt_id=prompt_id).delete()
