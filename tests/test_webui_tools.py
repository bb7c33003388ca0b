"""The chat page's tools (docs/webui.md, Tools) in a real headless Chromium against a real `localgen serve --mcp`
(tests/mcp_server.py: add, leak, crash) and the real SmolLM2. Tools "required" makes an answer's first round a
call, which the server's grammar keeps valid, so the tests know a call comes; what follows it is the model's.
What the page sends is read from its requests (Playwright's request events); where a test needs a call to fail
or the server to refuse one, it changes the page's request on its way (the server's answer stays the server's).
Chromium runs with a bounded JavaScript heap and every wait has a deadline, so a runaway page fails fast."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import browser as chromium
from tests.conftest import ROOT
from tests.test_serve import Server
from tests.test_webui import KEY, Tab, answer_ids, chat_requests

MCP = f"{sys.executable} {ROOT / 'tests' / 'mcp_server.py'}"
TOOLS = {"add", "leak", "crash"}
WAIT_MS = 300_000  # a round of SmolLM2 on two busy cores takes seconds (a minute and more under a full suite's load)
QUESTION = "What is 2 + 3?"
DECLINED = "The user declined to run this tool call."


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("webui-tools")
    env = {**cli_env, "LOCALGEN_HOME": str(d / "home")}
    s = Server(env, "--api-key", KEY, "--mcp", MCP, "-np", "1", "--ctx", "2048")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium.bounded() as b:
        yield b


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:
    t = Tab(browser, server)
    t.page.set_default_timeout(WAIT_MS)
    yield t
    t.close()


def tool_settings(page: Any, mode: str, ask: bool = True, **values: object) -> None:
    """The conversation's settings: Tools `mode`, Ask before each call `ask`, temperature 0 and 60 tokens a
    round unless `values` say otherwise."""
    page.click("#open-settings")
    page.locator("#tools-settings").wait_for(state="visible")
    page.select_option("#tool-mode", mode)
    page.set_checked("#tool-ask", ask)
    for name, value in {"temperature": 0, "max_tokens": 60, **values}.items():
        page.fill(f"#{name}", str(value))
    page.click("#settings-form button[type=submit]")
    page.locator("#settings").wait_for(state="hidden")


def send(page: Any, text: str = QUESTION) -> list[str]:
    """Sends `text`: the answers on screen before it (for finish)."""
    before = answer_ids(page)
    page.fill("#input", text)
    page.press("#input", "Enter")
    return before


def finish(page: Any, before: list[str], timeout_ms: int = WAIT_MS) -> Any:
    """Waits for the answer not among `before` to end, denying any call the model makes after those the test
    ran: the answer's article."""
    for _ in range(10):
        page.wait_for_function("""(before) => {
            const last = [...document.querySelectorAll('article.assistant')].pop();
            if (!last || before.includes(last.dataset.id)) return false;
            return last.querySelector('.tool-status.ask')
                || (!last.classList.contains('pending') && document.getElementById('stop').hidden);
        }""", arg=before, timeout=timeout_ms)
        ask = page.locator("article.assistant").last.locator(".tool-status.ask")
        if not ask.count():
            return page.locator("article.assistant").last
        ask.get_by_role("button", name=re.compile("^Deny ")).click()
    raise AssertionError("the answer went on asking")


def tool_calls(page: Any) -> list[dict[str, Any]]:
    """The bodies of the /tools/call requests the page sends from now on."""
    sent: list[dict[str, Any]] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/tools/call") else None)
    return sent


def stored_answers(page: Any) -> list[dict[str, Any]]:
    """The answers of the conversation on screen as this browser keeps them (IndexedDB)."""
    return list(page.evaluate("""async () => {
        const store = await import('./webui/store.js');
        const id = decodeURIComponent(location.hash.slice(1));
        const conv = await store.get(id);
        return Object.values(conv.messages).filter((m) => m.role === 'assistant')
            .sort((a, b) => a.created - b.created);
    }"""))


