from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from accounts.hooks import deployments_enabled_register, quota_reservation_register
        from inference import receivers  # noqa: F401
        from inference.engine.vllm_server_internals import release_supported
        from inference.selectors import deployment_list_enabled, generation_tokens_reserved_for_user

        quota_reservation_register(generation_tokens_reserved_for_user)
        deployments_enabled_register(deployment_list_enabled)
        # A vLLM release its OpenAI server's reaches were not written for says so in the log at start-up
        # (read from the package's metadata: importing vLLM here would cost every process seconds).
        release_supported()

        from inference.backend import backend_install
        from inference.execution.dispatch import backend

        # The services sit below the execution layer and reach its backend through this slot.
        backend_install(backend)

        if settings.REDIS_URL:
            # A channels_redis its reaches do not know says so in the log at start-up, not at the first answer.
            from inference.streaming.channels_redis_internals import internals_supported

            internals_supported()
