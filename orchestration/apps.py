from django.apps import AppConfig


class OrchestrationConfig(AppConfig):
    name = "orchestration"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The OpenAI API (inference, the layer below) routes through this layer's router.
        from inference.selectors import deployment_router_install
        from orchestration.routing import AUTO, route

        deployment_router_install(route, names=[AUTO])

        from inference.caching import response_cache_register
        from orchestration import receivers  # noqa: F401
        from orchestration.cache import cache_probe

        response_cache_register(cache_probe)

        from orchestration.tools.installed import tools_install

        tools_install()
