"""Files on the chat page, in a real browser: attach, watch it process, ask, and see the answer's
source (only a passage it cites, above its actions) with its file, its passage opening on a click."""

from __future__ import annotations

import pytest
from django.conf import settings

from accounts.models import User, UserSettings
from conversations.models import Citation
from documents.models import Document
from inference.defaults import DEFAULT_DEPLOYMENT_FIELDS
from inference.engine.tokenizers import tokenizer_for
from inference.models import Generation
from tests.browser.conftest import BROWSER_MARKS, sign_in

pytestmark = BROWSER_MARKS

LIGHT = "The Port Aldwin lighthouse was first lit in 1871 and still guides ships into the harbour."
FACT = "The harbour master of Port Aldwin in 1903 was Eliza Quennell, who kept the tide tables."


@pytest.fixture(autouse=True)
def processed_in_this_process(settings):
    # Whatever the run's topology, the test's server processes uploads itself (no documents worker runs).
    settings.DOCUMENTS_PROCESSING = "thread"


@pytest.mark.parametrize("theme", ["light", "dark"])
async def test_the_attach_button_is_an_icon_that_needs_no_emoji_font(page, theme):
    await sign_in(page, "nell")
    await UserSettings.objects.aupdate_or_create(
        user=await User.objects.aget(username="nell"), defaults={"theme": theme}
    )
    await page.reload()
    attach = page.locator("#attach")
    assert (await attach.text_content()).strip() == "", "no character a font may lack"
    assert await attach.get_attribute("aria-label") == "Attach a file"
    icon = attach.locator("svg")
    box = await icon.bounding_box()
    assert box["width"] >= 16 and box["height"] >= 16
    # Drawn in the text's colour, so it shows in either theme.
    text_colour = await page.evaluate("() => getComputedStyle(document.body).color")
    assert await icon.evaluate("s => getComputedStyle(s).stroke") == text_colour
    button = await attach.bounding_box()
    assert button["width"] >= 24 and button["height"] >= 24
    async with page.expect_file_chooser():
        await attach.click()


async def _sources_and_actions(page) -> list[str]:
    """Where the answer's sources sit among its actions and Regenerate, in the page's order."""
    return await page.locator("article.message.assistant").last.evaluate(
        "a => Array.from(a.children).flatMap(c => c.matches('aside.sources') ? ['sources']"
        " : c.matches('.actions') ? ['actions'] : c.matches('button.regenerate') ? ['regenerate'] : [])"
    )


async def test_an_attached_file_answers_a_question_and_only_the_passages_cited_are_shown(page):
    await sign_in(page, "nora")
    # A new chat has no conversation yet: the files go into the library, which every chat uses.
    for name, text in (
        ("harbour.md", f"# Harbour history\n\n{FACT}\n"),
        ("lighthouse.md", f"# Lighthouse\n\n{LIGHT}\n"),
    ):
        await page.set_input_files(
            "#attach-input", files=[{"name": name, "mimeType": "text/markdown", "buffer": text.encode()}]
        )
        await page.locator("#attachments .chip .chip-name").filter(has_text=name).wait_for()
    chip = page.locator("#attachments .chip").first
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#attachments .chip')].filter(c => c.dataset.status === 'ready').length"
        " === 2",
        timeout=120_000,
    )
    assert await chip.locator(".chip-status").text_content() == "ready"

    # The scripted engine's answer quotes the question, so it cites [1] and nothing else.
    await page.fill("#input", "From [1]: who was the harbour master of Port Aldwin in 1903?")
    await page.keyboard.press("Enter")
    answer = page.locator("article.message.assistant").last
    await page.wait_for_selector("article.message.assistant[data-status=complete] aside.sources details.source")
    await answer.locator("button.regenerate").wait_for()
    # Both files' passages were quoted in the prompt; the answer cites only the first.
    assert await Citation.objects.filter(withheld=False).acount() == 2
    assert await answer.locator("details.source").count() == 1
    summary = answer.locator("details.source summary").first
    assert (await summary.text_content()).startswith("[1] harbour.md")
    assert LIGHT not in await answer.locator("aside.sources").text_content()
    passage = answer.locator("details.source blockquote").first
    assert not await passage.is_visible()
    await answer.locator("a.citation").first.click()  # the [1] in the answer opens it
    assert await passage.is_visible() and await passage.text_content() == FACT
    assert await _sources_and_actions(page) == ["sources", "actions", "regenerate"]

    # The passage was in the answer's prompt, marked as quoted material, and the citation is stored.
    generation = await Generation.objects.alatest("created_at")
    tokenizer = tokenizer_for(str(settings.INFERENCE_MODELS_DIR / DEFAULT_DEPLOYMENT_FIELDS["model"]))
    prompt = tokenizer.decode(generation.prompt_token_ids)
    assert FACT in prompt and LIGHT in prompt and "quoted material" in prompt
    assert await Citation.objects.filter(number=1, file_name="harbour.md", passage=FACT).aexists()

    # After a reload the page draws the same source itself, in the same place.
    await page.reload()
    await page.locator("article.message.assistant aside.sources details.source").first.wait_for()
    await page.locator("article.message.assistant .actions button.rate-up").wait_for()
    assert await page.locator("article.message.assistant details.source").count() == 1
    assert await page.locator("article.message.assistant details.source summary").first.text_content() == (
        "[1] harbour.md · Harbour history"
    )
    assert await _sources_and_actions(page) == ["sources", "actions", "regenerate"]


async def test_a_file_dropped_on_a_conversation_is_attached_to_it(page):
    await sign_in(page, "otto")
    await page.fill("#input", "Hello")
    await page.keyboard.press("Enter")
    await page.wait_for_selector(
        "article.message.assistant[data-status=complete], article.message.assistant[data-status=failed]"
    )
    await page.evaluate(
        """() => {
          const data = new DataTransfer();
          data.items.add(new File(["# Notes\\n\\nOtters hold hands while they sleep."], "otters.md", {type: "text/markdown"}));
          const chat = document.getElementById("chat");
          chat.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true, cancelable: true}));
          chat.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
        }"""
    )
    await page.wait_for_selector('#attachments .chip[data-status="ready"]', timeout=120_000)
    document = await Document.objects.select_related("conversation_link").aget(name="otters.md")
    assert document.conversation_id is not None and not document.library


async def test_an_unreadable_file_says_why(page):
    await sign_in(page, "pia")
    await page.set_input_files(
        "#attach-input", files=[{"name": "tool.exe", "mimeType": "application/octet-stream", "buffer": b"MZ"}]
    )
    await page.wait_for_selector("#request-error:not([hidden])")
    assert "cannot be read here" in await page.locator("#request-error").text_content()
