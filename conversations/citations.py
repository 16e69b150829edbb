"""An answer's sources: the passages its prompt quoted, numbered as the prompt numbered them, and
those the prompt-injection check left out (documents.retrieval finds them; they are recorded here,
beside the message they belong to)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from conversations.models import Citation
from documents.retrieval import Passage, Retrieved


def citations_record(*, owner_id: int, message_id: int, cited: Sequence[Any], withheld: Sequence[Any]) -> None:
    """Record what an answer's prompt quoted (`cited`, numbered in order from 1) and what the
    prompt-injection check left out of it (`withheld`): `documents.retrieval.Passage`s."""
    rows = [
        Citation(
            owner_id=owner_id,
            message_id=message_id,
            document_id=p.document_id,
            number=i,
            file_name=p.file_name,
            page=p.page,
            heading=p.heading,
            passage=p.text,
        )
        for i, p in enumerate(cited, start=1)
    ]
    rows += [
        Citation(
            owner_id=owner_id,
            message_id=message_id,
            document_id=p.document_id,
            file_name=p.file_name,
            page=p.page,
            heading=p.heading,
            withheld=True,
        )
        for p in withheld
    ]
    if rows:
        Citation.objects.bulk_create(rows)


def citations_for_messages(*, owner_id: int, message_ids: Iterable[int]) -> dict[int, list[Citation]]:
    """Each message's sources, numbered, then what was left out of its prompt: one query."""
    found: dict[int, list[Citation]] = defaultdict(list)
    ids = list(message_ids)
    if ids:
        for citation in Citation.objects.filter(owner_id=owner_id, message_id__in=ids):
            found[citation.message_id].append(citation)
    return dict(found)


# How an answer cites a quoted passage: "[2]", or several in one mark, "[1, 3]" (the prompt asks
# for [1], [2]; the chat page links the same marks).
CITATION_MARK = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")


def cited_numbers(text: str) -> set[int]:
    """The passage numbers an answer's text cites."""
    return {int(n) for mark in CITATION_MARK.findall(text) for n in mark.split(",")}


def citations_cited(citations: Iterable[Citation], *, text: str) -> list[Citation]:
    """What the page shows under an answer: the quoted passages its text cites (a passage quoted
    but not cited did not go into what it says), and every passage left out of its prompt."""
    cited = cited_numbers(text)
    return [c for c in citations if c.withheld or c.number in cited]


def citation_json(citation: Citation, *, cited: Collection[int]) -> dict[str, Any]:
    """`cited`: the numbers the answer's text cites (`cited_numbers`)."""
    return {
        "number": citation.number,
        "file": citation.file_name,
        "document": citation.document_id,
        "page": citation.page,
        "heading": citation.heading,
        "passage": citation.passage,
        "withheld": citation.withheld,
        "cited": not citation.withheld and citation.number in cited,
    }


def retrieved_for_answer(*, owner_id: int, message_id: int) -> Retrieved:
    """The passages an answer's prompt quoted, numbered as it numbered them: what its continuation
    quotes again, so that it writes on from the same sources and cites them by the same numbers
    (the copies its citations keep, which outlive a deleted file)."""
    citations = Citation.objects.filter(owner_id=owner_id, message_id=message_id, withheld=False).order_by("number")
    return Retrieved([Passage(c.document_id or 0, c.file_name, c.page, c.heading, c.passage) for c in citations], [])
