"""Real clients' tool calling through the API: Open WebUI's request shapes, and langchain-openai.

On the scripted engine, which writes a call of the tool's schema when one is forced or asked for: what
is tested is that the API takes these clients' requests and gives them answers they parse. That the
real model's forced calls are well formed is tested in test_openai_tools.py and in the tool loop's
test on the real engine (tests/orchestration/test_tool_loop.py).

Open WebUI 0.12.4 is not run here (its environment is 7 GB); the requests below are the shapes it
sends, recorded from it running over this API (shared/FACTS.md) and its built-in tools' specs as it
builds them from backend/open_webui/tools/builtin.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from channels.db import database_sync_to_async
from pydantic import BaseModel, Field

from accounts.services import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m"


@pytest.fixture
def key_of(db):
    def make(user) -> str:
        return api_key_create(user=user, name="tests", scopes=["chat", "models:read"]).key

    return database_sync_to_async(make)


# --- Open WebUI 0.12.4 ---------------------------------------------------------------------------------


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


OPEN_WEBUI_BUILTIN_TOOLS = [
    _function("get_current_timestamp", "Get the current Unix timestamp in seconds.", {}, []),
    _function(
        "calculate_timestamp",
        "Get the current Unix timestamp, optionally adjusted by days, weeks, months, or years.",
        {
            "days_ago": {"type": "integer", "description": "Number of days to subtract from current time (default: 0)"},
            "weeks_ago": {"type": "integer", "description": "Number of weeks to subtract (default: 0)"},
            "months_ago": {"type": "integer", "description": "Number of months to subtract (default: 0)"},
            "years_ago": {"type": "integer", "description": "Number of years to subtract (default: 0)"},
        },
        [],
    ),
    _function(
        "search_web",
        "Search the public web for information. Best for current events, external references, or topics not "
        "covered in internal documents.",
        {
            "query": {"type": "string", "description": "The search query to look up"},
            "count": {
                "type": "integer",
                "description": "Number of results to return (default: admin-configured value)",
            },
        },
        ["query"],
    ),
    _function(
        "fetch_url",
        "Fetch and extract the main text content from a web page URL.",
        {"url": {"type": "string", "description": "The URL to fetch content from"}},
        ["url"],
    ),
    _function(
        "search_memories",
        "Search the user's stored memories.",
        {"query": {"type": "string", "description": "What to look for"}},
        ["query"],
    ),
]

CHAT = [{"role": "user", "content": "Hi! What is a good name for a cat?"}]

# Its task requests: one user message holding the instruction and the chat, never max_tokens.
TITLE_PROMPT = (
    "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
    '### Output:\nJSON format: { "title": "your concise title here" }\n'
    "### Chat History:\n<chat_history>\nUSER: Hi! What is a good name for a cat?\nASSISTANT: Try Miso.\n</chat_history>"
)
TAGS_PROMPT = (
    "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history.\n"
    '### Output:\nJSON format: { "tags": ["tag1", "tag2", "tag3"] }\n'
    "### Chat History:\n<chat_history>\nUSER: Hi! What is a good name for a cat?\nASSISTANT: Try Miso.\n</chat_history>"
)


def _sse_events(body: str) -> list[dict]:
    lines = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_open_webuis_streamed_chat_with_its_builtin_tools_is_answered(chat_server, alice, key_of):
    key = await key_of(alice)
    body = {"model": MODEL, "messages": CHAT, "stream": True, "tools": OPEN_WEBUI_BUILTIN_TOOLS}
    async with httpx.AsyncClient(base_url=chat_server, timeout=240) as client:
        response = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    events = _sse_events(response.text)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0]["role"] == "assistant"
    answered = "".join(d.get("content") or "" for d in deltas).strip()
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert answered or calls
    names = {t["function"]["name"] for t in OPEN_WEBUI_BUILTIN_TOOLS}
    assert all(call["function"]["name"] in names for call in calls if "id" in call)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("prompt", "response_format", "key"),
    [
        (TITLE_PROMPT, None, "title"),
        (TAGS_PROMPT, {"type": "json_object"}, "tags"),
    ],
)
async def test_open_webuis_task_requests_without_max_tokens_are_answered(
    chat_server, alice, key_of, prompt, response_format, key
):
    api_key = await key_of(alice)
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": False}
    if response_format:
        body["response_format"] = response_format
    async with httpx.AsyncClient(base_url=chat_server, timeout=240) as client:
        response = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["content"].strip()
    if response_format:  # enforced: the answer parses
        assert isinstance(json.loads(message["content"]), dict)


# --- langchain-openai ----------------------------------------------------------------------------------


class Weather(BaseModel):
    """Look up the current weather in a city."""

    city: str = Field(description="The city", max_length=30)


class Person(BaseModel):
    """A person."""

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


def _chat_model(server: str, key: str):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL, base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=240, max_tokens=120, temperature=0.3
    )


async def test_langchains_bind_tools_makes_a_round_trip(chat_server, alice, key_of):
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = _chat_model(chat_server, await key_of(alice))
    question = HumanMessage("What is the weather in Oslo?")
    called = await llm.bind_tools([Weather], tool_choice="Weather").ainvoke([question])
    (call,) = called.tool_calls
    assert call["name"] == "Weather" and Weather(**call["args"])
    answer = await llm.bind_tools([Weather]).ainvoke(
        [question, called, ToolMessage(content='{"temperature": 4, "sky": "snow"}', tool_call_id=call["id"])]
    )
    assert answer.content or answer.tool_calls


async def test_langchains_structured_output_by_function_calling_validates(chat_server, alice, key_of):
    llm = _chat_model(chat_server, await key_of(alice))
    person = await llm.with_structured_output(Person, method="function_calling").ainvoke(
        "Invent a person with a name and an age."
    )
    assert isinstance(person, Person)
