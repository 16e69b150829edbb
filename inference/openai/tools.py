"""Tool calling on the OpenAI API, passed through to vLLM's own tool parsers.

A request's `tools` are rendered into the prompt by the deployment's chat template
(`render_chat`); which of vLLM's tool parsers reads the model's output is the deployment's
`tool_parser` (vLLM's `--tool-call-parser`), and a deployment without one refuses `tools`.
The parts vLLM's server uses are used here as it uses them (`serving.py` in
vllm/entrypoints/openai/chat_completion/): the parser class composed by `ParserManager`, its
`adjust_request` for the structured outputs that make `required` and a named function a valid call
(xgrammar structural tags), `parse` for a whole answer and `parse_delta` for a streamed one.

Two choices are this service's, both documented in docs/api.md:
- Every call's arguments follow its tool's schema (vLLM's `--tool-strict-level parameter`): a
  small model's calls are then always valid, and with `auto` it may still answer in text.
- `tool_choice: "none"` leaves the tools out of the prompt (vLLM's
  `--exclude-tools-when-tool-choice-none`), so the model answers in text.

vLLM's serving classes are not its promised Python API: every use of them is in
`inference/engine/vllm_server_internals.py`, behind a check of the release it was written for.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rest_framework import serializers

from chatsite.errors import ClientError
from inference.engine import vllm_server_internals as vllm_server
from inference.engine.tokenizers import tokenizer_for

MAX_TOOLS = 128
TOOLS_MAX_CHARS = 100_000
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOOL_CALL_ID_MAX = 128


# --- the request's fields ------------------------------------------------------------------------------


def tools_validate(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI's function tools, with only the keys vLLM reads; a ValidationError otherwise."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise serializers.ValidationError(f"tools must be a list of up to {MAX_TOOLS} tools.")
    cleaned, names = [], set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise serializers.ValidationError("Each tool must be {'type': 'function', 'function': {...}}.")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise serializers.ValidationError("A function's name must be 1 to 64 letters, digits, '_' or '-'.")
        if name in names:
            raise serializers.ValidationError(f"Two tools are named {name!r}.")
        names.add(name)
        kept: dict[str, Any] = {"name": name}
        if function.get("description") is not None:
            if not isinstance(function["description"], str):
                raise serializers.ValidationError("A function's description must be a string.")
            kept["description"] = function["description"]
        if function.get("parameters") is not None:
            if not isinstance(function["parameters"], dict):
                raise serializers.ValidationError("A function's parameters must be a JSON Schema object.")
            kept["parameters"] = function["parameters"]
        if function.get("strict") is not None:
            if not isinstance(function["strict"], bool):
                raise serializers.ValidationError("A function's strict must be a boolean.")
            kept["strict"] = function["strict"]
        cleaned.append({"type": "function", "function": kept})
    if len(json.dumps(cleaned)) > TOOLS_MAX_CHARS:
        raise serializers.ValidationError(f"The tools are longer than {TOOLS_MAX_CHARS} characters.")
    return cleaned


def tool_choice_validate(choice: Any) -> str | dict[str, Any] | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
    ):
        raise serializers.ValidationError(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}."
        )
    return {"type": "function", "function": {"name": function["name"]}}


def tool_fields_check(data: dict[str, Any]) -> dict[str, Any]:
    """The tool fields together: a choice that names or requires a tool needs it in `tools`.
    Without tools, `tool_choice` "none" or "auto" asks for nothing and is dropped."""
    tools, choice = data.get("tools"), data.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise serializers.ValidationError({"tool_choice": "A tool_choice that calls a tool needs tools."})
        data.pop("tool_choice", None)
        return data
    if choice is None:
        data["tool_choice"] = "auto"  # OpenAI's default once there are tools
    elif isinstance(choice, dict) and choice["function"]["name"] not in {t["function"]["name"] for t in tools}:
        raise serializers.ValidationError({"tool_choice": f"No tool is named {choice['function']['name']!r}."})
    return data


class ToolFieldsSerializer(serializers.Serializer):
    """`tools`, `tool_choice` and `parallel_tool_calls`: a base of the chat completion serializer."""

    tools = serializers.JSONField(required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    parallel_tool_calls = serializers.BooleanField(required=False, allow_null=True)

    def validate_tools(self, tools: Any) -> list[dict[str, Any]] | None:
        return tools_validate(tools)

    def validate_tool_choice(self, choice: Any) -> str | dict[str, Any] | None:
        return tool_choice_validate(choice)


def tool_message_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The tool-calling keys of a message: an assistant's `tool_calls`, a tool result's
    `tool_call_id`. Arguments must be JSON, as the chat template writes them as objects."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= TOOL_CALL_ID_MAX:
            raise serializers.ValidationError("A tool message needs its tool_call_id.")
        return {"tool_call_id": call_id}
    calls = message.get("tool_calls")
    if role != "assistant" or not calls:
        return {}
    if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise serializers.ValidationError("An assistant's tool_calls must be a list of tool calls.")
    cleaned = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id"), str)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise serializers.ValidationError(
                "Each tool call needs an id, type 'function' and a function with a name and its arguments."
            )
        try:
            json.loads(function["arguments"])
        except ValueError:
            raise serializers.ValidationError("A tool call's arguments must be JSON.") from None
        cleaned.append(
            {
                "id": call["id"][:TOOL_CALL_ID_MAX],
                "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]},
            }
        )
    return {"tool_calls": cleaned}


def tools_in_prompt(request: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools the chat template renders: none when the choice is "none"."""
    if request.get("tool_choice") == "none":
        return None
    return request.get("tools")


