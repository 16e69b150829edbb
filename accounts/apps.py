from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import receivers  # noqa: F401
        from accounts.hooks import account_export_register
        from accounts.selectors import user_export_files

        account_export_register(user_export_files)
