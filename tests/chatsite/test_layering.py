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

Where a lower layer needs a value from above it, it takes a hook the upper layer registers at
start-up (`inference.held.held_answer_owner_register`, `accounts.hooks.quota_reservation_register`);
a signal only tells the layers above of something done. Every import counts, at the top of a module
or inside a function, migrations and management commands included, and an import inside a function
needs a reason written below. A relation a lower layer's rows need to an upper one's is declared from the upper side, pointing
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


# --- Inside inference: its own order ---------------------------------------------------------------

# Lowest first; a module of inference imports only from its own sub-layer and those below. The
# engine knows nothing of rows; the core (models, selectors, services, the held answer) sends work
# through the backend installed at start-up (inference.backend); streaming reads the rows it
# announces; execution runs generations on the core and streams them; the OpenAI API uses them all;
# the app's wiring (AppConfig, receivers, admin, commands, migrations) sits on top.
INFERENCE_LAYERS = {
    "engine": ["inference.engine"],
    "core": [
        *("inference.models", "inference.signals", "inference.selectors", "inference.services", "inference.held"),
        *("inference.heartbeats", "inference.backend", "inference.caching", "inference.scheduling"),
        *("inference.defaults", "inference.hooks", "inference.images"),
    ],
    "streaming": ["inference.streaming"],
    "execution": ["inference.execution"],
    "openai": ["inference.openai"],
    "wiring": ["inference", "inference.apps", "inference.receivers", "inference.admin", "inference.management"],
}
INFERENCE_ORDER = list(INFERENCE_LAYERS)


def inference_layer_of(module: str) -> str | None:
    """The sub-layer of a module of inference (the longest prefix named above), None if none is."""
    best, found = "", None
    for layer, prefixes in INFERENCE_LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, found = prefix, layer
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """`imports_of`, with `from package import module` read as the module it names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = ROOT.joinpath(*node.module.split("."))
            for alias in node.names:
                named = package / alias.name
                is_module = named.with_suffix(".py").exists() or (named / "__init__.py").exists()
                found.append((node.lineno, f"{node.module}.{alias.name}" if is_module else node.module))
    return found


def inference_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "inference").rglob("*.py")) if "migrations" not in p.parts]


def inference_upward_imports() -> list[str]:
    found = []
    for path in inference_modules():
        importer = module_name(path)
        rank = INFERENCE_ORDER.index(inference_layer_of(importer) or "wiring")
        for line, imported in imported_modules(path):
            target = inference_layer_of(imported) if imported.split(".")[0] == "inference" else None
            if target is not None and INFERENCE_ORDER.index(target) > rank:
                found.append(
                    f"{path.relative_to(ROOT)}:{line} ({inference_layer_of(importer)}) imports {imported} ({target})"
                )
    return found


def test_every_module_of_inference_has_a_place_in_its_order():
    modules = [module_name(path) for path in inference_modules()]
    assert len(modules) > 40
    assert [m for m in modules if inference_layer_of(m) is None] == []


def test_inference_imports_only_its_own_sub_layer_and_those_below():
    assert inference_upward_imports() == []


def test_the_inner_order_sees_an_import_of_a_layer_above(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from inference.execution import dispatch\n")
    assert [inference_layer_of(m) for _, m in imports_of(probe)] == ["execution"]
    assert INFERENCE_ORDER.index("execution") > INFERENCE_ORDER.index(inference_layer_of("inference.held"))


# --- No imports of the project's modules inside functions ------------------------------------------

# An import of the project's own modules waits inside a function only for a reason written here; an
# AppConfig.ready (apps.py) and `if TYPE_CHECKING:` blocks need none. Keyed by file and module.
INSIDE_FUNCTIONS_ALLOWED = {
    ("inference/engine/host.py", "inference.engine.vllm_internals"): (
        "imports vLLM, which must not load in a web process that hosts no vLLM engine"
    ),
    ("chatsite/celery.py", "inference.execution.workers"): (
        "chatsite.celery loads with the chatsite package, before Django's apps; the worker's hooks "
        "import the engine runtime once the worker starts"
    ),
    ("chatsite/celery.py", "observability.metrics"): (
        "chatsite.celery loads with the chatsite package, before Django's apps: see above"
    ),
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the project's own modules made inside a function (at any
    depth), those under `if TYPE_CHECKING:` left out."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other, inside)
                continue
            if inside and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names if layer_of(a.name) is not None)
            elif inside and isinstance(child, ast.ImportFrom):
                if child.level:
                    found.append((child.lineno, "." * child.level + (child.module or "")))
                elif child.module and layer_of(child.module) is not None:
                    found.append((child.lineno, child.module))
            visit(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def project_files() -> list[Path]:
    return [path for package in ["chatsite", *APPS] for path in sorted((ROOT / package).rglob("*.py"))]


def imports_inside_functions_unexcused() -> tuple[list[str], set[tuple[str, str]]]:
    """The imports inside functions with no reason written for them, and the reasons no import uses."""
    allowed = INSIDE_FUNCTIONS_ALLOWED
    unexcused, used = [], set()
    for path in project_files():
        where = str(path.relative_to(ROOT))
        if path.name == "apps.py":
            continue
        for line, imported in imports_inside_functions(path):
            if (where, imported) in allowed:
                used.add((where, imported))
            else:
                unexcused.append(f"{where}:{line} imports {imported} inside a function")
    return unexcused, set(allowed) - used


def test_no_module_imports_the_projects_modules_inside_a_function():
    unexcused, _ = imports_inside_functions_unexcused()
    assert unexcused == []


def test_every_import_allowed_inside_a_function_is_still_there():
    _, stale = imports_inside_functions_unexcused()
    assert stale == set()


def test_the_check_sees_imports_inside_functions_but_not_type_checking_blocks(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "if TYPE_CHECKING:\n"
        "    from inference.models import Generation\n"
        "def f():\n"
        "    import json\n"
        "    from inference.services import generation_finish\n"
        "    if TYPE_CHECKING:\n"
        "        from inference.held import HeldAnswer\n"
        "    class C:\n"
        "        def g(self):\n"
        "            import accounts.services\n"
        "    return lambda: None\n"
    )
    assert imports_inside_functions(probe) == [(7, "inference.services"), (12, "accounts.services")]
    assert len(project_files()) > 200


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
