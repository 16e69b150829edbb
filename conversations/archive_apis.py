"""The conversations API's archive, and its operations on several conversations at once: the chat
page's sidebar calls these (its "…" menu, the Archived view, Select mode), as API clients may.

Owners only, as everywhere in this API: another user's conversation answers 404 exactly like a
missing one. A request naming several refuses them all (404, nothing changed) when any one is not the
caller's, without saying which; one whose `ids` are not a list of conversation ids is a 400.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.apis import ScopedApi
from accounts.authentication import signed_in
from accounts.metering import metered
from accounts.models import ApiKey
from conversations.apis import ConversationOutputSerializer
from conversations.requests import is_row_id
from conversations.services import (
    conversation_archive,
    conversation_archive_many,
    conversation_delete_many,
    conversation_unarchive,
)

WRITE = ApiKey.Scope.CONVERSATIONS_WRITE
# As many as the sidebar lists at once (conversations.selectors.SIDEBAR_LIMIT).
MAX_IDS = 100


class ConversationIdField(serializers.IntegerField):
    """A conversation's id as JSON has it: an integer, never text, a float or a bool."""

    default_error_messages = {"invalid": "A conversation id is a positive integer."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=2**63 - 1, **kwargs)

    def to_internal_value(self, data: Any) -> int:
        if not is_row_id(data):
            self.fail("invalid")
        return data


class ConversationIdsSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=ConversationIdField(),
        min_length=1,
        max_length=MAX_IDS,
        help_text=f"The conversations, by id: 1 to {MAX_IDS} of yours.",
    )

    class Meta:
        ref_name = "ConversationIds"


@metered("request")
class ConversationArchiveApi(ScopedApi):
    """POST archives a conversation: it leaves the list (and search), and stays readable. DELETE
    puts it back."""

    method_scopes = {"POST": WRITE, "DELETE": WRITE}

    @extend_schema(
        operation_id="conversations_archive",
        summary="Archive a conversation",
        request=None,
        responses={200: ConversationOutputSerializer, 404: OpenApiResponse(description="No such conversation.")},
    )
    def post(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_archive(user=signed_in(request), conversation_id=conversation_id)
        return Response(ConversationOutputSerializer(conversation).data)

    @extend_schema(
        operation_id="conversations_unarchive",
        summary="Put an archived conversation back in the list",
        responses={200: ConversationOutputSerializer, 404: OpenApiResponse(description="No such conversation.")},
    )
    def delete(self, request: Request, conversation_id: int) -> Response:
        conversation = conversation_unarchive(user=signed_in(request), conversation_id=conversation_id)
        return Response(ConversationOutputSerializer(conversation).data)


def _ids(request: Request) -> list[int]:
    serializer = ConversationIdsSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data["ids"]


@metered("request")
class ConversationBulkDeleteApi(ScopedApi):
    """POST deletes several conversations in one transaction: all of them, or none."""

    method_scopes = {"POST": WRITE}

    class OutputSerializer(serializers.Serializer):
        deleted = serializers.ListField(child=serializers.IntegerField(), help_text="Their ids.")

        class Meta:
            ref_name = "ConversationsDeleted"

    @extend_schema(
        operation_id="conversations_delete_many",
        summary="Delete several conversations",
        request=ConversationIdsSerializer,
        responses={
            200: OutputSerializer,
            400: OpenApiResponse(description="`ids` is not a list of 1 to 100 conversation ids."),
            404: OpenApiResponse(description="One of them is not a conversation of yours: none is deleted."),
        },
    )
    def post(self, request: Request) -> Response:
        deleted = conversation_delete_many(user=signed_in(request), conversation_ids=_ids(request))
        return Response({"deleted": deleted})


@metered("request")
class ConversationBulkArchiveApi(ScopedApi):
    """POST archives several conversations at once: all of them, or none."""

    method_scopes = {"POST": WRITE}

    class OutputSerializer(serializers.Serializer):
        archived = serializers.ListField(child=serializers.IntegerField(), help_text="Their ids.")

        class Meta:
            ref_name = "ConversationsArchived"

    @extend_schema(
        operation_id="conversations_archive_many",
        summary="Archive several conversations",
        request=ConversationIdsSerializer,
        responses={
            200: OutputSerializer,
            400: OpenApiResponse(description="`ids` is not a list of 1 to 100 conversation ids."),
            404: OpenApiResponse(description="One of them is not a conversation of yours: none is archived."),
        },
    )
    def post(self, request: Request) -> Response:
        archived = conversation_archive_many(user=signed_in(request), conversation_ids=_ids(request))
        return Response({"archived": archived})
