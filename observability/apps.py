from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability"

    def ready(self) -> None:
        from observability import receivers, tracing  # noqa: F401 - connects the receivers

        tracing.tracing_start_if_configured()