def test_the_settings_list_the_servers_tools_and_each_request_offers_them(tab: Tab, tmp_path: Path) -> None:
    """Settings shows the server's tools (name, source, description), auto and asking by default; a request
    with tools on carries them (without their source) and tool_choice auto; with Tools off, none."""
    page = tab.open()
    page.click("#open-settings")
    page.locator("#tools-settings").wait_for(state="visible")
    assert page.input_value("#tool-mode") == "auto" and page.is_checked("#tool-ask")
    assert set(page.locator("#tool-list .tool-name").all_inner_texts()) == TOOLS
    assert all(s.startswith("mcp: ") for s in page.locator("#tool-list .tool-source").all_inner_texts())
    assert "Add two integers." in page.inner_text("#tool-list")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the dialog's Tools fit its width
    dialog = page.locator("#settings")
    assert dialog.evaluate("d => d.scrollWidth") <= dialog.evaluate("d => d.clientWidth")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.click("#settings-cancel")
    sent = chat_requests(page)
    tool_settings(page, "auto", max_tokens=3)
    before = send(page, "Hello")
    finish(page, before)
    assert sent[0]["tool_choice"] == "auto"
    assert {t["function"]["name"] for t in sent[0]["tools"]} == TOOLS
    assert all(set(t) == {"type", "function"} for t in sent[0]["tools"])
    tool_settings(page, "off", max_tokens=3)
    before = send(page, "Hello again")
    finish(page, before)
    assert len(sent) == 2 and "tools" not in sent[1] and "tool_choice" not in sent[1]
    page.click("#open-settings")
    assert page.input_value("#tool-mode") == "off"  # kept with the conversation
    page.click("#settings-cancel")
    # a conversation kept before the page had tools (no `tools`, no rounds): opens as it was, auto and asking
    old = {"name": "Before tools", "system": "", "settings": {}, "current": "a",
           "messages": {"root": {"id": "root", "parent": None, "children": ["q"], "role": "root"},
                        "q": {"id": "q", "parent": "root", "children": ["a"], "role": "user", "content": "Hi"},
                        "a": {"id": "a", "parent": "q", "children": [], "role": "assistant", "content": "Hello!"}}}
    file = tmp_path / "old.json"
    file.write_text(json.dumps(old))
    page.set_input_files("#import-file", str(file))
    page.wait_for_function("() => document.querySelector('#conversations .conv.active .open')?.textContent"
                           " === 'Before tools'")
    assert page.inner_text("article.assistant .body") == "Hello!"
    page.click("#open-settings")
    assert page.input_value("#tool-mode") == "auto" and page.is_checked("#tool-ask")


