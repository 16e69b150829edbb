from django.contrib import admin

from conversations.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "status", "content", "token_count", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "user", "deployment", "updated_at")
    list_select_related = ("user", "deployment")
    search_fields = ("title", "user__username")
    raw_id_fields = ("user",)
    inlines = [MessageInline]
