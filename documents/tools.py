"""The search of a person's files as a tool the model may call (orchestration's tool loop), registered
from `DocumentsConfig.ready`: documents sit above orchestration, which cannot import them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatsite.database import db_async
from documents.retrieval import retrieve_for_message
from orchestration.tools.base import ToolContext, ToolResult, ToolSpec, result_clipped


class SearchFiles:
    spec = ToolSpec(
        name="search_files",
        description="Search the user's uploaded files (this chat's, its project's and their library) for passages.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for.", "minLength": 1, "maxLength": 400}
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        query = str(arguments["query"]).strip()
        # Only the person's own files: the scope is theirs whatever the conversation names.
        found = await db_async(retrieve_for_message)(
            owner_id=context.user_id, conversation_id=context.conversation_id, project_id=context.project_id, text=query
        )
        if not found.passages:
            return ToolResult(content=f"No passage of the user's files matches {query!r}.", details={"query": query})
        parts = []
        for number, passage in enumerate(found.passages, start=1):
            where = passage.file_name + (f", page {passage.page}" if passage.page else "")
            parts.append(f"[{number}] {where}\n{passage.text}")
        clipped = result_clipped(content="\n\n".join(parts), limit=context.max_output_chars)
        citations = [
            {
                "document_id": p.document_id,
                "file_name": p.file_name,
                "page": p.page,
                "heading": p.heading,
                "passage": p.text,
            }
            for p in found.passages
        ]
        return ToolResult(
            content=clipped.content, truncated=clipped.truncated, details={"query": query, "citations": citations}
        )
