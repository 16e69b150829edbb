"""The global policy a fresh install starts with (the migration writes a copy of it as rows).

Input and output use the same rules. Self-harm is a warning, not a block: a person writing about
harming themselves should get an answer and a pointer to help, not a closed door. Instructions for
self-harm, threats, sexual content involving minors and violent illicit requests are blocked and
queued for a moderator; the rest of what is blocked needs no human look.
"""

from __future__ import annotations

DEFAULT_POLICY_NAME = "Default"

# category: (threshold, action)
DEFAULT_RULES: dict[str, tuple[float, str]] = {
    "harassment": (0.8, "warn"),
    "harassment/threatening": (0.6, "block_and_review"),
    "hate": (0.6, "block"),
    "hate/threatening": (0.5, "block_and_review"),
    "illicit": (0.7, "block"),
    "illicit/violent": (0.6, "block_and_review"),
    "self-harm": (0.6, "warn"),
    "self-harm/intent": (0.5, "warn"),
    "self-harm/instructions": (0.6, "block_and_review"),
    "sexual": (0.7, "block"),
    "sexual/minors": (0.5, "block_and_review"),
    "violence": (0.8, "warn"),
    "violence/graphic": (0.7, "block"),
    "prompt-injection": (0.8, "block_and_review"),
}
