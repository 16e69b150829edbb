"""Reads: a user's files (never another's: every query filters by owner) and their storage."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet, Sum

from accounts.models import User
from documents.models import Document

# Every column but the file's bytes (and an image's thumbnail): lists and pages never need them.
LISTED = ("data", "thumbnail")


def document_list_for_user(*, user: User) -> QuerySet[Document]:
    # With the conversation each is attached to (`Document.conversation_id`), in the same query.
    return Document.objects.filter(owner=user).select_related("conversation_link", "project_link").defer(*LISTED)


def document_get_for_user(*, user: User, document_id: int) -> Document | None:
    """The user's own file, or None: another user's file looks exactly like a missing one."""
    if not isinstance(document_id, int) or isinstance(document_id, bool) or not 0 < document_id < 2**63:
        return None
    return document_list_for_user(user=user).filter(id=document_id).first()


def images_for_user(*, user: User, ids: list[int], with_data: bool = False) -> list[Document]:
    """The user's own images among `ids`, in the order asked; another user's, or a file that is no
    image, is simply not among them."""
    found = Document.objects.filter(owner=user, kind=Document.Kind.IMAGE, id__in=ids).defer(
        *(("thumbnail",) if with_data else LISTED)
    )
    by_id = {document.id: document for document in found}
    return [by_id[i] for i in ids if i in by_id]


def documents_of_conversation(*, user: User, conversation_id: int) -> QuerySet[Document]:
    return document_list_for_user(user=user).filter(conversation=conversation_id)


def documents_of_project(*, user: User, project_id: int) -> QuerySet[Document]:
    return document_list_for_user(user=user).filter(project=project_id)


def documents_in_scope(
    *, owner_id: int, conversation_id: int | None, project_id: int | None = None
) -> list[tuple[int, str]]:
    """(id, name) of the ready files a message in `conversation_id` draws on: the conversation's own,
    its project's (conversations.ProjectFile) and the owner's library. `project_id`: the project a
    conversation not yet created goes into. Only the owner's files, whatever the ids name."""
    scope = Q(library=True)
    if conversation_id is not None:
        scope |= Q(conversation=conversation_id) | Q(project__conversations=conversation_id)
    if project_id is not None:
        scope |= Q(project=project_id)
    return list(
        Document.objects.filter(scope, owner_id=owner_id, status=Document.Status.READY).values_list("id", "name")
    )


@dataclass(frozen=True)
class Storage:
    files: int
    bytes: int


def storage_for_user(*, user: User) -> Storage:
    held = Document.objects.filter(owner=user).aggregate(files=Count("id"), bytes=Sum("size"))
    return Storage(files=held["files"], bytes=held["bytes"] or 0)


def usage_storage_figures(user: User) -> list[tuple[str, str]]:
    """The usage page's line for files: how many, and the storage they take."""
    from django.template.defaultfilters import filesizeformat

    held = storage_for_user(user=user)
    return [("files", f"{held.files} · {filesizeformat(held.bytes)}")]


_UNSAFE_IN_NAME = re.compile(r"[^\w.\- ]+")


def _archive_name(document: Document) -> str:
    """A file's name inside the archive: its own, with nothing that could leave its folder."""
    name = _UNSAFE_IN_NAME.sub("_", document.name).strip(". ") or "file"
    return f"files/{document.id}-{name[:120]}"


def documents_export_files(*, user: User) -> dict[str, bytes]:
    """documents' part of a person's data archive: each file as uploaded (files/<id>-<name>), and
    files.json saying what each is and where it was attached."""
    files: dict[str, bytes] = {}
    listed = []
    for document in Document.objects.filter(owner=user).select_related("conversation_link").order_by("id"):
        path = _archive_name(document)
        files[path] = bytes(document.data)
        listed.append(
            {
                "path": path,
                "name": document.name,
                "kind": document.kind,
                "size": document.size,
                "sha256": document.sha256,
                "status": document.status,
                "library": document.library,
                "conversation": document.conversation_id,
                "uploaded_at": document.created_at.isoformat(),
            }
        )
    files["files.json"] = json.dumps(listed, indent=2, ensure_ascii=False).encode()
    return files
