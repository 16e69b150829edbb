"""The fence around untrusted text quoted into a prompt: passages of a person's files (documents)
and the results of tools (orchestration) alike.

Each quotation sits between an opening and a closing line that carry a code made for the one
prompt. The quoted text cannot close it early: it cannot know the code, the code is chosen to
appear in none of the quoted text, and fence marks (<<<, >>>) inside that text are rewritten.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

FENCE_OPEN = "<<<quote {code} [{number}]"
FENCE_CLOSE = "quote {code}>>>"


def inert(text: str, *, lines: bool = False) -> str:
    """Quoted text that cannot pass for a fence: its fence marks rewritten, and a name or heading
    kept to one line (a quotation's lines are each marked as quoted)."""
    text = text.replace("<<<", "« ").replace(">>>", " »")
    return text.strip() if lines else " ".join(text.split())


def fence_code(texts: Iterable[str]) -> str:
    """A fresh code that appears in none of `texts`."""
    texts = list(texts)
    code = secrets.token_hex(6)
    while any(code in text for text in texts):
        code = secrets.token_hex(6)
    return code


def fenced(*, code: str, number: int, where: str, text: str) -> str:
    """One quotation: its opening line, a line saying where it comes from, its lines marked with `| `."""
    body = "\n".join(f"| {line}" for line in text.split("\n"))
    return f"{FENCE_OPEN.format(code=code, number=number)}\n{where}\n{body}\n{FENCE_CLOSE.format(code=code)}"
