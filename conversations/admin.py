from django.contrib import admin

from conversations.models import Conversation, Message, MessageFeedback, Project


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "status", "parent", "content", "token_count", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "user", "deployment", "updated_at")
    list_select_related = ("user", "deployment")
    search_fields = ("title", "user__username")
    raw_id_fields = ("user", "project")
    inlines = [MessageInline]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "default_model", "updated_at")
    list_select_related = ("owner",)
    search_fields = ("name", "owner__username")
    raw_id_fields = ("owner",)


@admin.register(MessageFeedback)
class MessageFeedbackAdmin(admin.ModelAdmin):
    """Users' ratings of answers, read-only: the operator's dataset of what worked and what did not."""

    list_display = ("created_at", "rating", "deployment_name", "user", "answer", "comment")
    list_filter = ("rating", ("message__conversation__deployment", admin.RelatedOnlyFieldListFilter), "created_at")
    list_select_related = ("user", "message__conversation__deployment")
    search_fields = ("comment", "message__content", "user__username")
    date_hierarchy = "created_at"
    fields = ("user", "message", "rating", "comment", "question", "answer_text", "created_at", "updated_at")
    readonly_fields = fields

    @admin.display(description="model", ordering="message__conversation__deployment__name")
    def deployment_name(self, feedback: MessageFeedback) -> str:
        return feedback.message.conversation.deployment.name

    @admin.display(description="answer")
    def answer(self, feedback: MessageFeedback) -> str:
        return feedback.message.content[:80]

    @admin.display(description="answer")
    def answer_text(self, feedback: MessageFeedback) -> str:
        return feedback.message.content

    @admin.display(description="question")
    def question(self, feedback: MessageFeedback) -> str:
        parent = feedback.message.parent
        return parent.content if parent is not None else ""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
