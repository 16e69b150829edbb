"""A conversation as a tree of messages, read from its rows in one query and walked here.

Each message's `parent` is the message before it in its branch: a user message follows an answer
(or, the first, nothing), an answer follows the user message it answers. Messages with the same
parent are siblings: the edits of a user message, the regenerations of an answer. What one sees is
a branch: the path from the root to a leaf. Ids grow with time, so "newest" is the highest id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tree:
    by_id: dict[int, Any]
    children: dict[int | None, list[int]]  # parent id (None: the roots) -> child ids, oldest first

    @classmethod
    def of(cls, messages: Iterable[Any]) -> Tree:
        by_id = {m.id: m for m in messages}
        children: dict[int | None, list[int]] = {}
        for message_id in sorted(by_id):
            parent = by_id[message_id].parent_id
            # A parent that is gone (deleted) leaves its children as roots rather than lost.
            children.setdefault(parent if parent in by_id else None, []).append(message_id)
        return cls(by_id, children)

    def siblings(self, message_id: int) -> list[int]:
        """The ids of the message and its siblings, oldest first."""
        parent = self.by_id[message_id].parent_id
        return self.children.get(parent if parent in self.by_id else None, [message_id])

    def newest_leaf_under(self, message_id: int | None) -> int | None:
        """The most recent leaf among the message's descendants (the message itself if it has none);
        under None, the newest leaf of the whole tree."""
        leaves = [m for m in self._descendants(message_id) if not self.children.get(m)]
        return max(leaves, default=message_id)

    def path_to(self, message_id: int | None) -> list[Any]:
        """The messages from the root down to `message_id`, in order; empty for None."""
        path = []
        seen = set()
        while message_id is not None and message_id in self.by_id and message_id not in seen:
            seen.add(message_id)
            path.append(self.by_id[message_id])
            message_id = self.by_id[message_id].parent_id
        return path[::-1]

    def active_path(self, active_leaf_id: int | None) -> list[Any]:
        """The branch on screen: to the stored leaf, continued down to the newest leaf under it (the
        leaf may have been answered since it was stored), or the newest leaf when none is stored."""
        start = active_leaf_id if active_leaf_id in self.by_id else None
        return self.path_to(self.newest_leaf_under(start))

    def _descendants(self, message_id: int | None) -> Sequence[int]:
        found = [] if message_id is None else [message_id]
        stack = list(self.children.get(message_id, []))
        while stack:
            current = stack.pop()
            found.append(current)
            stack.extend(self.children.get(current, []))
        return found
