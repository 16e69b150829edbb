"""Images on the chat page, in a real browser: a screenshot pasted or a picture dropped is attached,
read (its text shown with OCR's confidence), sent with the message as a thumbnail that stays after a
reload, and the answer cites the text read from it (the scripted engine, a text-only model here)."""

from __future__ import annotations

import base64

import pytest

from conversations.models import MessageImage
from documents.models import Document
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.helpers.images import encoded, needs_tesseract, text_image

pytestmark = [*BROWSER_MARKS, needs_tesseract]

SIGN = ["HARBOUR MASTER 1903", "ELIZA QUENNELL"]

PASTE = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "screenshot.png", {type: "image/png"}));
  document.getElementById("input").dispatchEvent(
    new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
}"""

DROP = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "photo.jpg", {type: "image/jpeg"}));
  const chat = document.getElementById("chat");
  chat.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true, cancelable: true}));
  chat.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
}"""


@pytest.fixture(autouse=True)
def processed_in_this_process(settings):
    settings.DOCUMENTS_PROCESSING = "thread"


async def _ready_chip(page, name: str):
    chip = page.locator("#attachments .chip.image").filter(has_text=name)
    await chip.wait_for()
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#attachments .chip.image')].some(c => c.dataset.status === 'ready')",
        timeout=120_000,
    )
    return chip


async def test_a_pasted_screenshot_is_read_sent_as_a_thumbnail_and_cited(page):
    await sign_in(page, "pia")
    await page.evaluate(PASTE, base64.b64encode(encoded(text_image(SIGN), "PNG")).decode())
    chip = await _ready_chip(page, "screenshot.png")
    status = await chip.locator(".chip-status").text_content()
    assert "read from the image (OCR, confidence" in status and "ELIZA QUENNELL" in status

    # The scripted engine's answer quotes the question, so it cites [1].
    await page.fill("#input", "From [1]: who was the harbour master in 1903?")
    await page.keyboard.press("Enter")
    question = page.locator("article.message.user").last
    thumbnail = question.locator(".message-images img")
    await thumbnail.wait_for()
    await page.wait_for_function(
        "() => { const i = document.querySelector('article.message.user .message-images img');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    assert "ELIZA QUENNELL" in await question.locator("figcaption").text_content()
    assert await page.locator("#attachments .chip.image").count() == 0  # it went with the message

    answer = page.locator("article.message.assistant").last
    await page.wait_for_selector("article.message.assistant[data-status=complete] aside.sources details.source")
    summary = await answer.locator("details.source summary").first.text_content()
    assert summary.startswith("[1] screenshot.png · Read from the image by OCR (confidence")
    await answer.locator("a.citation").first.click()
    assert "ELIZA QUENNELL" in await answer.locator("details.source blockquote").first.text_content()
    link = await MessageImage.objects.select_related("document").aget()
    assert (link.document.name, link.sent_as) == ("screenshot.png", "text")

    # After a reload the page draws the thumbnail, its reading and that the model was given the text.
    await page.reload()
    figure = page.locator("article.message.user .message-image").first
    await figure.wait_for()
    await page.wait_for_function(
        "() => { const i = document.querySelector('article.message.user .message-images img');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    assert "confidence" in await figure.locator("figcaption").text_content()
    assert "cannot see images" in await figure.locator(".image-as-text").text_content()


async def test_a_dropped_photo_is_attached_and_sent(page):
    await sign_in(page, "quin")
    await page.evaluate(DROP, base64.b64encode(encoded(text_image(["OPEN 9 TO 5"]), "JPEG")).decode())
    await _ready_chip(page, "photo.jpg")
    assert await Document.objects.filter(name="photo.jpg", kind="image").aexists()
    await page.fill("#input", "When is it open?")
    await page.keyboard.press("Enter")
    await page.locator("article.message.user .message-images img").wait_for()
    await page.wait_for_selector(
        "article.message.assistant[data-status=complete], article.message.assistant[data-status=failed]"
    )
    assert await page.locator("article.message.assistant[data-status=complete]").count() == 1
