"""The tools the service runs, on the chat page: each call a collapsed step in its answer (live and
after a reload), the dialog that asks before a call with side effects, the chat's Tools switch and
the composer's `/files`."""

from __future__ import annotations

import asyncio
import re

import pytest
from channels.db import database_sync_to_async

from conversations.models import Conversation, Message
from orchestration.tools.run_code import run_code_available
from tests.browser.conftest import BROWSER_MARKS, sign_in
from tests.orchestration.tools import Echo, Hanging, Sending

pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("short_answers")]

ANSWERED = (
    "() => { const a = document.querySelectorAll('article.message.assistant');"
    " return a.length === 1 && a[0].dataset.status === 'complete' && document.getElementById('stop').hidden; }"
)


async def test_a_tool_call_shows_as_a_collapsed_step_in_its_answer(page, granted_tools):
    await granted_tools(Echo())
    await sign_in(page, "alice")
    await page.check("#tools-toggle")
    await page.fill("#input", "[call echo] hello")
    await page.keyboard.press("Enter")
    await page.wait_for_function(ANSWERED)
    answer = page.locator("article.message.assistant")
    step = answer.locator("details.tool-step")
    assert await step.count() == 1
    assert await step.locator("summary").text_content() == "Used echo"
    assert await step.get_attribute("open") is None and not await step.locator("pre.tool-output").is_visible()
    await step.locator("summary").click()
    assert await step.locator("pre.tool-output").text_content() == "The echo heard: scripted"
    assert await step.locator("pre.tool-arguments").text_content() == '{"text": "scripted"}'
    shown = await answer.locator(".content").text_content()
    assert "tool_call" not in shown.replace("tool_response", "") and shown.startswith("You said")

    # After a reload: the same answer, its step folded into it, and the switch still on.
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    assert await page.locator("article.message").count() == 2
    step = page.locator("article.message.assistant details.tool-step")
    assert await step.locator("summary").text_content() == "Used echo"
    assert await page.is_checked("#tools-toggle")


async def test_a_call_with_side_effects_waits_for_the_persons_answer_in_a_dialog(page, granted_tools):
    sending = await granted_tools(Sending())
    await sign_in(page, "bob")
    await page.check("#tools-toggle")
    await page.fill("#input", "[call send_note] hi")
    await page.keyboard.press("Enter")
    dialog = page.locator("dialog#tool-approval")
    await dialog.wait_for(state="visible")
    assert "send_note" in await dialog.locator(".tool-approval-what").text_content()
    assert await dialog.locator("pre.tool-arguments").text_content() == '{"text": "scripted"}'
    assert sending.runs == []
    await dialog.get_by_role("button", name="Deny").click()
    await page.wait_for_function(ANSWERED)
    summary = page.locator("details.tool-step summary")
    assert await summary.text_content() == "Used send_note (not allowed)"
    assert sending.runs == []

    await page.fill("#input", "[call send_note] again")
    await page.keyboard.press("Enter")
    await dialog.wait_for(state="visible")
    await dialog.get_by_role("button", name="Allow once").click()
    await page.wait_for_function(
        "() => document.querySelectorAll('details.tool-step[data-outcome=ok]').length === 1"
        " && document.getElementById('stop').hidden"
    )
    assert len(sending.runs) == 1


async def test_files_in_the_composer_asks_for_the_search_of_the_persons_files(page, granted_tools):
    await granted_tools("search_files")
    await sign_in(page, "carol")
    assert not await page.is_checked("#tools-toggle")
    await page.fill("#input", "/files tide tables")
    await page.keyboard.press("Enter")
    await page.wait_for_function(ANSWERED)
    summary = page.locator("details.tool-step summary")
    assert await summary.text_content() == "Searched your files for “scripted”"
    user = await database_sync_to_async(Message.objects.get)(role="user")
    assert user.content == "tide tables"
    conversation = await database_sync_to_async(Conversation.objects.get)()
    assert not conversation.tools_enabled


@pytest.mark.skipif(not run_code_available(), reason="the sandbox cannot run on this machine (bubblewrap)")
async def test_run_in_the_composer_asks_then_shows_ran_code_with_its_output(page, granted_tools):
    await granted_tools("run_code")
    await sign_in(page, "dave")
    await page.fill("#input", "/run print(6 * 7)")
    await page.keyboard.press("Enter")
    dialog = page.locator("dialog#tool-approval")
    await dialog.wait_for(state="visible")
    assert "run_code" in await dialog.locator(".tool-approval-what").text_content()
    await dialog.get_by_role("button", name="Allow once").click()
    await page.wait_for_function(ANSWERED)
    step = page.locator("details.tool-step")
    # The scripted engine's program is a value of the tool's schema (`scripted`): Python says so.
    assert (await step.locator("summary").text_content()).startswith("Ran code")
    await step.locator("summary").click()
    assert "NameError" in await step.locator("pre.tool-output").text_content()


