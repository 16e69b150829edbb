from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts.hooks import account_export_register
        from accounts.ledger import ledger_install
        from billing import receivers  # noqa: F401
        from billing.selectors import usage_export_files
        from billing.services import LEDGER

        # accounts checks quotas and admits the lighter endpoints below this layer: it reads and
        # writes the ledger through this hook, never by importing it.
        ledger_install(LEDGER)
        account_export_register(usage_export_files)
