from django.apps import AppConfig


class DocumentsConfig(AppConfig):
    name = "documents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from billing.selectors import USAGE_FIGURES
        from documents import receivers  # noqa: F401
        from documents.selectors import usage_storage_figures

        USAGE_FIGURES.append(usage_storage_figures)
