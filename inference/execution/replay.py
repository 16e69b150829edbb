"""An earlier answer played back as an engine stream: what a generation answered from the response
cache (inference.caching) streams instead of the engine's deltas, through the same runner."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator

from inference.engine.host import Delta

# Words (with the space before them) at a time, as an engine's steps would hand them out; the
# pause lets the event loop serve other streams between them, without making anyone wait.
_PIECE = re.compile(r"\s*\S+")
WORDS_PER_DELTA = 4


async def replay_stream(*, text: str, prompt_tokens: int, completion_tokens: int) -> AsyncGenerator[Delta]:
    """`text` in pieces of a few words, its token count growing with it, the last piece finished
    ("stop": only answers that ended on their own are kept in the cache)."""
    pieces = _PIECE.findall(text) or [text]
    chunks = ["".join(pieces[i : i + WORDS_PER_DELTA]) for i in range(0, len(pieces), WORDS_PER_DELTA)]
    chunks[-1] += text[len("".join(pieces)) :]  # trailing whitespace, kept as the answer had it
    shown = 0
    for i, chunk in enumerate(chunks):
        shown += len(chunk)
        last = i == len(chunks) - 1
        tokens = completion_tokens if last else completion_tokens * shown // max(len(text), 1)
        yield Delta(
            text=chunk,
            prompt_tokens=prompt_tokens,
            completion_tokens=tokens,
            finished=last,
            finish_reason="stop" if last else None,
        )
        await asyncio.sleep(0)
