from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from conversations import receivers  # noqa: F401
        from conversations.services import held_message_recover
        from inference.held import held_answer_owner_register

        # A runner that never heard a message's verdict asks for its held answer (inference.held).
        held_answer_owner_register(held_message_recover)

        from conversations.flags import MESSAGE_FLAGS
        from moderation.subjects import flag_subjects_install

        # Moderation records and shows which message a flag is about through this (moderation.subjects).
        flag_subjects_install(MESSAGE_FLAGS)

        from accounts.hooks import account_export_register
        from conversations.selectors import conversations_export_files

        account_export_register(conversations_export_files)
