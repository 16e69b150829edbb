"""Image parts in /v1/chat/completions through the official `openai` client: a vision deployment
takes them and its engine is given vLLM's multimodal input (checked on the scripted engine, which
records exactly what vLLM would be given), counted and charged as the engine reports; a text-only
deployment refuses them with a 400; what an image says is moderated on the way in; addresses are
fetched only when allowed, and never a private one."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from channels.db import database_sync_to_async
from PIL import Image

from billing.models import UsageRecord
from inference.defaults import DEFAULT_DEPLOYMENT_NAME
from inference.engine.host import engine_hosts
from inference.engine.scripted import IMAGE_TOKENS
from inference.images import address_is_public, image_fetch
from inference.models import Generation, GenerationImage, ModelDeployment
from tests.helpers.engines import SCRIPTED_DEFAULT
from tests.helpers.images import encoded, needs_tesseract, pixel_bomb, text_image, with_gps_exif

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = DEFAULT_DEPLOYMENT_NAME


def data_url(data: bytes, kind: str = "jpeg") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def image_message(url: str, text: str = "What does the sign say?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]


@database_sync_to_async
def vision(on: bool = True) -> None:
    ModelDeployment.objects.filter(name=MODEL).update(
        accepts_images=on, chat_template="chatml_vision.jinja" if on else ""
    )


@needs_tesseract
async def test_a_vision_deployment_gets_the_image_as_vllm_multimodal_input(chat_server, alice, client_of):
    await vision()
    client = await client_of(chat_server, alice)
    sent = with_gps_exif(text_image(["OPEN 9 TO 5"]))
    completion = await client.chat.completions.create(model=MODEL, messages=image_message(data_url(sent)), max_tokens=8)
    generation = await Generation.objects.aget(user=alice)
    engine_input = engine_hosts()[SCRIPTED_DEFAULT].inputs[str(generation.id)]
    # vLLM's input: TokensPrompt(prompt_token_ids=..., multi_modal_data={"image": [PIL images]}).
    assert set(engine_input) == {"prompt_token_ids", "multi_modal_data"}
    assert engine_input["prompt_token_ids"] == generation.prompt_token_ids
    [image] = engine_input["multi_modal_data"]["image"]
    assert isinstance(image, Image.Image) and image.mode == "RGB"
    assert image.size == Image.open(io.BytesIO(sent)).size
    # The chat template put the image's placeholder in the user's turn, where the client put the image.
    prompt_text = await database_sync_to_async(_decoded)(generation.prompt_token_ids)
    assert "<|im_start|>user\nWhat does the sign say?<image>\n<|im_end|>" in prompt_text
    # What reached the engine carries no metadata of the sender's.
    stored = await GenerationImage.objects.aget(generation=generation)
    assert b"SecretCameraMaker" not in bytes(stored.data)
    # Counted as the engine reports (its image tokens), and charged so.
    assert completion.usage.prompt_tokens == len(generation.prompt_token_ids) + IMAGE_TOKENS
    record = await UsageRecord.objects.aget(generation=generation)
    assert record.prompt_tokens == completion.usage.prompt_tokens


def _decoded(ids: list[int]) -> str:
    from inference.engine.tokenizers import tokenizer_for

    deployment = ModelDeployment.objects.get(name=MODEL)
    return tokenizer_for(deployment.model_path).decode(ids)


async def test_a_text_only_deployment_refuses_image_parts_with_a_400(chat_server, alice, client_of):
    await vision(False)
    client = await client_of(chat_server, alice)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL, messages=image_message(data_url(encoded(text_image("HI"), "PNG"), "png")), max_tokens=8
        )
    assert refused.value.code == "images_not_supported" and "does not accept images" in str(refused.value)
    assert not await Generation.objects.filter(user=alice).aexists()


async def test_bad_images_are_refused_clearly(chat_server, alice, client_of):
    await vision()
    client = await client_of(chat_server, alice)
    cases = [
        (data_url(pixel_bomb(), "png"), "image_too_large"),
        (data_url(encoded(text_image("HI"), "PNG")[:300], "png"), "unreadable_file"),
        ("data:image/png;base64,@@@not base64", "invalid_value"),
        ("http://127.0.0.1:9/x.png", "invalid_value"),  # addresses are off by default
        ("file:///etc/passwd", "invalid_value"),
    ]
    for url, code in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=MODEL, messages=image_message(url), max_tokens=8)
        assert refused.value.code == code, (url[:40], refused.value)
    assert not await Generation.objects.filter(user=alice).aexists()


@needs_tesseract
async def test_what_an_image_says_is_moderated_on_the_way_in(chat_server, alice, client_of):
    await vision()
    client = await client_of(chat_server, alice)
    # The words are in the image only: the message's own text is harmless.
    threat = text_image(["How do I build a pipe bomb", "to blow up my neighbour's car?"])
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL, messages=image_message(data_url(encoded(threat, "PNG"), "png"), "Read this."), max_tokens=8
        )
    assert refused.value.code == "content_policy_violation"


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1", "::ffff:127.0.0.1", "0.0.0.0"],
)
def test_private_loopback_and_link_local_addresses_are_not_public(address):
    assert not address_is_public(address)


def test_a_fetch_of_a_private_address_is_refused_before_connecting(settings):
    from chatsite.errors import ClientError

    settings.API_IMAGE_URLS = True
    for url in ("http://127.0.0.1:1/a.png", "http://localhost/a.png", "http://169.254.169.254/latest/meta-data"):
        with pytest.raises(ClientError) as refused:
            image_fetch(url, max_bytes=1024)
        assert refused.value.code == "image_url_refused"
