from django.apps import AppConfig


class DocumentsConfig(AppConfig):
    name = "documents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts.hooks import account_export_register
        from billing.selectors import USAGE_FIGURES
        from documents import receivers  # noqa: F401
        from documents.background import document_process_dispatch
        from documents.selectors import documents_export_files, usage_storage_figures
        from documents.services import document_processing_install, image_read_for_request
        from documents.tools import SearchFiles
        from inference.hooks import image_reader_register
        from orchestration.tools.registry import tool_register

        USAGE_FIGURES.append(usage_storage_figures)
        account_export_register(documents_export_files)
        document_processing_install(document_process_dispatch)
        image_reader_register(image_read_for_request)
        tool_register(SearchFiles())
