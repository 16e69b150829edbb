"""The files page: your library and every file you attached to a chat, uploading into the library,
deleting. Server-rendered; a small script (static/documents/library.js) follows processing."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from accounts.authentication import signed_in
from accounts.metering import metered
from chatsite.errors import ClientError
from documents.selectors import document_get_for_user, document_list_for_user, storage_for_user
from documents.services import document_delete, document_limits_for, document_upload


@metered("request", POST=("file_upload", "document"))
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def library(request: HttpRequest) -> HttpResponse:
    status = 200
    if request.method == "POST":
        upload = request.FILES.get("file")
        try:
            if upload is None:
                raise ClientError("Choose a file to upload.", code="invalid_request", param="file")
            limit = document_limits_for(user=signed_in(request)).max_file_bytes
            if limit is not None and upload.size is not None and upload.size > limit:
                raise ClientError(
                    f"The file is {upload.size / 1048576:.1f} MB; your plan takes files of up to {limit / 1048576:.1f} MB.",
                    code="file_too_large",
                    status=413,
                )
            document_upload(user=signed_in(request), name=upload.name or "", data=upload.read(), library=True)
        except ClientError as exc:
            messages.error(request, exc.message)
            status = exc.status
        else:
            return redirect("documents:library")
    return render(
        request,
        "documents/library.html",
        {
            "documents": document_list_for_user(user=signed_in(request)).select_related(
                "conversation_link__conversation", "project_link__project"
            )[:500],
            "storage": storage_for_user(user=signed_in(request)),
            "limits": document_limits_for(user=signed_in(request)),
        },
        status=status,
    )


@metered("request")
@login_required
@require_POST
def document_delete_view(request: HttpRequest, document_id: int) -> HttpResponse:
    document = document_get_for_user(user=signed_in(request), document_id=document_id)
    if document is None:
        raise Http404("No such file.")
    document_delete(document=document)
    messages.success(request, f"Deleted {document.name}.")
    return redirect("documents:library")