@pytest.mark.parametrize("tool", ["echo", "send_note"])
async def test_a_tool_answer_driven_in_one_tab_shows_live_in_another(page, granted_tools, tool):
    echo, sending = await granted_tools(Echo(), Sending())
    await sign_in(page, "erin")
    await page.check("#tools-toggle")
    await page.fill("#input", "hello")
    await page.keyboard.press("Enter")
    await page.wait_for_function(ANSWERED)
    other = await page.context.new_page()
    other.set_default_timeout(90_000)
    await other.goto(page.url)  # the same conversation, in a second tab
    await other.wait_for_selector("#chat[data-socket=open]", state="attached")

    await page.fill("#input", f"[call {tool}] what is new?")
    await page.keyboard.press("Enter")
    if tool == "send_note":
        # Asked in the tab that sent it; the other shows that the call waits there, and cannot answer it.
        await page.locator("dialog#tool-approval").wait_for(state="visible")
        waiting = other.locator("details.tool-step .tool-waiting")
        await waiting.wait_for(state="attached")
        assert await waiting.text_content() == "Waiting for your answer in the tab that asked"
        assert not await other.locator("dialog#tool-approval").is_visible()
        await page.get_by_role("button", name="Allow once").click()

    await other.wait_for_function(
        "() => { const a = document.querySelectorAll('article.message.assistant');"
        " return a.length === 2 && a[1].dataset.status === 'complete' && document.getElementById('stop').hidden; }"
    )
    answer = other.locator("article.message.assistant").nth(1)
    step = answer.locator("details.tool-step")
    assert await step.count() == 1 and await step.get_attribute("data-outcome") == "ok"
    assert await step.locator("summary").text_content() == f"Used {tool}"
    assert not await step.locator(".tool-waiting").count()
    await step.locator("summary").click()
    said = "The echo heard: scripted" if tool == "echo" else "The note was sent."
    assert await step.locator("pre.tool-output").text_content() == said
    shown = await answer.locator(".content").text_content()
    assert shown.startswith("You said") and "tool_call" not in shown.replace("tool_response", "")
    assert '"arguments"' not in shown
    # The same answer as in the tab that asked; the tool ran once.
    await page.wait_for_function(ANSWERED.replace("a.length === 1 && a[0]", "a.length === 2 && a[1]"))
    asked = await page.locator("article.message.assistant").nth(1).locator(".content").text_content()
    assert shown == asked
    assert len(echo.runs if tool == "echo" else sending.runs) == 1


async def test_a_page_that_lost_its_socket_mid_loop_ends_the_answer_with_a_note(page, granted_tools):
    await granted_tools(Hanging())
    await sign_in(page, "frank")
    dropped = asyncio.Event()

    async def socket_route(ws):
        if dropped.is_set():
            # The next socket, once the server has ended the loop of the one that dropped.
            while not await Message.objects.filter(role="assistant", status="stopped").aexists():  # noqa: ASYNC110 - a row, no event
                await asyncio.sleep(0.1)
            ws.connect_to_server()
            return
        server = ws.connect_to_server()

        def from_server(message):
            if dropped.is_set():
                return
            ws.send(message)
            if '"tool.running"' in str(message):  # the call runs: the connection goes, both ways
                dropped.set()
                asyncio.ensure_future(server.close())
                asyncio.ensure_future(ws.close(code=1006))

        server.on_message(from_server)

    await page.route_web_socket(re.compile(r"/ws/chat/$"), socket_route)
    await page.reload()
    await page.wait_for_selector("#chat[data-socket=open]", state="attached")
    await page.check("#tools-toggle")
    await page.fill("#input", "[call hanging] x")
    await page.keyboard.press("Enter")
    # Reconnected, the page does not wait for ever: the answer ends, its call not run, with a note.
    await page.wait_for_function(
        "() => { const a = document.querySelector('article.message.assistant');"
        " return a && a.dataset.status === 'complete' && document.getElementById('stop').hidden; }"
    )
    answer = page.locator("article.message.assistant")
    assert await answer.locator("details.tool-step").count() == 1
    assert await answer.locator("details.tool-step summary").text_content() == "Used hanging (not run)"
    assert "tab that asked for them" in await answer.locator(".tool-note").text_content()
    assert "tool_call" not in await answer.locator(".content").text_content()
