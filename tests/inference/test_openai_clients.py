"""The OpenAI-compatible API driven by the clients integrators use beside the official one:
LangChain's `ChatOpenAI` (invoke, stream, structured output) and litellm (`acompletion`), against
the running ASGI app. (Tool calling through them is tested with tool calling.)

On the scripted engine: what is tested is that these clients' requests are taken and their answers
parsed and counted; what the real engine makes of the same fields (a schema it holds the answer to,
JSON mode, streaming, usage) is proved with the official client in test_openai_fields.py."""

from __future__ import annotations

import os
from typing import Literal

import pytest
from channels.db import database_sync_to_async
from pydantic import BaseModel, Field

from accounts.services import api_key_create
from billing.models import UsageRecord

pytestmark = [pytest.mark.topology, pytest.mark.django_db(transaction=True)]
MODEL = "smollm2-135m"
# litellm fetches its model price list from the internet when imported unless told to use the
# copy it ships: this machine, like CI's, has no route there.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def key_of(db):
    return database_sync_to_async(lambda user: api_key_create(user=user, name="tests", scopes=["chat"]).key)


def chat_model(server: str, key: str, **options):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL, base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=180, **{"max_tokens": 24, **options}
    )


class City(BaseModel):
    name: Literal["Paris", "Lima", "Oslo"]
    population_millions: int = Field(ge=0, le=50)


async def test_langchain_invokes_and_streams(chat_server, alice, key_of):
    model = chat_model(chat_server, await key_of(alice))
    answer = await model.ainvoke("Say hello to Alice.")
    assert answer.content and answer.response_metadata["finish_reason"] in ("stop", "length")
    assert answer.usage_metadata["output_tokens"] > 0

    chunks = [chunk async for chunk in model.astream("Say hello to Bob.")]
    assert "".join(chunk.content for chunk in chunks).strip()
    assert await UsageRecord.objects.filter(user=alice).acount() == 2


async def test_langchain_structured_output_with_a_json_schema_validates(chat_server, alice, key_of):
    model = chat_model(chat_server, await key_of(alice), max_tokens=60)
    structured = model.with_structured_output(City, method="json_schema", strict=True)
    city = await structured.ainvoke("Name a capital city and its population in millions.")
    assert isinstance(city, City)


# What a small model writes in JSON mode may run past any max_tokens, where sampling and the machine's
# numerics lead it; that JSON mode holds the real engine's answer to an object is proved in
# test_openai_fields.py. Here: LangChain's JSON mode, through the API, parsed.
async def test_langchain_structured_output_in_json_mode_parses(chat_server, alice, key_of):
    model = chat_model(chat_server, await key_of(alice), max_tokens=200)
    structured = model.with_structured_output(method="json_mode")
    tags = await structured.ainvoke("Give three tags for a chat about cooking, as a JSON object.")
    assert isinstance(tags, dict)


async def test_litellm_completes_and_streams(chat_server, alice, key_of):
    import litellm

    key = await key_of(alice)
    common = {
        "model": f"openai/{MODEL}",
        "api_base": f"{chat_server}/v1",
        "api_key": key,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    response = await litellm.acompletion(**common)
    assert response.choices[0].message.content
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.usage.completion_tokens > 0

    stream = await litellm.acompletion(**common, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices).strip()
