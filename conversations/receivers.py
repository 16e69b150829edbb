"""Keeps assistant messages and summaries in step with their generations, and flags and files (uploaded,
and those code runs kept) with the messages, conversations and projects they belong to; the rules
live in services and summaries."""

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from conversations.models import Conversation, ConversationFile, FlaggedMessage, ProjectFile
from conversations.services import (
    conversation_title_on_finish,
    message_finish_from_generation,
    message_mark_streaming,
)
from conversations.summaries import summary_on_finish
from documents.models import Document
from inference.models import Generation
from inference.signals import generation_finished, generation_started
from moderation.models import Flag
from orchestration.tools.run_code import run_code_files_delete


@receiver(generation_started)
def on_generation_started(sender, generation, **kwargs) -> None:
    message_mark_streaming(generation=generation)


@receiver(generation_finished)
def on_generation_finished(sender, generation, **kwargs) -> None:
    message_finish_from_generation(generation=generation)
    conversation_title_on_finish(generation=generation)


@receiver(generation_finished)
def on_summary_finished(sender, generation, **kwargs) -> None:
    if generation.purpose == Generation.Purpose.SUMMARY:
        summary_on_finish(generation=generation)


@receiver(post_delete, sender=FlaggedMessage)
def flag_goes_with_its_message(sender, instance, **kwargs) -> None:
    """A message deleted (alone, or with its conversation or its user) takes its flags with it, as
    the flag's own cascading key did when moderation held it."""
    Flag.objects.filter(id=instance.flag_id).delete()


@receiver(post_delete, sender=ConversationFile)
def file_goes_with_its_conversation(sender, instance, **kwargs) -> None:
    """A conversation deleted (alone, or with its user) takes its files with it, and their chunks,
    as the file's own cascading key did when documents held it."""
    Document.objects.filter(id=instance.document_id).delete()


@receiver(post_delete, sender=ProjectFile)
def file_goes_with_its_project(sender, instance, **kwargs) -> None:
    """A project deleted (alone, or with its user) takes its files with it, and their chunks."""
    Document.objects.filter(id=instance.document_id).delete()


@receiver(post_delete, sender=Conversation)
def code_files_go_with_their_conversation(sender, instance, **kwargs) -> None:
    """A conversation deleted (alone, or with its user) takes the files its code runs kept, once the
    deletion is committed (a rolled-back one keeps them)."""
    conversation_id = instance.id
    transaction.on_commit(lambda: run_code_files_delete(conversation_id=conversation_id))
