"""The conversations app's writes, one module by what it does:

- `conversations`: a conversation started, renamed, pinned, archived, deleted (one or several at once), its branch on screen chosen, and
  the deployment its next answer goes to.
- `sending`: a message sent (`message_send`, given a `SendRequest` parsed where it entered), with
  its answer queued, or held back by moderation; a send repeated with its `client_id`.
- `answering`: what every new answer needs (its prompt, its rows, its generation and its charge),
  shared by sends, regenerations and continuations, and an ended generation copied onto its answer.
- `branches`: an answer regenerated beside the old one, or continued where its length limit cut it.
- `feedback`: a thumbs up or down on an answer, and taking it back.
- `titles`: a conversation's title, asked of its model once the first answer ends.
- `saved_prompts`: the prompt library, prompts a user keeps for the composer's `/`.
- `sharing`: a read-only link to a snapshot of the branch on screen.
- `projects`: a project created, changed or deleted (its chats with it, or kept), and a
  conversation moved into or out of one.

The names below are the app's write API; callers import them from here.
"""

from conversations.services.answering import ANSWER_CUT, message_finish_from_generation, message_mark_streaming
from conversations.services.branches import Regenerated, message_continue, message_regenerate
from conversations.services.conversations import (
    conversation_archive,
    conversation_archive_many,
    conversation_branch_select,
    conversation_create,
    conversation_delete,
    conversation_delete_many,
    conversation_pin,
    conversation_rename,
    conversation_settings_update,
    conversation_start,
    conversation_unarchive,
)
from conversations.services.feedback import message_feedback_clear, message_feedback_set
from conversations.services.projects import (
    ProjectChats,
    conversation_move,
    project_create,
    project_delete,
    project_update,
)
from conversations.services.saved_prompts import saved_prompt_create, saved_prompt_delete, saved_prompt_update
from conversations.services.sending import (
    ACTIVE_BRANCH,
    HELD_BACK,
    SentMessage,
    held_back_reason,
    held_message_recover,
    message_send,
    message_send_checked,
)
from conversations.services.sharing import conversation_share, conversation_share_revoke
from conversations.services.titles import conversation_title_on_finish, conversation_title_request

__all__ = [
    "ACTIVE_BRANCH",
    "ANSWER_CUT",
    "HELD_BACK",
    "ProjectChats",
    "Regenerated",
    "SentMessage",
    "conversation_archive",
    "conversation_archive_many",
    "conversation_branch_select",
    "conversation_create",
    "conversation_delete",
    "conversation_delete_many",
    "conversation_move",
    "conversation_pin",
    "conversation_rename",
    "conversation_settings_update",
    "conversation_share",
    "conversation_share_revoke",
    "conversation_start",
    "conversation_unarchive",
    "conversation_title_on_finish",
    "conversation_title_request",
    "held_back_reason",
    "held_message_recover",
    "message_continue",
    "message_feedback_clear",
    "message_feedback_set",
    "message_finish_from_generation",
    "message_mark_streaming",
    "message_regenerate",
    "message_send",
    "message_send_checked",
    "project_create",
    "project_delete",
    "project_update",
    "saved_prompt_create",
    "saved_prompt_delete",
    "saved_prompt_update",
]
