from __future__ import annotations

from django.contrib import admin

from documents.models import Document, TierDocumentLimits


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "kind", "size", "status", "chunk_count", "withheld_count", "created_at"]
    list_filter = ["status", "kind", "library"]
    search_fields = ["name", "owner__username"]
    # The bytes are never shown or edited here; the rest is read-only: files change through their owner.
    exclude = ["data"]
    readonly_fields = [f.name for f in Document._meta.fields if f.name != "data"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data").select_related("owner")

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(TierDocumentLimits)
class TierDocumentLimitsAdmin(admin.ModelAdmin):
    list_display = [
        "tier",
        "max_file_bytes",
        "max_files",
        "max_total_bytes",
        "max_pages",
        "max_chunks",
        "processing_seconds",
    ]