def test_run_gives_the_mcp_servers_result_to_the_model_and_the_rounds_are_kept(tab: Tab, tmp_path: Path) -> None:
    """Tools required: the first round calls add, shown with its arguments as JSON; Enter in the message box
    does not run it; Run does, on the server's MCP server, and the next round sends the call and a tool
    message with its result. Reload, export JSON and Markdown, and import keep the round."""
    page = tab.open()
    sent = chat_requests(page)
    called = tool_calls(page)
    tool_settings(page, "required")
    before = send(page)
    run = page.get_by_role("button", name="Run add").first
    run.wait_for()
    assert sent[0]["tool_choice"] == "required" and {t["function"]["name"] for t in sent[0]["tools"]} == TOOLS
    block = page.locator("article.assistant .tool-call").first
    args = json.loads(block.locator(".tool-args").inner_text())
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    assert block.locator(".tool-source").inner_text().startswith("mcp: ")
    assert "Waiting for you: Run or Deny the call to add." in page.inner_text("article.assistant .note")
    # and said to a screen reader, once (docs/webui.md)
    page.wait_for_function("() => document.getElementById('announce').textContent"
                           " === 'Waiting for you: Run or Deny the call to add.'")
    page.press("#input", "Enter")  # no shortcut for Run
    assert run.is_visible() and not called
    run.click()
    result = block.locator(".tool-result")
    result.wait_for()
    total = str(args["a"] + args["b"])
    assert result.locator("summary").inner_text() == "Result" and result.locator("pre").inner_text() == total
    assert len(called) == 1 and called[0]["name"] == "add" and json.loads(called[0]["arguments"]) == args
    finish(page, before)
    follow = sent[1]
    assert follow["tool_choice"] in ("auto", "none")
    asked, said, *told = follow["messages"]  # the round's calls (the model may make several), one result each
    assert asked == {"role": "user", "content": QUESTION}
    assert said["role"] == "assistant" and said["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(said["tool_calls"][0]["function"]["arguments"]) == args
    assert [t["tool_call_id"] for t in told] == [c["id"] for c in said["tool_calls"]]
    assert told[0] == {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": total}
    assert all(t["content"] == DECLINED for t in told[1:])  # the others, denied by finish()
    page.reload()
    page.locator("article.assistant .tool-call .tool-result pre").first.wait_for()
    assert page.locator("article.assistant .tool-call .tool-result pre").first.inner_text() == total
    rounds = stored_answers(page)[0]["rounds"]
    assert rounds[0]["tool_calls"][0]["id"] == said["tool_calls"][0]["id"]
    assert rounds[0]["results"][0] == {"tool_call_id": said["tool_calls"][0]["id"], "content": total}
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the block fits the width
    assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
    assert page.locator(".tool-call").first.bounding_box()["width"] <= 390
    page.set_viewport_size({"width": 1280, "height": 800})
    page.click("#open-settings")
    with page.expect_download() as got:
        page.click("#export-json")
    exported = Path(got.value.path()).read_text()
    conv = json.loads(exported)["conversations"][0]
    answer = next(m for m in conv["messages"].values() if m["role"] == "assistant")
    assert answer["rounds"][0]["tool_calls"][0]["function"]["name"] == "add"
    assert answer["rounds"][0]["results"][0]["content"] == total
    with page.expect_download() as got:
        page.click("#export-md")
    md = Path(got.value.path()).read_text()
    pretty = json.dumps(args, indent=2)
    assert f"**Tool call:** `add`\n\n```json\n{pretty}\n```\n\n**Result:**\n\n```\n{total}\n```" in md
    page.click("#settings-cancel")
    file = tmp_path / "chat.json"
    file.write_text(exported)
    page.set_input_files("#import-file", str(file))
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 2")
    page.locator("article.assistant .tool-call .tool-result pre").first.wait_for()
    assert page.locator("article.assistant .tool-call .tool-result pre").first.inner_text() == total
    assert page.locator("article.assistant .tool-call .tool-name").first.inner_text() == "add"


def test_deny_tells_the_model_the_user_declined(tab: Tab) -> None:
    page = tab.open()
    sent = chat_requests(page)
    called = tool_calls(page)
    tool_settings(page, "required")
    before = send(page)
    page.get_by_role("button", name="Deny add").first.click()
    page.locator("article.assistant .tool-call .declined").first.wait_for()
    finish(page, before)
    said, *told = sent[1]["messages"][1:]
    assert told[0] == {"role": "tool", "tool_call_id": said["tool_calls"][0]["id"], "content": DECLINED}
    assert not called  # nothing ran
    assert stored_answers(page)[0]["rounds"][0]["results"][0]["declined"] is True


def test_without_asking_calls_run_at_once_and_regenerate_redoes_the_whole_answer(tab: Tab) -> None:
    page = tab.open()
    sent = chat_requests(page)
    called = tool_calls(page)
    tool_settings(page, "required", ask=False)
    before = send(page)
    first = finish(page, before)
    assert first.locator(".tool-result").count() >= 1 and page.locator(".tool-status.ask").count() == 0
    assert called and called[0]["name"] == "add"
    # SmolLM2 at temperature 0 asks for the same sum again in the next round: that round is dropped (not
    # sent back), and the one after must answer
    repeat = next(k for k, b in enumerate(sent) if b["tool_choice"] == "none")
    assert sent[repeat]["messages"] == sent[repeat - 1]["messages"]
    assert sent[repeat - 1]["tool_choice"] == "auto" and len(sent) == repeat + 1
    before = answer_ids(page)
    rounds_before = len(sent)
    first.get_by_role("button", name="Regenerate").click()
    again = finish(page, before)
    assert again.locator(".count").inner_text() == "2/2"
    redo = sent[rounds_before]
    assert redo["tool_choice"] == "required" and redo["messages"] == [{"role": "user", "content": QUESTION}]
    assert again.locator(".tool-result").count() >= 1
    answers = stored_answers(page)
    assert len(answers) == 2 and all(a["rounds"][0]["results"] for a in answers)


def test_stop_while_asking_ends_the_answer_and_a_reload_mid_call_says_interrupted(tab: Tab) -> None:
    page = tab.open()
    sent = chat_requests(page)
    tool_settings(page, "required")
    send(page)
    page.get_by_role("button", name="Run add").first.wait_for()
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.getElementById('stop').hidden")
    answer = page.locator("article.assistant").last
    # the answer's view is redrawn at the next frame after the stop: wait for it (90 s at most)
    page.wait_for_function("() => [...document.querySelectorAll('article.assistant')].pop()"
                           ".querySelector('.note')?.innerText === 'Stopped.'", timeout=90_000)
    assert answer.locator(".note").inner_text() == "Stopped."
    assert answer.locator(".tool-status").first.inner_text() == "Not run: the answer ended before this call."
    assert len(sent) == 1
    send(page, "And 4 + 4?")
    page.get_by_role("button", name="Run add").first.wait_for()
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 2")
    last = page.locator("article.assistant").last
    assert "The answer was interrupted" in last.locator(".note").inner_text()
    assert last.locator(".tool-status").first.inner_text() == "Not run: the answer ended before this call."


def test_a_failed_call_is_given_to_the_model_and_a_refused_one_ends_the_answer(tab: Tab) -> None:
    """A call whose arguments miss the tool's schema is a result marked as an error, which the next round
    sends; a call the server refuses (no such tool: a 404) ends the answer with the server's reason."""
    page = tab.open()
    sent = chat_requests(page)
    tool_settings(page, "required", ask=False)
    big = int("9" * 500)  # a result of 500 digits: shown folded
    page.route("**/tools/call", lambda route: route.continue_(
        post_data=json.dumps({"name": "add", "arguments": {"a": big, "b": 1}})))
    before = send(page, "What is 9 + 1?")
    result = finish(page, before).locator(".tool-result").first
    assert not result.evaluate("d => d.open") and result.locator("summary").inner_text() == (
        "Result (1 line, 501 characters)")
    result.locator("summary").click()
    assert result.evaluate("d => d.open") and result.locator("pre").inner_text() == str(big + 1)
    page.unroute("**/tools/call")
    page.click("#new-chat")  # a short history again
    tool_settings(page, "required", ask=False)
    page.route("**/tools/call", lambda route: route.continue_(
        post_data=json.dumps({"name": "add", "arguments": {"a": "two", "b": 3}})))
    start = len(sent)
    before = send(page)
    answer = finish(page, before)
    error = answer.locator(".tool-result.error").first
    assert error.locator("summary").inner_text() == "Error"
    reason = error.locator("pre").inner_text()
    assert "add" in reason and "\n" not in reason
    told = sent[start + 1]["messages"][-1]
    assert told["role"] == "tool" and told["content"] == reason
    page.unroute("**/tools/call")
    page.route("**/tools/call", lambda route: route.continue_(
        post_data=json.dumps({"name": "no_such_tool", "arguments": {}})))
    asked = len(sent)
    before = send(page, "And 4 + 4?")
    answer = finish(page, before)
    note = answer.locator(".note").inner_text()
    assert note.startswith("The server did not run add: no tool is named 'no_such_tool'") and "(HTTP 404)" in note
    assert len(sent) == asked + 1  # no round after the refusal
    assert answer.locator(".tool-status").first.inner_text() == "Not run: the answer ended before this call."


def test_an_answer_stops_after_eight_rounds_of_calls(tab: Tab) -> None:
    """Every round made to call add with new numbers (each request, on its way, ends with a user's "Now add N
    and M." and has tool_choice required): eight rounds run, the ninth's calls are shown, not run, and noted."""
    page = tab.open()
    sent = chat_requests(page)
    called = tool_calls(page)

    def forced(route: Any) -> None:
        body = json.loads(route.request.post_data)
        k = len(sent)
        body["tool_choice"] = "required"
        body["tools"] = [t for t in body["tools"] if t["function"]["name"] == "add"]
        body["messages"].append({"role": "user", "content": f"Now add {k + 10} and {k + 21}."})
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", forced)
    tool_settings(page, "required", ask=False)
    before = send(page, "Add some numbers.")
    answer = finish(page, before, timeout_ms=6 * WAIT_MS)  # nine rounds and more, on busy cores
    assert answer.locator(".note").inner_text() == (
        "The model was still calling tools after 8 rounds: its last calls were not run.")
    rounds = stored_answers(page)[0]["rounds"]
    assert len(rounds) == 9 and all(r["results"] for r in rounds[:8]) and rounds[8]["results"] == []
    assert len(sent) >= 9 and len(called) == sum(len(r["tool_calls"]) for r in rounds[:8])  # (+ a dropped repeat)
    assert answer.locator(".tool-call").count() == sum(len(r["tool_calls"]) for r in rounds)
    assert answer.locator(".tool-status").last.inner_text() == "Not run: the answer ended before this call."