def tool_calling(request: dict[str, Any]) -> bool:
    """Whether the answer is read for tool calls."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def tools_check(request: dict[str, Any], *, deployment: Any) -> None:
    """A deployment that cannot call tools refuses them (`tool_choice: "none"` asks for nothing)."""
    if tool_calling(request) and not deployment.tool_parser:
        raise ClientError(
            f"Unsupported parameter: 'tools'. The model '{deployment.name}' cannot call tools.",
            code="unsupported_parameter",
            param="tools",
        )


# --- vLLM's parsers ------------------------------------------------------------------------------------


def vllm_request(request: dict[str, Any]) -> Any:
    """vLLM's own ChatCompletionRequest for the tool fields, which its parsers read."""
    fields: dict[str, Any] = {
        "model": request["model"],
        "messages": request["messages"],
        "tools": request["tools"],
        "tool_choice": request["tool_choice"],
    }
    if request.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = request["parallel_tool_calls"]
    if request.get("response_format"):
        fields["response_format"] = request["response_format"]
    return vllm_server.chat_request(fields)


def tool_sampling(request: dict[str, Any], *, deployment: Any) -> dict[str, Any]:
    """The SamplingParams fields (as JSON) vLLM's parser sets for the request's tools: the
    structured outputs that hold calls to their tools' schemas (and a forced call for `required`
    and a named function), and `skip_special_tokens` where call markers are special tokens."""
    if not tool_calling(request):
        return {}

    tokenizer = tokenizer_for(deployment.model_path)
    try:
        sampling = vllm_server.tool_sampling(deployment.tool_parser, tokenizer, vllm_request(request))
    except vllm_server.Refused as exc:
        raise ClientError(f"Invalid 'tool_choice': {exc}", code="invalid_value", param="tool_choice") from None
    if "structured_outputs" in sampling:
        _grammar_check(sampling["structured_outputs"])
    return sampling


def _grammar_check(structured: dict[str, Any]) -> None:
    """A tool schema xgrammar cannot compile is the client's error, not a failed generation: the
    check vLLM's engine makes on the request, made before anything is queued."""
    problem = vllm_server.xgrammar_problem(structured)
    if problem is not None:
        raise ClientError(f"Invalid 'tools': {problem}", code="invalid_value", param="tools")


class ToolCallReader:
    """Reads one choice's answer for tool calls with the deployment's vLLM parser: whole, or
    delta by delta as it streams (one reader per choice: vLLM's parsers keep state)."""

    def __init__(self, request: dict[str, Any], *, deployment: Any, tokenizer: Any) -> None:
        self._request = vllm_request(request)
        self._parser = vllm_server.tool_parser(deployment.tool_parser, tokenizer, self._request)
        self._named = isinstance(request.get("tool_choice"), dict)
        self._single = request.get("parallel_tool_calls") is False
        self.called = False

    def complete(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The message's content and its tool calls (OpenAI's shape, with ids)."""
        content, tool_calls = vllm_server.tool_calls_parsed(self._parser, text, self._request)
        if self._single:
            tool_calls = tool_calls[:1]
        self.called = bool(tool_calls)
        return (content or None) if tool_calls else content, tool_calls

    def delta(self, text: str, *, finished: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
        """What a streamed delta adds: content, and tool call deltas in OpenAI's format (the first
        of each call with its index, id, type and name; then its argument fragments)."""
        parsed = vllm_server.tool_call_deltas(self._parser, text, self._request, finished=finished)
        if parsed is None:
            return None, []
        content, deltas = parsed
        calls = []
        for delta in deltas:
            if self._single and delta.get("index") != 0:
                continue
            if "id" in delta:
                delta["type"] = "function"
                delta.setdefault("function", {}).setdefault("arguments", "")
            calls.append(delta)
        self.called = self.called or bool(calls)
        return content or None, calls

    def finish_reason(self, reason: str) -> str:
        """`tool_calls` for an answer that called tools, except a named function's, which OpenAI
        and vLLM end with `stop`."""
        return "tool_calls" if self.called and not self._named and reason == "stop" else reason


def tool_call_readers(request: dict[str, Any], *, deployment: Any, n: int) -> list[ToolCallReader] | None:
    """One reader per choice, or None when the answer is not read for tool calls."""
    if not tool_calling(request):
        return None

    tokenizer = tokenizer_for(deployment.model_path)
    return [ToolCallReader(request, deployment=deployment, tokenizer=tokenizer) for _ in range(n)]


def tool_fields_kept(request: dict[str, Any]) -> dict[str, Any]:
    """What a generation keeps of a tool request (`Generation.tool_fields`): enough to read its output
    for calls again, as `tool_call_reader_for` does."""
    return {"tools": request.get("tools") or [], "tool_choice": request.get("tool_choice")}


def tool_call_reader_for(*, fields: dict[str, Any], deployment: Any) -> ToolCallReader | None:
    """A reader of a generation's output from the tool fields it kept; None when it is not read for
    calls (no fields, a `tool_choice` of "none", or a deployment without a tool parser)."""
    if not fields or not deployment.tool_parser:
        return None
    request = {"model": deployment.name, "messages": [{"role": "user", "content": ""}], **fields}
    readers = tool_call_readers(request, deployment=deployment, n=1)
    return readers[0] if readers else None
