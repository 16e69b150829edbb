"""Imports go one way: each app imports only the layers below it, never one above.

    composition   chatsite.settings, urls, asgi, celery (wires the apps together)
    observability metrics, health, the operations page (reads every app below it)
    conversations chats, messages, the chat page and its socket
    documents     uploaded files, their chunks and index, retrieval with citations
    orchestration routing, fallback and roll-outs; conversation memory; caching
    inference     deployments, generations, engines, workers, streaming, the OpenAI API
    moderation    classifiers, policies, flags and the review queue
    accounts      users, tiers, keys, limits and the ledger
    shared        the rest of chatsite (database, Redis, errors, parsing, security)

Where a lower layer needs something done above it, it sends a signal the upper layer receives
(`inference.held.held_answer_unjudged`, `accounts.signals.quota_tokens_reserved`). Every import
counts, at the top of a module or inside a function, migrations and management commands included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = [
    "accounts",
    "moderation",
    "inference",
    "billing",
    "orchestration",
    "documents",
    "conversations",
    "observability",
]
COMPOSITION = {"chatsite.settings", "chatsite.urls", "chatsite.asgi", "chatsite.celery", "chatsite.wsgi"}
LAYERS = ["shared", *APPS, "composition"]


def layer_of(module: str) -> str | None:
    """The layer of a project module (dotted name), None for anything outside the project."""
    top = module.split(".")[0]
    if top == "chatsite":
        # The package itself loads the Celery app, as Celery's Django layout has it.
        composed = module == "chatsite" or any(module == m or module.startswith(m + ".") for m in COMPOSITION)
        return "composition" if composed else "shared"
    return top if top in APPS else None


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, wherever it sits."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def upward_imports() -> list[str]:
    found = []
    for package in ["chatsite", *APPS]:
        for path in sorted((ROOT / package).rglob("*.py")):
            importer = module_name(path)
            rank = LAYERS.index(layer_of(importer))
            for line, imported in imports_of(path):
                target = layer_of(imported)
                if target is not None and LAYERS.index(target) > rank:
                    found.append(
                        f"{path.relative_to(ROOT)}:{line} ({layer_of(importer)}) imports {imported} ({target})"
                    )
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports() == []


def test_the_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    source = "def f():\n    from conversations.services import message_send\n"
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_of(path) == [(2, "conversations.services")]
    assert layer_of("conversations.services") == "conversations"
    assert LAYERS.index(layer_of("conversations.services")) > LAYERS.index(layer_of("inference.execution.runner"))
