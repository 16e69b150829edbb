"""Prompt assembly for the chat: the context-window policy, the memory of long conversations and the
budget of quoted passages are the orchestration layer's (orchestration/memory.py holds the rule, in
one place); these are its names as the chat has always used them."""

from __future__ import annotations

from orchestration.memory import AssembledPrompt, Memory, Turn, context_budget, project_block, system_text
from orchestration.memory import prompt_assemble as assemble_prompt

__all__ = ["AssembledPrompt", "Memory", "Turn", "assemble_prompt", "context_budget", "project_block", "system_text"]
