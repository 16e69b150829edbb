"""The JSON schema of a `response_format`, checked before anything is queued.

A schema the structured-output backend cannot compile fails in the engine, after the generation is
queued and charged: the client gets a 500 for its own mistake. vLLM's server refuses such a schema
with a 400 before it reaches the engine, and so does this service, in two steps:

- at the edge, with no vLLM import: the schema must be valid against its JSON Schema meta-schema
  (types, keywords, `pattern` and `patternProperties` as regular expressions) and every `$ref` must
  resolve within the schema (nothing is fetched);
- before the completion is queued, the check vLLM's engine makes (`SamplingParams`'s structured
  output validation with the `auto` backend): xgrammar compiles it, or, for the features xgrammar
  lacks, guidance does. What neither backend takes is refused with the backend's reason. That check
  reaches into vLLM's structured-output backends, so it lives behind their fence
  (`structured_outputs_problem` in inference/engine/vllm_server_internals.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

# Where the schema sits in the registry that resolves its `$ref`s: a name no remote schema has.
SCHEMA_URI = "urn:chatsite:response-format"
# Keywords whose values are data, not subschemas: a "$ref" inside them is not a reference.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` is not a usable JSON Schema, in words, or None."""
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"{exc.message} (at '{where or '#'}')" if where else exc.message
    registry = Registry().with_resource(SCHEMA_URI, Resource.from_contents(schema, default_specification=DRAFT202012))
    resolver = registry.resolver(base_uri=SCHEMA_URI)
    for reference, scope in _references(schema, resolver):
        try:
            scope.lookup(reference)
        except Unresolvable:
            return f"The reference '{reference}' does not resolve within the schema."
    return None


def _references(node: Any, resolver: Any) -> Iterator[tuple[str, Any]]:
    """Every `$ref` in the schema, with the resolver of its scope (a nested `$id` starts a new one)."""
    if isinstance(node, list):
        for item in node:
            yield from _references(item, resolver)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):
        resolver = resolver.in_subresource(Resource.from_contents(node, default_specification=DRAFT202012))
    if isinstance(node.get("$ref"), str):
        yield node["$ref"], resolver
    for key, value in node.items():
        if key not in DATA_KEYWORDS:
            yield from _references(value, resolver)
