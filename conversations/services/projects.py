"""Projects: a person's group of conversations with its own instructions, files and default model
(docs/conversations.md, Projects). Every function here takes rows the caller has already read as the
person's own (`conversations.selectors.project_get_for_user`), and checks that the rows it joins
belong to one person."""

from __future__ import annotations

import enum

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from chatsite.errors import ClientError
from conversations.models import Conversation, Project
from conversations.selectors import models_for_user
from conversations.services.conversations import conversation_delete


class ProjectChats(enum.StrEnum):
    """What deleting a project does with its chats: there is no default, the person chooses."""

    DELETE = "delete"
    KEEP = "keep"  # moved out of the project, into the dated list

    @classmethod
    def parse(cls, value: object) -> ProjectChats:
        try:
            return cls(value) if isinstance(value, str) else cls("")
        except ValueError:
            raise ClientError(
                "Say what becomes of the project's chats: 'chats' must be 'delete' or 'keep'.",
                code="invalid_request",
                param="chats",
            ) from None


def _name_clean(name: object) -> str:
    name = " ".join(name.split()) if isinstance(name, str) else ""
    if not name or len(name) > Project.NAME_MAX_CHARS or "\x00" in name:
        raise ClientError(
            f"A project's name must be 1 to {Project.NAME_MAX_CHARS} characters long.",
            code="invalid_name",
            param="name",
        )
    return name


def _instructions_clean(instructions: object) -> str:
    if not isinstance(instructions, str) or "\x00" in instructions:
        raise ClientError("Instructions must be text.", code="invalid_request", param="instructions")
    instructions = instructions.strip()
    if len(instructions) > Project.INSTRUCTIONS_MAX_CHARS:
        raise ClientError(
            f"A project's instructions can be at most {Project.INSTRUCTIONS_MAX_CHARS} characters long.",
            code="invalid_request",
            param="instructions",
        )
    return instructions


def _default_model_clean(*, owner: User, model: object) -> str:
    """ "" (the person's own default) or a model the person's plan lets them pick now."""
    if model == "":
        return ""
    if not isinstance(model, str) or model not in models_for_user(user=owner):
        raise ClientError(
            "Choose one of the models your plan includes, or none.", code="model_not_allowed", param="default_model"
        )
    return model


def project_create(*, owner: User, name: str, instructions: str = "", default_model: str = "") -> Project:
    return Project.objects.create(
        owner=owner,
        name=_name_clean(name),
        instructions=_instructions_clean(instructions),
        default_model=_default_model_clean(owner=owner, model=default_model),
    )


def project_update(
    *, project: Project, name: str | None = None, instructions: str | None = None, default_model: str | None = None
) -> Project:
    """Change what is given (None: left as it is); all checked before anything is saved. A new
    default model applies to chats started from now on; the project's chats keep theirs."""
    if name is not None:
        project.name = _name_clean(name)
    if instructions is not None:
        project.instructions = _instructions_clean(instructions)
    if default_model is not None:
        project.default_model = _default_model_clean(owner=project.owner, model=default_model)
    project.save()
    return project


@transaction.atomic
def project_delete(*, project: Project, chats: ProjectChats) -> int:
    """Delete a project and its files, and its chats with it (`DELETE`: each as deleting it alone
    does, stopping an answer still being written) or not (`KEEP`: they leave the project, keeping
    their place in time). Returns how many chats it had."""
    conversations = list(Conversation.objects.filter(project=project, user_id=project.owner_id))
    if chats is ProjectChats.DELETE:
        for conversation in conversations:
            conversation_delete(conversation=conversation)
    else:
        Conversation.objects.filter(id__in=[c.id for c in conversations]).update(project=None)
    project.delete()
    return len(conversations)


def conversation_move(*, conversation: Conversation, project: Project | None) -> Conversation:
    """Put a conversation into one of its owner's projects, or (None) out of any. Its place in time
    does not change, as for a pin. A project of someone else's is refused as a missing one."""
    if project is not None and project.owner_id != conversation.user_id:
        raise ClientError("That project does not exist.", code="not_found", status=404, param="project")
    Conversation.objects.filter(id=conversation.id).update(project=project)
    conversation.project = project
    if project is not None:
        Project.objects.filter(id=project.id).update(updated_at=timezone.now())
    return conversation
