"""Imports go one way: each app imports only the layers below it, never one above; and every
foreign key, one-to-one and many-to-many of a model points at a model of its own layer or one below.

    composition   chatsite.settings, urls, asgi, celery (wires the apps together)
    observability metrics, health, the operations page (reads every app below it)
    conversations chats, messages, their summaries, citations and flags; the chat page and its socket
    documents     uploaded files, their chunks and index, retrieval
    orchestration routing, fallback and roll-outs; the conversation memory policy; caching
    billing       the ledger: prices, usage records, statements
    inference     deployments, generations, engines, workers, streaming, the OpenAI API
    moderation    classifiers, policies, flags and the review queue
    accounts      users, tiers, keys, limits and quotas
    shared        the rest of chatsite (database, Redis, errors, parsing, security)

Where a lower layer needs something done above it, it sends a signal the upper layer receives
(`inference.held.held_answer_unjudged`, `accounts.signals.quota_tokens_reserved`). Every import
counts, at the top of a module or inside a function, migrations and management commands included.
A relation a lower layer's rows need to an upper one's is declared from the upper side, pointing
down (`inference.ModelDeployment.tiers`, `conversations.FlaggedMessage`), and a lower layer that
must read or write through it takes a hook installed at start-up (`accounts.ledger`,
`moderation.subjects`). Both checks count what they read, so an empty tree cannot pass.
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


# --- the schema -------------------------------------------------------------------------------------

# The project's modules as this suite reads them: a tree that loses one shows here (an empty
# one too), not as a check that passes because it read nothing.
LEAST_MODULES = 200
# Every foreign key, one-to-one and many-to-many of every model of the apps, and the models
# that hold them: fewer means the walk missed some.
LEAST_MODELS = 18
LEAST_RELATIONS = 40


def app_of_model(model) -> str | None:
    """The layer of a model: its app's, None for a model outside the project (auth, sessions)."""
    return model._meta.app_label if model._meta.app_label in APPS else None


def project_relations() -> list[tuple[str, str, str]]:
    """(model, field, target model) of every relation a project model declares: its foreign keys,
    one-to-ones and many-to-manys, not the reverse sides Django adds to their targets."""
    from django.apps import apps

    found = []
    for model in apps.get_models():
        if app_of_model(model) is None:
            continue
        for field in model._meta.get_fields():
            if field.is_relation and not field.auto_created and field.related_model is not None:
                found.append((model._meta.label, field.name, field.related_model._meta.label))
    return found


def upward_relations(relations: list[tuple[str, str, str]] | None = None) -> list[str]:
    """The relations (every project relation by default) that point at a model of a layer above
    their own model's."""
    from django.apps import apps

    found = []
    for label, name, target in project_relations() if relations is None else relations:
        source, pointed = app_of_model(apps.get_model(label)), app_of_model(apps.get_model(target))
        if pointed is not None and LAYERS.index(pointed) > LAYERS.index(source):
            found.append(f"{label}.{name} ({source}) points at {target} ({pointed})")
    return found


def test_the_import_check_reads_every_app(monkeypatch):
    import sys

    read: list[Path] = []
    real = imports_of

    def counted(path: Path) -> list[tuple[int, str]]:
        read.append(path)
        return real(path)

    monkeypatch.setattr(sys.modules[__name__], "imports_of", counted)
    assert upward_imports() == []
    assert len(read) >= LEAST_MODULES
    assert {module_name(path).split(".")[0] for path in read} == {"chatsite", *APPS}


def test_no_relation_points_to_a_layer_above_its_own():
    assert upward_relations() == []


def test_the_relation_check_walks_every_model():
    relations = project_relations()
    assert len(relations) >= LEAST_RELATIONS
    assert len({label for label, _, _ in relations}) >= LEAST_MODELS
    from django.apps import apps

    with_models = {model._meta.app_label for model in apps.get_models() if app_of_model(model) is not None}
    assert {label.split(".")[0] for label, _, _ in relations} == with_models


def test_the_relation_check_sees_a_relation_declared_upwards():
    """What it would catch: a flag's key up to its message, as moderation once declared it."""
    assert upward_relations([("moderation.Flag", "message", "conversations.Message")]) == [
        "moderation.Flag.message (moderation) points at conversations.Message (conversations)"
    ]
    assert upward_relations([("conversations.FlaggedMessage", "flag", "moderation.Flag")]) == []
    assert ("inference.ModelDeployment", "tiers", "accounts.Tier") in project_relations()
