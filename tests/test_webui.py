"""The chat page `localgen serve` gives browsers at `/` (docs/webui.md), in a real headless Chromium (tests/browser.py)
against a real server and the real SmolLM2: one server (with an API key, and a projector so that SmolLM2 takes
images) and one browser for the module, a fresh browser context (its own storage) per test. What the answers
say is the model's; where a test needs an exact answer (the hostile one) it asks the server for it through a
JSON schema, the grammar path every client may use."""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from localgen.serve.page import FILES
from tests import browser as chromium
from tests.conftest import ROOT
from tests.test_serve import Server

KEY = "sk-webui-test"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TIMEOUT_MS = 180_000  # two shared cores: a slow answer is still an answer
TITLE = "localgen chat"
# the banner shows the text given (the models listed or not)
BANNER_SHOWS = ("text => !document.getElementById('banner').hidden "
                "&& document.getElementById('banner-text').textContent === text")
# the page is up (its models listed) and its banner shows the text given: a hash handler says what it has to say
# in its own time, and the banner may still show an earlier notice until it does
BANNER_SAYS = f"text => document.querySelectorAll('#model option').length > 0 && ({BANNER_SHOWS})(text)"
# <think> opened by the template's generation prompt: what the model writes next is its reasoning
THINKING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
HOSTILE = ("<script>document.title='pwned-script'</script><img src=x onerror=document.title='pwned-img'> "
           "[click](javascript:document.title='pwned-link')")


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_mmproj import write_mmproj

    d = tmp_path_factory.mktemp("webui")
    env = {**cli_env, "LOCALGEN_HOME": str(d / "home")}  # the preset made below stays out of the session's home
    s = Server(env, "--api-key", KEY, "--mmproj", str(write_mmproj(d / "proj.gguf")), "-np", "2", "--ctx", "2048")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = chromium.missing()
    if why is not None:
        pytest.fail(why)  # never a skip: a page nobody tested is not a page that works
    with chromium.chromium() as b:
        yield b


class Tab:
    """A page in a browser context of its own (its own IndexedDB and sessionStorage), with the script errors
    and Content-Security-Policy refusals it met."""

    def __init__(self, browser: Any, server: Server, viewport: dict[str, int] = DESKTOP) -> None:
        self.context = browser.new_context(viewport=viewport, accept_downloads=True)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"script error: {e}"))
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" and "Content Security Policy" in m.text else None)
        self.url = f"{server.url}/"

    def open(self, key: bool = True) -> Any:
        """The page loaded; with `key`, the key typed into the prompt the first 401 brings, the models listed."""
        page = self.page
        page.goto(self.url)
        if key:
            page.locator("#key-dialog").wait_for(state="visible")
            page.fill("#key-input", KEY)
            page.press("#key-input", "Enter")
            page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
        return page

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Tab]:
    t = Tab(browser, server)
    yield t
    t.close()


def settings(page: Any, **values: object) -> None:
    """The conversation's settings dialog, filled and saved."""
    page.click("#open-settings")
    for name, value in values.items():
        page.fill(f"#{name}", str(value))
    page.click("#settings-form button[type=submit]")
    page.locator("#settings").wait_for(state="hidden")


def answer_ids(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("article.assistant", "as => as.map(a => a.dataset.id)"))


def wait_answer(page: Any, before: list[str]) -> Any:
    """The answer that is not among `before` once it has ended (the Stop button gone): its article."""
    page.wait_for_function("""(before) => {
        const all = [...document.querySelectorAll('article.assistant')];
        const last = all[all.length - 1];
        return last && !before.includes(last.dataset.id) && !last.classList.contains('pending')
            && document.getElementById('stop').hidden;
    }""", arg=before)
    return page.locator("article.assistant").last


def chat_requests(page: Any) -> list[dict[str, Any]]:
    """The bodies of the chat requests the page sends from now on."""
    sent: list[dict[str, Any]] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data))
            if r.url.endswith("/v1/chat/completions") else None)
    return sent


def _until(page: Any, done: Any) -> None:
    """Let the page's events in until `done()` holds (an event Playwright hands over as it is pumped), for at most
    the tests' timeout."""
    for _ in range(TIMEOUT_MS // 100):
        if done():
            return
        page.wait_for_timeout(100)
    raise AssertionError("what was waited for never came")


def ask(page: Any, text: str) -> Any:
    """Sends `text` with Enter and waits for the whole answer."""
    before = answer_ids(page)
    page.fill("#input", text)
    page.press("#input", "Enter")
    return wait_answer(page, before)


def test_every_file_of_the_page_is_served() -> None:
    """The page's folder holds exactly the files serve/page.py serves (a new file must be listed to be served)."""
    from localgen.serve import page

    shipped = {p.name for p in (ROOT / "localgen" / "serve" / "webui").iterdir()}
    assert shipped == set(page.FILES)


def _gate_status(policy: Any, url: str, **headers: str) -> tuple[int, str]:
    """What serve's gate (serve/guard.py) answers a GET to `url` (its Host from the URL) with these headers."""
    from starlette.responses import PlainTextResponse
    from starlette.testclient import TestClient

    from localgen.serve.guard import Gate

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await PlainTextResponse("ok")(scope, receive, send)

    r = TestClient(Gate(ok, policy)).get(url, headers=headers)  # type: ignore[arg-type]
    return r.status_code, r.text


def test_the_page_opened_at_a_lan_address_may_call_back_but_no_dns_name_may() -> None:
    """docs/webui.md: served on 0.0.0.0, the page opened at http://ADDRESS:11435/ sends its calls with that
    Origin, which names the address the request came to: allowed. Another origin, or a DNS name pointed at
    the server (rebinding), is not."""
    import socket

    from localgen.serve.guard import PRIVATE_SUFFIXES, Policy

    lan = Policy(check_host=False)  # as serve sets it on a host that is not loopback
    assert _gate_status(lan, "http://192.168.1.5:11435/v1/models", Origin="http://192.168.1.5:11435")[0] == 200
    assert _gate_status(lan, "http://192.168.1.5/v1/models", Origin="http://192.168.1.5")[0] == 200
    name = socket.gethostname().lower()
    assert _gate_status(lan, f"http://{name}:11435/v1/models", Origin=f"http://{name}:11435")[0] == 200
    # the machine's name under each suffix no public DNS answers (docs/webui.md names them), on the LAN and on
    # loopback alike; under a public name, or another machine's name, still a 403
    short = name.split(".")[0]
    page = re.search(r"followed by\s+((?:`\.[a-z.]+`(?:,\s+|\s+or\s+)?)+)", (ROOT / "docs" / "webui.md").read_text())
    assert page is not None
    suffixes = re.findall(r"`\.([a-z.]+)`", page[1])
    assert sorted(suffixes) == sorted(PRIVATE_SUFFIXES)
    for suffix in suffixes:
        host = f"{short}.{suffix}:11435"
        for policy in (lan, Policy()):
            assert _gate_status(policy, f"http://{host}/v1/models", Origin=f"http://{host}")[0] == 200, host
    for host in (f"{short}.office.internal", f"{short}.evil.example", f"{short}.local.evil.example",
                 f"not{short}.local", "printer.lan"):
        assert _gate_status(lan, f"http://{host}:11435/v1/models", Origin=f"http://{host}:11435")[0] == 403, host
        assert _gate_status(Policy(), f"http://{host}:11435/v1/models")[0] == 403, host
    assert _gate_status(lan, "http://192.168.1.5:11435/v1/models", Origin="http://192.168.1.6:11435")[0] == 403
    assert _gate_status(lan, "http://192.168.1.5:11435/v1/models", Origin="http://192.168.1.5:8080")[0] == 403
    assert _gate_status(lan, "http://evil.example:11435/v1/models", Origin="http://evil.example:11435")[0] == 403
    assert _gate_status(lan, "http://192.168.1.5:11435/v1/models", Origin="null")[0] == 403


def test_behind_a_tls_proxy_the_page_needs_its_origin_allowed_and_the_upstream_host() -> None:
    """docs/webui.md: behind a reverse proxy at https://chat.example.com, serve on loopback sees the proxy's
    Host (the upstream address: allowed) and the page's Origin, which --cors allows; without --cors, a 403
    that names the flag; a proxy that passes the public name as Host gets the DNS-rebinding 403."""
    from localgen.serve.guard import Policy, origins_from

    proxied = Policy(api_key="k", origins=origins_from(["https://chat.example.com"], None))
    page = {"Origin": "https://chat.example.com", "Authorization": "Bearer k"}
    assert _gate_status(proxied, "http://127.0.0.1:11435/v1/models", **page)[0] == 200
    assert _gate_status(proxied, "http://127.0.0.1:11435/v1/models", Origin="https://chat.example.com")[0] == 401
    status, text = _gate_status(Policy(api_key="k"), "http://127.0.0.1:11435/v1/models", **page)
    assert status == 403 and "--cors https://chat.example.com" in text
    status, text = _gate_status(proxied, "http://chat.example.com/v1/models", **page)
    assert status == 403 and "is not this machine's name" in text


def _routes() -> list[tuple[str, str]]:
    """Every route of docs/api.md's table, as (method, path)."""
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("## Routes", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in table.splitlines():
        if row.startswith("| `"):
            out += re.findall(r"`(GET|POST|DELETE|HEAD) (/[^`]*)`", row.split(" | ")[0])
    assert len(out) > 25, "the table's routes were read"
    return out


def test_with_a_key_only_the_page_and_health_answer_without_it(server: Server) -> None:
    """docs/webui.md: the page and its files load without the key (they hold no data), with a CSP that allows
    nothing inline or from elsewhere, and nosniff; every API route (docs/api.md's table) answers 401 without it."""
    from localgen.serve import page

    r = httpx.get(f"{server.url}/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert "<title>localgen chat</title>" in r.text
    for name, kind in page.FILES.items():
        path = "/" if name == "index.html" else f"/webui/{name}"
        a = httpx.get(f"{server.url}{path}", headers={"Accept": "text/html"})
        assert a.status_code == 200 and a.headers["content-type"] == kind, path
        assert a.headers["content-security-policy"] == page.CSP and a.headers["x-content-type-options"] == "nosniff"
        again = httpx.get(f"{server.url}{path}", headers={"Accept": "text/html", "If-None-Match": a.headers["etag"]})
        assert again.status_code == 304 and not again.content
        head = httpx.head(f"{server.url}{path}", headers={"Accept": "text/html"})  # GET's headers (RFC 9110)
        assert head.headers["content-length"] == str(len(a.content)) and not head.content, path
    assert "default-src 'self'; script-src 'self'; style-src 'self';" in page.CSP
    assert "frame-ancestors 'none'" in page.CSP
    # a client that does not ask for HTML gets Ollama's answer at /, as before the page
    assert httpx.get(f"{server.url}/").text == "Ollama is running (localgen)"
    assert httpx.head(f"{server.url}/").status_code == 200
    # the page only when Accept names text/html with a q above 0, at least that of the plain answer
    for accept, wanted in (("text/html;q=0", False), ("text/htmlx", False), ("text/html;q=0.5, */*", False),
                           ("*/*", False), ("text/html;q=nonsense", False), ("text/plain, text/html", True),
                           ("TEXT/HTML ; Q=0.9, text/plain;q=0.8", True)):
        shown = httpx.get(f"{server.url}/", headers={"Accept": accept})
        assert shown.headers["content-type"].startswith("text/html") == wanted, accept
    assert "Accept" in httpx.get(f"{server.url}/").headers["vary"] and "Accept" in r.headers["vary"]
    assert httpx.get(f"{server.url}/webui/nothing.js").status_code == 401
    assert httpx.get(f"{server.url}/webui/nothing.js", headers=_auth()).status_code == 404
    assert httpx.get(f"{server.url}/webui/..%2fapp.py", headers=_auth()).status_code == 404
    answered = []
    for method, path in _routes():
        if path in ("/", "/health", "/v1/health") or path.startswith("/webui/"):  # open (/v1/health as llama-server's)
            continue
        url = server.url + path.replace("{id}", "resp_x")
        r = httpx.request(method, url, json={} if method in ("POST",) else None, timeout=30)
        if r.status_code != 401:
            answered.append(f"{method} {path}: {r.status_code}")
    assert not answered, answered
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/v1/health").status_code == 200


def test_no_webui_turns_the_page_off(cli_env: dict[str, str], server: Server) -> None:
    """`serve --no-webui`: no page; `/` answers Ollama's line to a browser too, the page's files are 404s,
    and the start-up line does not offer the page (the default server's does)."""
    assert "chat page at /" in server.proc.stderr.read().decode()
    s = Server(cli_env, "--no-webui", "--no-on-demand", "-np", "1", "--ctx", "256")
    try:
        r = httpx.get(f"{s.url}/", headers={"Accept": "text/html"})
        assert r.text == "Ollama is running (localgen)" and r.headers["content-type"].startswith("text/plain")
        assert "content-security-policy" not in r.headers
        assert httpx.get(f"{s.url}/webui/app.js").status_code == 404
    finally:
        assert s.stop() == 0
    assert "chat page" not in s.proc.stderr.read().decode()


def test_the_page_asks_for_the_key_once_and_keeps_it_for_the_tab(browser: Any, server: Server) -> None:
    """docs/webui.md: on the first 401 the page asks for the key; a wrong key is asked again; the right one is
    kept in the tab's sessionStorage (a reload does not ask), never in localStorage; a new tab asks again."""
    t = Tab(browser, server)
    page = t.page
    page.goto(t.url)
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible")
    assert page.locator("#model option").count() == 0, "no model listed without the key"
    assert "needs its API key" in page.inner_text("#key-reason")
    page.fill("#key-input", "wrong")
    page.press("#key-input", "Enter")
    page.wait_for_function("() => document.getElementById('key-reason')?.textContent.includes('refused')")
    assert dialog.is_visible()
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert not dialog.is_visible()
    assert page.evaluate("sessionStorage.getItem('localgen.apiKey')") == KEY
    assert page.evaluate("(key) => JSON.stringify(localStorage).includes(key)", KEY) is False
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert not dialog.is_visible(), "asked once: a reload of the tab keeps the key"
    other = t.context.new_page()
    other.goto(t.url)
    other.locator("#key-dialog").wait_for(state="visible")
    other.click("#key-cancel")
    other.wait_for_function("() => !document.getElementById('banner').hidden")
    assert "No API key" in other.inner_text("#banner")
    other.fill("#input", "Hello")  # typed all the same: the banner still says why nothing can answer (it said
    other.press("#input", "Enter")  # only "There is no model to answer yet", and the key was forgotten)
    other.wait_for_function("() => document.getElementById('banner').textContent.includes('no model to answer')")
    assert "There is no model to answer yet: No API key" in other.inner_text("#banner")
    other.click("#banner-retry")  # Retry asks again
    other.locator("#key-dialog").wait_for(state="visible")
    t.close()


def test_an_answer_streams_in_as_markdown_with_its_stats_and_is_kept(tab: Tab) -> None:
    """Enter sends (Shift+Enter is a new line); text shows while the answer is still coming; the settings and
    system prompt go in the request; the stats line; after a reload the conversation is listed and shown."""
    paths: set[str] = set()
    tab.page.on("request", lambda r: paths.add(urlsplit(r.url).path))
    streams: list[dict[str, str]] = []
    tab.page.on("response", lambda r: streams.append(r.headers) if r.url.endswith("/v1/chat/completions") else None)
    page = tab.open()
    offered = [m["id"] for m in httpx.get(f"{tab.url}v1/models", headers=_auth()).json()["data"]]
    assert page.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == offered
    assert "gemma3:270m" in offered  # on demand, not loaded
    assert page.input_value("#model") == "smollm2:135m"
    page.wait_for_function("() => document.getElementById('model-note')?.textContent === 'loaded'")
    settings(page, max_tokens=64, temperature=0, seed=7, top_k=20, system="Answer in one sentence.")
    sent = chat_requests(page)
    page.click("#input")
    page.keyboard.type("Why is the sky blue?")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("Explain briefly.")
    assert page.input_value("#input") == "Why is the sky blue?\nExplain briefly."
    assert page.locator("article").count() == 0, "Shift+Enter did not send"
    page.keyboard.press("Enter")
    partial = streaming(page, [])
    article = wait_answer(page, [])
    whole = article.locator(".body").inner_text()
    assert len(whole) > len(partial), "text came before the answer ended"
    body = sent[0]
    assert streams[0]["content-type"].startswith("text/event-stream") and streams[0]["x-accel-buffering"] == "no"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "smollm2:135m" and body["max_tokens"] == 64 and body["temperature"] == 0
    assert body["seed"] == 7 and body["top_k"] == 20 and "top_p" not in body
    assert "tools" not in body and "tool_choice" not in body  # a server without tools (GET /tools: none)
    assert body["messages"] == [{"role": "system", "content": "Answer in one sentence."},
                                {"role": "user", "content": "Why is the sky blue?\nExplain briefly."}]
    stats = article.locator(".stats").inner_text()
    assert re.fullmatch(r"\d+ tokens? · \d+\.\d\d s to first token · \d+\.\d tokens/s", stats), stats
    tokens = int(stats.split()[0])
    assert 0 < tokens <= 64
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert page.locator("article.assistant .body").inner_text() == whole
    assert page.locator("article.user .text").inner_text() == "Why is the sky blue?\nExplain briefly."
    assert page.locator("#conversations .conv").count() == 1
    assert page.inner_text("#conversations .conv .open") == "Why is the sky blue?"
    page.goto(tab.url)  # no conversation in the address: a new chat, the kept one listed
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 1")
    assert page.locator("article").count() == 0
    page.click("#conversations .conv .open")
    assert page.locator("article.assistant .body").inner_text() == whole
    assert page.locator("article.assistant .stats").inner_text() == stats
    page.click("#open-settings")
    assert page.input_value("#system") == "Answer in one sentence." and page.input_value("#max_tokens") == "64"
    assert page.locator("#tools-settings").is_hidden()  # no tools offered: no Tools part
    assert page.locator("#documents-settings").is_hidden()  # no collection offered: no Documents part
    page.click("#settings-cancel")
    # the page called only the public routes any client calls, and nothing but this server
    api = {"/v1/models", "/models", "/api/show", "/v1/chat/completions", "/tools", "/v1/vector_stores"}
    assert api <= paths and paths <= api | {"/"} | {f"/webui/{n}" for n in FILES}, paths
    # kept per address: the same server opened as localhost is another store (and another tab's key)
    other = tab.context.new_page()
    other.goto(tab.url.replace("127.0.0.1", "localhost"))
    other.fill("#key-input", KEY)
    other.press("#key-input", "Enter")
    other.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert other.locator("#conversations .conv").count() == 0


def streaming(page: Any, before: list[str]) -> str:
    """Waits for an answer not among `before` to show text while it is still coming (the Stop button up)."""
    handle = page.wait_for_function("""(before) => {
        const all = [...document.querySelectorAll('article.assistant')];
        const last = all[all.length - 1];
        const text = last && !before.includes(last.dataset.id) ? last.querySelector('.body')?.textContent : '';
        return text.length > 10 && !document.getElementById('stop').hidden && text;
    }""", arg=before)
    return str(handle.json_value())


def test_a_temperature_past_openais_2_is_refused_in_the_settings(tab: Tab) -> None:
    """docs/webui.md: the page asks /v1/chat/completions, whose temperature is OpenAI's 0 to 2: the dialog refuses
    2.5, the field said to be out of range (it took up to 5, and each request was then a 400), and takes 2."""
    page = tab.open()
    page.click("#open-settings")
    page.fill("#temperature", "2.5")
    page.click("#settings-form button[type=submit]")
    assert page.eval_on_selector("#temperature", "e => e.validity.rangeOverflow && e.validationMessage !== ''")
    assert page.locator("#settings").is_visible()
    page.fill("#temperature", "2")
    page.click("#settings-form button[type=submit]")
    page.locator("#settings").wait_for(state="hidden")


def test_stop_and_escape_end_a_long_answer(tab: Tab, server: Server) -> None:
    """The Stop button, and Escape, end the answer under way: its text stays, it says Stopped, and the server
    frees the slot (the page's fetch is aborted, so the request ends). Deleting the conversation stops its
    answer too, and it stays deleted."""
    page = tab.open()
    settings(page, temperature=0)  # SmolLM2's greedy story runs past 400 tokens: each version is long
    page.fill("#input", "Write a long story about a dragon and a knight.")
    page.press("#input", "Enter")
    streaming(page, [])
    page.click("#stop")
    article = wait_answer(page, [])
    assert article.locator(".note").inner_text() == "Stopped."
    text = article.locator(".body").inner_text()
    time.sleep(1)
    assert article.locator(".body").inner_text() == text, "nothing came after Stop"
    ids = answer_ids(page)
    article.get_by_role("button", name="Regenerate").click()
    streaming(page, ids)
    page.keyboard.press("Escape")
    article = wait_answer(page, ids)
    assert article.locator(".note").inner_text() == "Stopped."
    # a conversation deleted while its answer streams stops it and stays deleted
    ids = answer_ids(page)
    page.locator("article.assistant").get_by_role("button", name="Regenerate").click()
    streaming(page, ids)
    page.once("dialog", lambda d: d.accept())
    page.locator("#conversations .conv").get_by_role("button", name=re.compile("^Delete")).click()
    page.wait_for_function("() => document.getElementById('stop').hidden")
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert page.locator("#conversations .conv").count() == 0 and page.locator("article").count() == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/health").json()["models"]["smollm2:135m"]["running"] == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server went on with the stopped answers")


def test_a_reload_or_a_page_left_during_an_answer_says_it_was_interrupted(tab: Tab) -> None:
    """docs/webui.md: an answer still coming when its page was reloaded, or left for another address, keeps what
    came and says it was interrupted, not that the connection to the server was lost: the server ran all along,
    and the stream failed because the page cut it as it went."""
    interrupted = ("The answer was interrupted: the page was closed or reloaded while it came. "
                   "Press Regenerate to ask again.")
    page = tab.open()
    settings(page, temperature=0, max_tokens=1000)  # SmolLM2's greedy story runs past 400 tokens
    page.fill("#input", "Write a long story about a dragon and a knight.")
    page.press("#input", "Enter")
    streaming(page, [])
    page.reload()
    page.wait_for_function("() => document.querySelector('article.assistant .note')?.textContent")
    answer = page.locator("article.assistant")
    assert answer.locator(".note").inner_text() == interrupted
    assert answer.locator(".body").inner_text().strip(), "what came is kept"
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    ids = answer_ids(page)
    answer.get_by_role("button", name="Regenerate").click()
    streaming(page, ids)
    address = page.url
    page.goto("about:blank")
    page.goto(address)
    page.wait_for_function("() => document.querySelector('article.assistant .count')?.textContent === '2/2'"
                           " && document.querySelector('article.assistant .note')?.textContent")
    assert page.locator("article.assistant .note").inner_text() == interrupted

def test_a_hostile_answer_and_message_stay_text(tab: Tab) -> None:
    """An answer that holds <script>, <img onerror> and a javascript: link (the model made to write exactly that
    through a JSON schema of one value, serve's grammar path) is shown as text: no element, no script run; so is
    a user's message that holds it."""
    page = tab.open()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

    def forced(route: Any) -> None:
        body = json.loads(route.request.post_data)
        schema = {"type": "string", "enum": [HOSTILE]}
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", forced)
    settings(page, max_tokens=120)
    article = ask(page, HOSTILE)
    shown = article.locator(".body").inner_text()
    assert shown == json.dumps(HOSTILE), shown  # the model's answer, a JSON string: every character shown
    assert page.locator("article.user .text").inner_text() == HOSTILE
    found = page.evaluate("""() => ({
        scripts: document.querySelectorAll('#messages script').length,
        images: document.querySelectorAll('#messages img').length,
        links: [...document.querySelectorAll('#messages a')].map(a => a.href),
        title: document.title})""")
    assert found == {"scripts": 0, "images": 0, "links": [], "title": TITLE}
    page.unroute("**/v1/chat/completions")
    page.reload()  # and again from the browser's storage
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    assert page.locator("article.assistant .body").inner_text() == shown
    assert page.evaluate("document.querySelectorAll('#messages img, #messages script').length") == 0
    assert page.title() == TITLE and not dialogs


def test_edit_and_regenerate_make_branches(tab: Tab) -> None:
    """Regenerate adds a version of the answer, editing a message a version of the message (with its own
    answer), editing an answer a version of the answer; ‹ n/m › steps through them (each version shows its
    latest answer), and the branch on screen is kept across a reload. The name set in Settings is listed."""
    page = tab.open()
    settings(page, max_tokens=6, **{"conv-name": "Greetings"})
    first = ask(page, "Say hello.")
    assert page.inner_text("#conversations .conv .open") == "Greetings"
    text1 = first.locator(".body").inner_text()
    ids = answer_ids(page)
    first.get_by_role("button", name="Regenerate").click()
    second = wait_answer(page, ids)
    assert second.locator(".versions .count").inner_text() == "2/2"
    text2 = second.locator(".body").inner_text()
    second.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('article.assistant .versions .count')?.textContent === '1/2'")
    assert page.locator("article.assistant .body").inner_text() == text1
    ids = answer_ids(page)
    page.locator("article.user").get_by_role("button", name="Edit").click()
    page.fill("article.user textarea", "Say goodbye.")
    page.press("article.user textarea", "Enter")
    wait_answer(page, ids)
    user = page.locator("article.user")
    assert user.locator(".text").inner_text() == "Say goodbye."
    assert user.locator(".versions .count").inner_text() == "2/2"
    assert page.locator("article.assistant .versions").count() == 0, "the edited message has one answer so far"
    answer = page.locator("article.assistant")
    answer.get_by_role("button", name="Edit").click()
    page.fill("article.assistant textarea", "Goodbye, **friend**.")
    page.locator("article.assistant").get_by_role("button", name="Save").click()
    page.wait_for_function("() => document.querySelector('article.assistant .versions .count')?.textContent === '2/2'")
    assert page.locator("article.assistant .body").inner_text() == "Goodbye, friend."
    assert page.locator("article.assistant .body strong").inner_text() == "friend"
    saved_edit(page, "Goodbye, **friend**.")  # the screen shows it before IndexedDB's write commits
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('article.user').length === 1")
    assert page.locator("article.user .text").inner_text() == "Say goodbye."
    assert page.locator("article.assistant .body").inner_text() == "Goodbye, friend."
    page.locator("article.user").get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'Say hello.'")
    # back on a message, its branch shows its latest answer
    assert page.locator("article.assistant .versions .count").inner_text() == "2/2"
    assert page.locator("article.assistant .body").inner_text() == text2
    # a write the browser never commits (a reload, a closed tab, before IndexedDB's transaction ends) is not lost:
    # here every write of this page's life aborts, as the reload would cut it
    page.evaluate("""() => {
        const open = IDBDatabase.prototype.transaction;
        IDBDatabase.prototype.transaction = function (names, mode) {
            const tx = open.call(this, names, mode);
            if (mode === 'readwrite') setTimeout(() => { try { tx.abort(); } catch (e) {} }, 0);
            return tx;
        };
    }""")
    page.locator("article.assistant").get_by_role("button", name="Edit").click()
    page.fill("article.assistant textarea", "Bye for now.")
    page.locator("article.assistant").get_by_role("button", name="Save").click()
    page.wait_for_function("() => document.querySelector('article.assistant .body')?.textContent === 'Bye for now.'")
    page.reload()
    page.wait_for_function("() => document.querySelector('article.assistant .body')?.textContent === 'Bye for now.'")
    saved_edit(page, "Bye for now.")  # and now in IndexedDB, the note gone
    assert page.evaluate("() => Object.keys(localStorage).filter(k => k.startsWith('localgen-chat-pending:'))") == []


def stored_roles(page: Any) -> list[list[list[Any]]]:
    """Every conversation in the browser's storage, as its messages' roles and whether each is unfinished."""
    return list(page.evaluate("""async () => (await (await import('./webui/store.js')).all())
        .map(c => Object.values(c.messages).filter(m => m.role !== 'root').map(m => [m.role, !!m.pending]).sort())"""))


def test_a_run_that_fails_while_it_is_drawn_leaves_the_page_able_to_send(tab: Tab) -> None:
    """The page's one run is claimed before its first await; a throw while the run is drawn (here the address bar's
    replaceState, which Safari refuses past its rate) ends that run with an error and lets the claim go: the next
    message is answered (the page had stayed claimed for good, every Send doing nothing)."""
    page = tab.open()
    settings(page, max_tokens=3)
    page.evaluate("() => { window.keptReplace = history.replaceState; "
                  "history.replaceState = () => { throw new Error('too many calls'); }; }")
    page.fill("#input", "one")
    page.press("#input", "Enter")

    def errored() -> bool:
        return bool(page.evaluate("""async () => (await (await import('./webui/store.js')).all()).some(
            (c) => Object.values(c.messages).some((m) => m.role === 'assistant' && m.error && !m.pending))"""))

    _until(page, errored)
    page.evaluate("() => { history.replaceState = window.keptReplace; }")
    answer = ask(page, "two")
    assert answer.inner_text().strip(), "the second message was answered"


def test_a_double_click_on_regenerate_or_send_starts_one_answer(tab: Tab) -> None:
    """A double-click on Regenerate, or on an edited message's Send, starts one answer, not two: no answer is kept
    unfinished (said interrupted after a reload) and the edit is filed once."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "Say hi.")
    ids = answer_ids(page)
    page.locator("article.assistant").last.get_by_role("button", name="Regenerate").dblclick()
    wait_answer(page, ids)
    ids = answer_ids(page)
    page.locator("article.user").get_by_role("button", name="Edit").click()
    page.fill("article.user textarea", "Say yes.")
    page.locator("article.user").get_by_role("button", name="Send").dblclick()
    wait_answer(page, ids)
    user, answer = ["user", False], ["assistant", False]
    assert stored_roles(page) == [sorted([user, user, answer, answer, answer])]


def test_conversations_are_renamed_exported_imported_and_deleted(tab: Tab, tmp_path: Path) -> None:
    """The list: rename; export as JSON (every branch) and Markdown; delete (after a confirmation); import the
    JSON back (a conversation of its own); a file that is not an export is refused, nothing kept of it."""
    page = tab.open()
    settings(page, max_tokens=4, system="Be brief.")
    ask(page, "First question")
    answer = page.locator("article.assistant .body").inner_text()
    item = page.locator("#conversations .conv")
    item.get_by_role("button", name="Rename First question").click()
    page.fill("#conversations input.rename", "Renamed chat")
    page.press("#conversations input.rename", "Enter")
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Renamed chat'")
    page.click("#open-settings")
    with page.expect_download() as got:
        page.click("#export-json")
    exported = Path(got.value.path()).read_text()
    doc = json.loads(exported)
    assert doc["format"] == "localgen-chat" and len(doc["conversations"]) == 1
    conv = doc["conversations"][0]
    assert conv["name"] == "Renamed chat" and conv["system"] == "Be brief." and conv["settings"]["max_tokens"] == 4
    with page.expect_download() as got:
        page.click("#export-md")
    assert got.value.suggested_filename == "Renamed chat.md"
    md = Path(got.value.path()).read_text()
    assert md.startswith("# Renamed chat\n\n**System:** Be brief.\n\n## User\n\nFirst question\n\n"
                         "## Assistant (smollm2:135m)")
    cut = "\n\n*Cut short: the answer reached its length limit.*"  # (max_tokens 4: its note, as on the page)
    assert md.rstrip().removesuffix(cut).endswith(answer.strip()), md
    page.click("#settings-cancel")
    page.once("dialog", lambda d: d.accept())
    item.get_by_role("button", name="Delete Renamed chat").click()
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 0")
    assert page.locator("article").count() == 0
    bad = tmp_path / "bad.json"
    broken = {"messages": {"root": {"children": ["x"]}}}  # a message that is not there
    bad.write_text(json.dumps({"format": "localgen-chat", "conversations": [broken]}))
    page.set_input_files("#import-file", str(bad))
    page.wait_for_function("() => document.getElementById('banner-text')?.textContent.includes('cannot be imported')")
    assert page.locator("#conversations .conv").count() == 0
    good = tmp_path / "chats.json"
    good.write_text(exported)
    page.set_input_files("#import-file", str(good))
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 1")
    assert page.inner_text("#conversations .conv .open") == "Renamed chat"
    assert page.locator("article.user .text").inner_text() == "First question"
    assert page.locator("article.assistant .body").inner_text() == answer
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    assert page.locator("article.assistant .body").inner_text() == answer
    page.set_input_files("#import-file", str(good))  # again: a conversation of its own, none replaced
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 2")


def test_reasoning_is_shown_apart_and_folded(tab: Tab, server: Server) -> None:
    """A model whose template opens a thinking block: what it writes there arrives as reasoning_content and is
    shown apart, folded; the model, not loaded before, is said to load with the first message."""
    r = httpx.post(f"{server.url}/api/create", headers=_auth(), json={
        "model": "thinker", "from": "smollm2:135m", "template": THINKING_TEMPLATE, "stream": False})
    assert r.status_code == 200, r.text
    page = tab.open()
    page.select_option("#model", "thinker")
    page.wait_for_function("() => document.getElementById('attach').title === 'thinker takes no images'")  # all asked
    assert page.inner_text("#model-note") == "not loaded yet: the first message loads it"
    settings(page, max_tokens=24, temperature=0)
    page.evaluate("""() => {  // every text the note shows, however briefly
        const note = document.getElementById('model-note');
        window.notes = [];
        new MutationObserver(() => window.notes.push(note.textContent)).observe(note, {childList: true});
    }""")
    page.fill("#input", "Why is the sky blue?")
    page.press("#input", "Enter")
    article = wait_answer(page, [])
    notes = page.evaluate("window.notes")
    assert [n for i, n in enumerate(notes) if i == 0 or notes[i - 1] != n] == ["Loading thinker…", "loaded"]
    details = article.locator("details.reasoning")
    assert details.is_visible() and details.get_attribute("open") is None, "shown, folded"
    assert article.locator("details.reasoning summary").inner_text() == "Reasoning"
    assert not article.locator(".reasoning-text").is_visible()
    details.locator("summary").click()
    assert len(article.locator(".reasoning-text").inner_text()) > 10
    assert article.locator(".reasoning-text").inner_text() not in article.locator(".body").inner_text()
    assert page.inner_text("#model-note") == "loaded"


def test_images_go_to_a_model_that_takes_them_and_errors_are_clear(tab: Tab, server: Server) -> None:
    """SmolLM2 with a projector takes an attached picture (sent as an image_url part); a model without one has
    the attach button off, and an image sent anyway gets the server's reason; a conversation past the window
    says so."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_mmproj import png

    picture = png()
    page = tab.open()
    shown = httpx.post(f"{server.url}/api/show", headers=_auth(), json={"model": "smollm2:135m"}).json()
    assert shown["capabilities"] == ["completion", "vision"]  # Ollama's name, which the page reads
    settings(page, max_tokens=8)
    page.wait_for_function("() => document.getElementById('attach').title === 'Attach an image for smollm2:135m'")
    assert page.is_enabled("#attach")
    sent = chat_requests(page)
    page.set_input_files("#attach-file", files=[{"name": "p.png", "mimeType": "image/png", "buffer": picture}])
    page.locator("#attachments img").wait_for()
    assert page.is_enabled("#send")  # a picture alone is something to send
    article = ask(page, "What is in the picture?")
    assert article.locator(".note").get_attribute("class") == "note" and article.locator(".stats").inner_text()
    parts = sent[-1]["messages"][-1]["content"]
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    assert parts == [{"type": "text", "text": "What is in the picture?"},
                     {"type": "image_url", "image_url": {"url": url}}]
    assert page.locator("article.user img.attached").get_attribute("src", timeout=1000).startswith("data:image/png")
    assert page.locator("#attachments img").count() == 0
    httpx.post(f"{server.url}/api/create", headers=_auth(), json={
        "model": "thinker", "from": "smollm2:135m", "template": THINKING_TEMPLATE, "stream": False})
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    page.select_option("#model", "thinker")
    page.wait_for_function("() => document.getElementById('attach').title === 'thinker takes no images'")
    assert not page.is_enabled("#attach")
    page.evaluate("""(b64) => {  // pasted: refused as the button is (the page takes a picture from the clipboard)
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([bytes], 'p.png', {type: 'image/png'}));
        document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', {clipboardData: data}));
    }""", base64.b64encode(picture).decode())
    page.wait_for_function("() => !document.getElementById('banner').hidden")
    assert page.inner_text("#banner-text") == "thinker takes no images: pick a model that does to send one."
    assert page.locator("#attachments img").count() == 0
    # the conversation's first message holds a picture, which each message sends again: the server refuses it for
    # this model, and the note says which message to edit (each later message met the same error, unexplained)
    article = ask(page, "And now?")
    assert article.locator(".note").inner_text() == (
        "thinker reads text only: it has no multimodal projector (HTTP 400). A message of this conversation holds a "
        "picture, which each message sends again: edit that message to branch off without it, or start a new chat.")
    page.click("#new-chat")
    page.select_option("#model", "smollm2:135m")
    article = ask(page, "word " * 3000)  # a first message: nothing earlier to branch off from
    note = article.locator(".note").inner_text()
    assert note.startswith("Too long for the model's window: the prompt is "), note
    assert note.endswith("context window is 2,048. Send a shorter message."), note
    ask(page, "Hi")
    article = ask(page, "word " * 3000)  # a later message: branch off from an earlier one
    assert article.locator(".note").inner_text().endswith(
        "Start a new chat, or edit an earlier message to branch off with less."), article.locator(".note").inner_text()
    page.select_option("#model", "gemma3:270m")  # a base model: the page says it cannot chat before a message fails
    page.wait_for_function("() => document.getElementById('model-note').textContent.startsWith('a base model')")
    assert page.inner_text("#model-note") == "a base model, with no chat template: it cannot chat; pick another"


def sse(body: str) -> Any:
    """A route handler that answers with this event stream."""
    return lambda route: route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)


def test_an_answer_cut_by_the_servers_limit_is_not_said_cut_at_the_window(tab: Tab) -> None:
    """An answer cut (`length`) without a max_tokens of the conversation's, whose prompt and answer did not fill
    the model's window, was cut by serve's -n: said so, with its tokens; one that filled it, at the window."""
    page = tab.open()
    window = page.evaluate("() => fetch('/v1/models', {headers: {Authorization: 'Bearer ' + sessionStorage"
                           ".getItem(Object.keys(sessionStorage)[0])}}).then(r => r.json()).then(d => d.data[0]"
                           ".max_model_len)")
    for prompt, said in ((10, "the server's limit on an answer (5 tokens: serve -n)"),
                         (window - 5, f"the end of the model's window ({window} tokens)")):
        chunks = [{"choices": [{"index": 0, "delta": {"content": "a b c d e"}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 5}}]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        page.route("**/v1/chat/completions", sse(body))
        note = ask(page, "Go on").locator(".note").inner_text()
        assert note == f"The answer was cut at {said}.", note
        page.unroute("**/v1/chat/completions")


def test_a_server_that_stops_mid_answer_is_told_as_one_gone(tab: Tab) -> None:
    """serve stopped (Ctrl-C, SIGTERM) as it answers ends the stream with `the server is shutting down`: the note
    says what to do then, as for a lost connection (it gave the bare line, and nothing to press)."""
    page = tab.open()
    chunks = [{"choices": [{"index": 0, "delta": {"content": "Half"}}]},
              {"error": {"message": "the server is shutting down", "type": "server_error", "code": 503}}]
    page.route("**/v1/chat/completions", sse("".join(f"data: {json.dumps(c)}\n\n" for c in chunks)))
    note = ask(page, "Go on").locator(".note").inner_text()
    assert note == ("the server is shutting down. Your messages are kept: press Regenerate once the server is "
                    "back."), note
    page.unroute("**/v1/chat/completions")


def test_a_request_over_the_body_limit_is_not_called_too_long_for_the_window(tab: Tab) -> None:
    """Pictures that make the request larger than serve's --max-body (16 MiB by default) get the server's own
    reason, which names the flag, with its status and what to do: not the advice for a conversation past the
    model's window."""
    page = tab.open()
    settings(page, max_tokens=4)
    big = b"\x89PNG\r\n\x1a\n" + bytes(6 << 20)  # three of these are 24 MiB once in base64
    page.set_input_files("#attach-file", files=[
        {"name": f"p{k}.png", "mimeType": "image/png", "buffer": big} for k in range(3)])
    page.wait_for_function("() => document.querySelectorAll('#attachments img').length === 3")
    note = ask(page, "Three pictures.").locator(".note").inner_text()
    assert note == ("the request body is over the limit of 16,777,216 bytes (serve --max-body) (HTTP 413). Each "
                    "message sends the conversation's pictures again: start a new chat to send fewer."), note


def test_a_text_request_over_the_body_limit_is_not_told_to_send_fewer_pictures(tab: Tab) -> None:
    """A conversation without pictures over serve's --max-body (as the server refuses it) is told to send less,
    not fewer pictures."""
    page = tab.open()
    said = {"error": {"message": "the request body is over the limit of 16,777,216 bytes (serve --max-body)"}}
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=413, headers={"Content-Type": "application/json"}, body=json.dumps(said)))
    note = ask(page, "A long text.").locator(".note").inner_text()
    assert note == ("the request body is over the limit of 16,777,216 bytes (serve --max-body) (HTTP 413). Each "
                    "message sends the whole conversation again: start a new chat, or send less."), note
    page.unroute("**/v1/chat/completions")


# markdown.js's render of a text, as the DOM's HTML (page.evaluate(RENDER, text))
RENDER = """async (src) => {
    const m = await import('./webui/markdown.js');
    const d = document.createElement('div');
    d.append(m.render(src));
    return d.innerHTML;
}"""

def test_markdown_becomes_nodes_never_html(tab: Tab) -> None:
    """markdown.js: the subset it renders, as the DOM it builds; HTML in the text stays text; links only for
    http, https and mailto; a code block's Copy button copies its code."""
    page = tab.open()
    render = RENDER
    cases = {
        "# Title\n\nSome *em*, _em_, **strong**, ~~gone~~ and `a <b>`.":
            "<h1>Title</h1><p>Some <em>em</em>, <em>em</em>, <strong>strong</strong>, <del>gone</del> and "
            "<code>a &lt;b&gt;</code>.</p>",
        "- a\n- b\n  - c\n\n1. x\n2. y":
            "<ul><li>a</li><li>b<ul><li>c</li></ul></li></ul><ol><li>x</li><li>y</li></ol>",
        "one\ntwo\n\n> quoted\n\n---":
            "<p>one<br>two</p><blockquote><p>quoted</p></blockquote><hr>",
        "[ok](https://example.com/a) [bad](javascript:alert(1)) see https://example.org. mail [me](mailto:a@b.c)":
            '<p><a href="https://example.com/a" target="_blank" rel="noopener noreferrer nofollow">ok</a> '
            "[bad](javascript:alert(1)) see "
            '<a href="https://example.org/" target="_blank" rel="noopener noreferrer nofollow">'
            "https://example.org</a>. "
            'mail <a href="mailto:a@b.c" target="_blank" rel="noopener noreferrer nofollow">me</a></p>',
        "| a | b |\n|---|--:|\n| 1 | 2 |":
            '<div class="table"><table><thead><tr><th>a</th><th class="align-right">b</th></tr></thead>'
            '<tbody><tr><td>1</td><td class="align-right">2</td></tr></tbody></table></div>',
        "<script>alert(1)</script><img src=x onerror=alert(2)>":
            "<p>&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;</p>",
        "snake_case_name and 2*3*4 \\*not em\\*": "<p>snake_case_name and 2<em>3</em>4 *not em*</p>",
        "**bold *and em* here** after": "<p><strong>bold <em>and em</em> here</strong> after</p>",
        "1. **Enjoy the Surprise*": "<ol><li>*<em>Enjoy the Surprise</em></li></ol>",  # a stream cut mid-span
        "```python\nprint('<b>')\n```":
            '<div class="code"><div class="code-head"><span class="code-lang">python</span><button class="copy" '
            'type="button" aria-label="Copy the python code">Copy</button></div><pre><code data-lang="python">'
            "print('&lt;b&gt;')</code></pre></div>",
        "```\nstill streaming": '<div class="code"><div class="code-head"><span class="code-lang">text</span>'
            '<button class="copy" type="button" aria-label="Copy the text code">Copy</button></div><pre><code>'
            "still streaming</code></pre></div>",
    }
    for src, html in cases.items():
        assert page.evaluate(render, src) == html, src
    tab.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("""async () => {
        const m = await import('./webui/markdown.js');
        const a = document.createElement('article');
        a.append(m.render("```sh\\nlocalgen serve --host 0.0.0.0\\n```"));
        document.getElementById('messages').append(a);
    }""")
    page.get_by_role("button", name="Copy the sh code").click()
    page.wait_for_function("() => document.querySelector('.code .copy')?.textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == "localgen serve --host 0.0.0.0"


def test_long_runs_of_spaces_render_in_one_pass(tab: Tab) -> None:
    """docs/webui.md: a hostile answer does not freeze the page. A heading, a fence or a table's rule line with a
    long run of spaces in it renders in time linear in its length (a pattern that backtracked over the run would
    take many minutes at this length, past the page timeout that bounds the wait); short ones render as before."""
    page = tab.open()
    pad = " " * 1_000_000
    cases = {
        f"# a{pad}b": f"<h1>a{pad}b</h1>",
        f"## a{pad}##": "<h2>a</h2>",
        f"```{pad}`": f"<p>```{pad}`</p>",
        f"a|b\n{pad}x": "<p>a|b<br>x</p>",
        "# Title ##": "<h1>Title</h1>",
        "# Title#": "<h1>Title#</h1>",
        "### ###": "<h3>###</h3>",
        "~~~js more words\nx\n~~~": '<div class="code"><div class="code-head"><span class="code-lang">js</span>'
            '<button class="copy" type="button" aria-label="Copy the js code">Copy</button></div><pre>'
            '<code data-lang="js">x</code></pre></div>',
        "a | b\n  :-- | --  \nc | d": '<div class="table"><table><thead><tr><th>a</th><th>b</th>'
            '</tr></thead><tbody><tr><td>c</td><td>d</td></tr></tbody></table></div>',
    }
    for src, html in cases.items():
        # the page's own timeout bounds the render (page.evaluate waits for ever on a page frozen by it)
        assert page.wait_for_function(RENDER, arg=src, timeout=TIMEOUT_MS).json_value() == html, src[:40]


def test_export_markdown_fences_a_result_of_many_backtick_runs(tab: Tab) -> None:
    """Export Markdown of a tool result with 300,000 runs of backticks: fenced with a fence longer than any run
    (the longest found by a loop: spread into one call, so many runs had made the export fail)."""
    page = tab.open()
    md = page.evaluate("""async () => {
        const tree = await import('./webui/tree.js');
        const transcript = await import('./webui/transcript.js');
        const c = tree.conversation();
        const u = tree.add(c, 'root', {role: 'user', content: 'q'});
        const call = {id: 'c1', type: 'function', function: {name: 'grep', arguments: '{}'}};
        tree.add(c, u.id, {role: 'assistant', content: 'done', rounds: [
            {content: '', tool_calls: [call],
             results: [{tool_call_id: 'c1', content: '`x '.repeat(299999) + '``y'}]}]});
        return transcript.exportMarkdown(c);
    }""")
    assert "**Result:**\n\n```\n`x `x " in md and "``y\n```" in md


def test_export_markdown_says_how_an_answer_that_is_not_whole_ended(tab: Tab) -> None:
    """webui.md: Export Markdown is the branch on screen, notes and all: a failed answer was an empty section, and
    a stopped or cut one read as whole."""
    page = tab.open()
    md = page.evaluate("""async () => {
        const tree = await import('./webui/tree.js');
        const transcript = await import('./webui/transcript.js');
        const c = tree.conversation();
        let at = 'root';
        for (const a of [{content: '', error: {kind: 'http', message: "model 'x' is not served here"}},
                         {content: 'Half an', stopped: true}, {content: 'Cut', finish: 'length'},
                         {content: '', error: {kind: 'interrupted', message: 'The answer was interrupted.'}},
                         {content: 'Whole.', finish: 'stop'}]) {
            at = tree.add(c, tree.add(c, at, {role: 'user', content: 'q'}).id, {role: 'assistant', ...a}).id;
        }
        return transcript.exportMarkdown(c);
    }""")
    answers = [part.split("\n\n", 1)[1].strip() for part in md.split("## Assistant")[1:]]
    assert answers == ["*Failed: model 'x' is not served here*\n\n## User\n\nq",
                       "Half an\n\n*Stopped.*\n\n## User\n\nq",
                       "Cut\n\n*Cut short: the answer reached its length limit.*\n\n## User\n\nq",
                       "*The answer was interrupted.*\n\n## User\n\nq", "Whole."], md


def test_the_content_security_policy_refuses_inline_code_and_other_origins(tab: Tab) -> None:
    """The page's CSP: an inline script or style, and a request to another origin, are refused (and the page
    itself, used in the tests above, never met a refusal: Tab.close checks)."""
    page = tab.open()
    refused = page.evaluate("""() => new Promise((resolve) => {
        const seen = [];
        document.addEventListener('securitypolicyviolation', (e) => seen.push(e.effectiveDirective));
        const s = document.createElement('script');
        s.textContent = 'window.inlineRan = true';
        document.head.append(s);
        const styled = document.createElement('div');
        styled.setAttribute('style', 'color: red');
        document.body.append(styled);
        fetch('http://example.com/').catch(() => {});
        setTimeout(() => resolve({seen: seen.sort(), ran: window.inlineRan === true}), 500);
    })""")
    tab.errors.clear()  # the refusals asked for here
    assert refused == {"seen": ["connect-src", "script-src-elem", "style-src-attr"], "ran": False}


def test_the_page_fits_a_phone_and_a_desktop_in_light_and_dark(browser: Any, server: Server, tmp_path: Path) -> None:
    """At 390 px the list is a drawer (off screen until ☰) and nothing scrolls sideways; at 1280 px it stays
    beside the chat; the colours follow prefers-color-scheme. Screenshots at both widths."""
    t = Tab(browser, server, PHONE)
    page = t.open()
    settings(page, max_tokens=24)
    article = ask(page, "Give me three tips for a picnic, as a list.")
    assert article.locator(".note").inner_text() == "The answer was cut at max_tokens (24)."
    assert page.evaluate("[document.documentElement.scrollWidth, innerWidth]") == [390, 390]
    assert page.evaluate("document.getElementById('messages').scrollWidth <= 390")
    box = page.locator("#sidebar").bounding_box()
    assert box["x"] + box["width"] <= 0, "the list is off screen on a phone"
    assert page.is_visible("#input") and page.is_visible("#send")
    page.focus("#input")
    tabbed = []
    for _ in range(8):  # the closed drawer's buttons are out of the Tab order
        page.keyboard.press("Tab")
        tabbed.append(page.evaluate("document.activeElement.closest('#sidebar') === null"))
    assert all(tabbed), tabbed
    page.click("#open-sidebar")  # open, it has the focus; Escape closes it and gives the focus back to ☰
    page.wait_for_function("() => document.activeElement.id === 'new-chat'")
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    assert page.evaluate("document.activeElement.id") == "open-sidebar"
    page.click("#open-sidebar")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    page.click("#conversations .conv .open")  # picking one closes the drawer
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
    page.screenshot(path=str(tmp_path / "phone.png"))
    page.set_viewport_size(DESKTOP)
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left === 0")
    assert not page.is_visible("#open-sidebar")
    page.screenshot(path=str(tmp_path / "desktop.png"))
    background = "parseInt(getComputedStyle(document.body).backgroundColor.match(/\\d+/)[0])"
    page.emulate_media(color_scheme="light")
    assert page.evaluate(background) > 200
    page.emulate_media(color_scheme="dark")
    assert page.evaluate(background) < 60
    for name, width in (("phone.png", 390), ("desktop.png", 1280)):
        head = (tmp_path / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == width
    t.close()


def user_texts(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("article.user .text", "xs => xs.map(x => x.textContent)"))


def saved_edit(page: Any, text: str) -> None:
    """Wait until the browser's storage holds a message with this text and the conversation's branch on screen
    (`current`) ends at it: a save is written after the screen shows it."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not page.evaluate("""async (text) => (await (await import('./webui/store.js')).all())
            .some(c => c.messages[c.current] && c.messages[c.current].content === text)""", text):
        assert time.monotonic() < deadline, f"{text!r} was never saved as the message on screen"
        time.sleep(0.05)


def stored_user_texts(page: Any) -> list[list[str]]:
    """Every conversation in the browser's storage, as the user messages it holds (every branch)."""
    return list(page.evaluate("""async () => (await (await import('./webui/store.js')).all())
        .map(c => Object.values(c.messages).filter(m => m.role === 'user').map(m => m.content).sort())"""))


def another_tab(tab: Tab, url: str, script: str = "") -> Any:
    """Another page of the tab's browser context (the same storage) opened at `url` (after `script`, run before
    the page's own), the key typed into its prompt."""
    other = tab.context.new_page()
    other.set_default_timeout(TIMEOUT_MS)
    if script:
        other.add_init_script(script)
    other.goto(url)
    other.fill("#key-input", KEY)
    other.press("#key-input", "Enter")
    return other


def test_two_tabs_on_one_conversation_lose_nothing(tab: Tab) -> None:
    """docs/webui.md: conversations are kept in this browser. Two tabs on one conversation: what one sends shows in
    the other, and what either writes is kept; a rename or a delete in one is the other's too. A tab that hears
    nothing (no BroadcastChannel) still loses nothing: each write takes in what another tab added first."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "one")
    other = another_tab(tab, page.url)
    other.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    ask(page, "two")
    other.wait_for_function("() => document.querySelectorAll('article.user').length === 2")  # heard, shown
    ask(other, "three")
    page.wait_for_function("() => document.querySelectorAll('article.user').length === 3")
    assert user_texts(page) == user_texts(other) == ["one", "two", "three"]
    assert stored_user_texts(page) == [["one", "three", "two"]]
    other.get_by_role("button", name="Rename one").click()
    other.fill("#conversations input.rename", "Renamed")
    other.press("#conversations input.rename", "Enter")
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Renamed'")
    ask(page, "four")  # its write keeps the other tab's name
    assert page.evaluate("async () => (await (await import('./webui/store.js')).all())[0].name") == "Renamed"
    deaf = another_tab(tab, page.url, "delete window.BroadcastChannel")  # a tab that hears nothing from the others
    deaf.wait_for_function("() => document.querySelectorAll('article.user').length === 4")
    ask(page, "five")
    ask(deaf, "six")  # on its stale copy: a branch beside "five", which stays
    assert stored_user_texts(page) == [["five", "four", "one", "six", "three", "two"]]
    deaf.close()
    other.once("dialog", lambda d: d.accept())
    other.get_by_role("button", name="Delete Renamed").click()
    page.wait_for_function("() => document.getElementById('banner-text').textContent.includes('in another tab')")
    assert page.locator("article").count() == 0 and page.locator("#conversations .conv").count() == 0
    assert stored_user_texts(page) == []


def test_settings_saved_in_one_tab_keep_a_rename_made_in_another(tab: Tab) -> None:
    """Settings saved in one tab write only what was changed in the dialog: a rename made in another tab while the
    dialog was open stays, and the change made in the dialog is kept with it."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "one")
    other = another_tab(tab, page.url)
    other.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    other.click("#open-settings")
    page.get_by_role("button", name="Rename one").click()
    page.fill("#conversations input.rename", "Renamed")
    page.press("#conversations input.rename", "Enter")
    other.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Renamed'")
    other.fill("#system", "Answer in French.")
    other.click("#settings-form button[type=submit]")
    stored = other.wait_for_function("""async () => {
        const all = (await (await import('./webui/store.js')).all())
            .map(c => [c.name, c.system, c.settings.max_tokens]);
        return all.length === 1 && all[0][1] === 'Answer in French.' && all;
    }""").json_value()
    assert stored == [["Renamed", "Answer in French.", 3]]
    assert page.inner_text("#conversations .conv .open") == "Renamed"


def test_a_name_being_typed_is_kept_when_another_tab_writes(tab: Tab) -> None:
    """The list is drawn again whenever another tab writes a conversation: a rename being typed then was drawn
    over, what was typed lost. The list now waits for the rename to end, and draws itself then."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "one")
    page.get_by_role("button", name="Rename one").click()
    page.fill("#conversations input.rename", "Half typed")
    conv = page.evaluate("async () => (await (await import('./webui/store.js')).all())[0].id")
    # another tab's news, as store.js's channel tells it (a second channel of the name hears the first)
    page.evaluate("id => new BroadcastChannel('localgen-chat').postMessage({kind: 'saved', id})", conv)
    page.wait_for_timeout(300)  # the news is heard within a task; a redraw would have replaced the input
    assert page.locator("#conversations input.rename").count() == 1
    assert page.evaluate("() => document.activeElement.value") == "Half typed"
    page.press("#conversations input.rename", "Enter")
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Half typed'")
    assert page.evaluate("async () => (await (await import('./webui/store.js')).all())[0].name") == "Half typed"


def test_a_message_sent_under_an_unfinished_answer_goes_beside_its_question(tab: Tab) -> None:
    """docs/webui.md: a message sent while another tab is still answering at the end of the branch goes as a new
    branch beside the question being answered (send() files it under tree.askUnder): never under the unfinished
    answer, which the model would be sent empty. Once the answer has ended, a message goes under it as before."""
    page = tab.open()
    got = page.evaluate("""async () => {
        const tree = await import('./webui/tree.js');
        const m = (id, parent, children, role, content, extra) => ({id, parent, children, role, content, ...extra});
        const conv = {id: 'c', current: 'a2', messages: {
            root: {id: 'root', parent: null, children: ['u1'], role: 'root'},
            u1: m('u1', 'root', ['a1'], 'user', 'first'), a1: m('a1', 'u1', ['u2'], 'assistant', 'ok'),
            u2: m('u2', 'a1', ['a2'], 'user', 'from A'), a2: m('a2', 'u2', [], 'assistant', '', {pending: true})}};
        const during = tree.askUnder(conv);
        conv.messages.a2.pending = false;
        return [during, tree.askUnder(conv), tree.damage(conv)];
    }""")
    assert got == ["a1", "a2", ""], got  # "": no damage
    app = Path(__file__).parent.parent / "localgen" / "serve" / "webui" / "app.js"
    assert "const under = tree.askUnder(conv);" in app.read_text(), "send() files a message where askUnder says"


@pytest.mark.parametrize("locks", [True, False], ids=["web-locks", "no-web-locks"])
def test_a_tab_opened_while_another_answers_leaves_that_answer_coming(tab: Tab, locks: bool) -> None:
    """docs/webui.md: a tab opened on a conversation whose answer another tab is still writing (here before its first
    word, as while the model loads: that tab has written nothing since) shows it still coming, not interrupted;
    a message sent there goes as a new branch beside the question being answered, the page says so, and the model
    is not sent the unfinished answer. Once it ends, both are kept. An answer whose tab was closed while it came
    says it was interrupted. So too in a page without Web Locks (over plain http from another machine)."""
    script = "" if locks else "delete Navigator.prototype.locks"
    if script:
        tab.page.add_init_script(script)
    page = tab.open()
    assert page.evaluate("() => Boolean(navigator.locks)") == locks
    settings(page, max_tokens=8)
    held: list[Any] = []
    page.route("**/v1/chat/completions", lambda r: held.append(r))  # held: that tab writes nothing meanwhile
    page.fill("#input", "Tell me about dogs.")
    page.press("#input", "Enter")
    while not held:
        page.wait_for_timeout(50)
    other = another_tab(tab, page.url, script)
    other.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    coming = other.locator("article.assistant")
    assert "pending" in (coming.get_attribute("class") or "")
    assert coming.locator(".note").inner_text() == "", "not said to be interrupted"
    sent = chat_requests(other)
    before = answer_ids(other)
    other.fill("#input", "And cats?")
    other.press("#input", "Enter")
    other.wait_for_function(BANNER_SAYS, arg="The answer at the end of this branch is unfinished (another tab is "
                            "writing it, or was closed while it did): your message went as a new branch beside its "
                            "question (‹ › steps between them).")
    assert wait_answer(other, before).locator(".note").inner_text() in ("", "The answer was cut at max_tokens (8).")
    assert [m["content"] for m in sent[0]["messages"]] == ["And cats?"], "the unfinished answer is never sent"
    held.pop().continue_()
    wait_answer(page, [])
    stored = page.evaluate("""async (id) => {
        const c = await (await import('./webui/store.js')).get(id);
        return Object.values(c.messages).filter(m => m.role !== 'root').map(m => [m.role,
            m.role === 'user' ? m.content : c.messages[m.parent].content, c.messages[m.parent].role,
            Boolean(m.pending), m.error ? m.error.kind : null, m.content.length > 0]).sort();
    }""", urlsplit(page.url).fragment)
    assert stored == [["assistant", "And cats?", "user", False, None, True],
                      ["assistant", "Tell me about dogs.", "user", False, None, True],
                      ["user", "And cats?", "root", False, None, True],
                      ["user", "Tell me about dogs.", "root", False, None, True]], stored
    # the answering tab closed while its answer came: a tab opened then says it was interrupted
    other.close()
    page.fill("#input", "And horses?")
    page.press("#input", "Enter")
    while not held:
        page.wait_for_timeout(50)
    address = page.url
    watching = another_tab(tab, address, script)  # open while it comes: shows it coming, then that it was cut
    watching.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert watching.locator("article.assistant .note").last.inner_text() == ""
    page.close()
    watching.wait_for_function("() => [...document.querySelectorAll('article.assistant .note')].pop().textContent"
                               ".startsWith('The answer was interrupted')", timeout=15000)
    assert "pending" not in (watching.locator("article.assistant").last.get_attribute("class") or "")
    watching.close()
    last = another_tab(tab, address, script)
    last.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert last.locator("article.user .text").last.inner_text() == "And horses?"
    assert last.locator("article.assistant .note").last.inner_text() == (
        "The answer was interrupted: the page was closed or reloaded while it came. Press Regenerate to ask again.")


@pytest.mark.parametrize("locks", [True, False], ids=["web-locks", "no-web-locks"])
def test_an_answer_begun_in_another_tab_while_this_one_shows_it_is_said_interrupted(tab: Tab, locks: bool) -> None:
    """docs/webui.md: a tab open on a conversation when another tab begins an answer in it shows it coming, and once
    that tab is reloaded before the answer ends, shows it interrupted, no longer busy, as a tab opened after would:
    also where that tab's last write is lost (here its writes refused: as a crash, or a reload cut short)."""
    script = "" if locks else "delete Navigator.prototype.locks"
    if script:
        tab.page.add_init_script(script)
    page = tab.open()
    page.evaluate(THREE_CONVERSATIONS)
    first = page.evaluate("async () => (await (await import('./webui/store.js')).all())"
                          ".find(c => c.name === 'First').id")
    page.goto(f"{tab.url}#{first}")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    other = another_tab(tab, f"{tab.url}#{first}", script)
    other.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")
    held: list[Any] = []
    page.route("**/v1/chat/completions", lambda r: held.append(r))  # held: the answer has begun, and stays so
    page.fill("#input", "And more?")
    page.press("#input", "Enter")
    while not held:
        page.wait_for_timeout(50)
    other.wait_for_function("() => document.querySelectorAll('article.assistant').length === 2")
    coming = other.locator("article.assistant").last
    assert coming.get_attribute("aria-busy") == "true"
    page.evaluate("""() => {
        Storage.prototype.setItem = () => { throw new DOMException('refused', 'QuotaExceededError'); };
        IDBObjectStore.prototype.put = () => { throw new DOMException('refused', 'InvalidStateError'); };
    }""")
    page.reload()  # its lock goes; what it had to say of the answer does not reach the other tab
    other.wait_for_function("() => [...document.querySelectorAll('article.assistant .note')].pop().textContent"
                            ".startsWith('The answer was interrupted')", timeout=15000)
    assert coming.get_attribute("aria-busy") is None
    other.close()


def test_an_imported_conversation_reads_as_it_did(tab: Tab, tmp_path: Path) -> None:
    """Export then Import JSON brings back each answer's note (stopped, cut at max_tokens, the error it met),
    a conversation of thousands of messages, and an answer a closed page left unfinished says so on opening."""
    page = tab.open()
    exported = page.evaluate("""async () => {
        const tree = await import('./webui/tree.js');
        const t = await import('./webui/transcript.js');
        const conv = tree.conversation();
        conv.name = 'Notes';
        const q = tree.add(conv, 'root', {role: 'user', content: 'q'});
        tree.add(conv, q.id, {role: 'assistant', content: 'partial', stopped: true});
        tree.add(conv, q.id, {role: 'assistant', content: 'cut', finish: 'length', stats: {tokens: 4, max_tokens: 4}});
        tree.add(conv, q.id, {role: 'assistant', content: '', error: {kind: 'network',
            message: 'Cannot reach the server: is localgen serve still running?'}});
        const long = tree.conversation();
        long.name = 'Long';
        let at = 'root';
        for (let i = 0; i < 20000; i++) {
            at = tree.add(long, at, {role: i % 2 ? 'assistant' : 'user', content: `m${i}`}).id;
        }
        return t.exportJson([conv, long]);
    }""")
    chats = tmp_path / "chats.json"
    chats.write_text(exported)
    page.set_input_files("#import-file", str(chats))
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 2")
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 1")  # the first shown
    assert page.locator("#conversations .conv.active .open").inner_text() == "Notes"
    note = page.locator("article.assistant .note")
    assert note.inner_text() == ("Cannot reach the server: is localgen serve still running? Your messages are kept: "
                                 "press Regenerate once the server is back.")
    page.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('article.assistant .count')?.textContent === '2/3'")
    assert note.inner_text() == "The answer was cut at max_tokens (4)."
    page.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('article.assistant .count')?.textContent === '1/3'")
    assert note.inner_text() == "Stopped."
    assert page.evaluate("""async () => {  // every message, down the one branch
        const tree = await import('./webui/tree.js');
        const long = (await (await import('./webui/store.js')).all()).find((c) => c.name === 'Long');
        const want = [...Array(20000).keys()].map((i) => `m${i}`).join(' ');
        return tree.path(long).map((m) => m.content).join(' ') === want;
    }""")
    # an answer still coming when its page was closed: kept, and said to be cut off, with what to do
    page.evaluate("""async () => {
        const tree = await import('./webui/tree.js');
        const conv = tree.conversation();
        conv.name = 'Closed';
        const q = tree.add(conv, 'root', {role: 'user', content: 'q'});
        tree.add(conv, q.id, {role: 'assistant', content: 'half an', pending: true});
        await (await import('./webui/store.js')).save(conv, tree.merge);
        location.hash = conv.id;  // its address opened in this tab: shown, as on a reload
    }""")
    page.wait_for_function("""() => document.querySelector('article.assistant .body')?.textContent === 'half an'
        && document.querySelector('#conversations .conv.active .open')?.textContent === 'Closed'""")
    assert page.locator("article.assistant .note").inner_text() == (
        "The answer was interrupted: the page was closed or reloaded while it came. Press Regenerate to ask again.")


def test_a_key_a_browser_cannot_send_is_refused_in_the_prompt(browser: Any, server: Server) -> None:
    """A key pasted with a character no browser can put in a header (an invisible space) is refused in the key
    prompt with the reason, not kept; one kept by an older page is asked for again. After the key, the note says
    nothing about the model until the server has said whether it is loaded, and the message box has the focus."""
    t = Tab(browser, server)
    page = t.page
    page.add_init_script("""document.addEventListener('DOMContentLoaded', () => {
        const note = document.getElementById('model-note');
        window.notes = [];
        new MutationObserver(() => window.notes.push(note.textContent)).observe(note, {childList: true});
    })""")
    page.goto(t.url)
    page.fill("#key-input", KEY + "\u200b")
    page.press("#key-input", "Enter")
    page.locator("#key-error").wait_for(state="visible")
    assert "cannot send (U+200B)" in page.inner_text("#key-error") and page.is_visible("#key-dialog")
    assert page.evaluate("sessionStorage.getItem('localgen.apiKey')") is None
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    page.wait_for_function("() => document.getElementById('model-note')?.textContent === 'loaded'")
    assert page.evaluate("window.notes") == ["loaded"], "never 'not loaded yet' for a model that is loaded"
    assert page.evaluate("document.activeElement.id") == "input"
    page.evaluate("sessionStorage.setItem('localgen.apiKey', 'sk-\u2019quoted\u2019')")
    page.reload()
    page.locator("#key-dialog").wait_for(state="visible")
    assert "needs its API key" in page.inner_text("#key-reason")
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    page.click("#open-settings")
    page.fill("#seed", "-2")  # the server takes -1 (random) to 4,294,967,295: said in the dialog, before any request
    page.click("#settings-form button[type=submit]")  # the browser's own check holds the form
    assert page.evaluate("document.getElementById('seed').validity.rangeUnderflow")
    assert page.is_visible("#settings")
    page.click("#settings-cancel")
    page.select_option("#model", "gemma3:270m")  # the model picked last is this browser's pick for a new chat
    page.goto(t.url)
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert page.input_value("#model") == "gemma3:270m"
    t.close()


def test_a_new_chat_starts_with_the_model_picked_last(tab: Tab) -> None:
    """docs/webui.md: a new chat starts with the model picked last, not the model of the conversation that was on
    screen."""
    page = tab.open()
    page.evaluate("""async () => {
        const store = await import('./webui/store.js');
        const tree = await import('./webui/tree.js');
        for (const name of ['A', 'B']) {
            const c = tree.conversation();
            Object.assign(c, {id: name, name, model: 'smollm2:135m'});
            tree.add(c, 'root', {role: 'user', content: name});
            await store.save(c, tree.merge);
        }
    }""")
    page.goto(tab.url + "#A")
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'A'")
    page.select_option("#model", "gemma3:270m")
    page.get_by_role("button", name="B", exact=True).click()
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'B'")
    assert page.input_value("#model") == "smollm2:135m"
    page.click("#new-chat")
    assert page.input_value("#model") == "gemma3:270m"


def test_a_model_unloaded_since_it_was_read_is_said_loading_again(tab: Tab) -> None:
    """The note says `Loading …` for a model serve has unloaded since the page last read its state (keep-alive):
    the state is read again as a message is sent."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "Hi")
    page.wait_for_function("() => document.getElementById('model-note').textContent === 'loaded'")
    page.route(re.compile(r".*/(?<!v1/)models$"), lambda route: route.fulfill(
        status=200, headers={"Content-Type": "application/json"}, body=json.dumps({"data": []})))
    held: list[Any] = []
    page.route("**/v1/chat/completions", lambda route: held.append(route))
    before = answer_ids(page)
    page.fill("#input", "Hi again")
    page.press("#input", "Enter")
    page.wait_for_function("() => document.getElementById('model-note').textContent === 'Loading smollm2:135m…'")
    page.unroute(re.compile(r".*/(?<!v1/)models$"))
    _until(page, lambda: held)  # the request may reach the route after the note
    held[0].continue_()
    wait_answer(page, before)
    page.unroute("**/v1/chat/completions")
    assert page.inner_text("#model-note") == "loaded"


def test_an_answer_of_unclosed_markdown_renders_in_one_pass(tab: Tab, tmp_path: Path) -> None:
    """A hostile answer, a million characters of emphasis, strike-through and code spans that nothing closes
    (`*a _b ~~c **d`, runs of 1 to 400 backticks, then of 1,400 down to 401, each shorter than the last), then a
    list of 100,000 items, is drawn in one pass: each kind of span is looked for once past the last place it
    could close, not again at every one of its openings; the runs of backticks are found once, not the rest of
    the text searched again for each length (runs ever shorter took 69 s); and a list's items are not counted
    again for each (each took minutes and froze the tab). A run of backticks opens a code span only whole: a
    shorter run inside it is no opening."""
    page = tab.open()
    ticks = "".join("`" * k + "x " for k in [*range(1, 401), *range(1400, 400, -1)])
    hostile = ticks + "*a _b ~~c **d " * 66_000
    assert len(hostile) > 1_000_000
    conv = {"name": "Hostile", "current": "a", "messages": {
        "root": {"id": "root", "children": ["q"], "role": "root"},
        "q": {"id": "q", "role": "user", "content": "Say something hostile.", "children": ["a"]},
        "a": {"id": "a", "role": "assistant", "content": hostile + "\n\n" + "- item\n" * 100_000, "children": []}}}
    (tmp_path / "hostile.json").write_text(json.dumps(conv))
    page.set_input_files("#import-file", str(tmp_path / "hostile.json"))
    page.wait_for_function("() => document.querySelectorAll('article.assistant .body p').length === 1",
                           timeout=60_000)  # the old page was still drawing it minutes later
    assert page.evaluate("document.querySelector('article.assistant .body p').textContent") == hostile.strip()
    assert page.evaluate("document.querySelectorAll('article.assistant .body p *').length") == 0
    assert page.evaluate("document.querySelectorAll('article.assistant .body > ul > li').length") == 100_000
    render = RENDER
    assert page.evaluate(render, "```a`` b") == "<p>```a`` b</p>"  # not ` and a span of `a`
    assert page.evaluate(render, "``a`` and `` `c` ``") == "<p><code>a</code> and <code>`c`</code></p>"
    assert page.evaluate(render, "``a``` b`` `c` ```d```") == \
        "<p><code>a``` b</code> <code>c</code> <code>d</code></p>"  # the next run of as many closes, past longer
    assert page.evaluate(render, "\\``a` b``") == "<p>`<code>a</code> b``</p>"  # an escaped one is no run's start


def test_a_damaged_record_or_a_cut_address_leaves_the_page_working(tab: Tab) -> None:
    """What this browser keeps, set by hand or cut off, never stops the page: a pending note in localStorage
    that is not a conversation is dropped, a record in IndexedDB that cannot be drawn says so when opened (and
    can be deleted), and an address whose `#` part is a cut %-escape says no conversation has it. Each time
    the models are listed and a message gets its answer."""
    page = tab.open()
    damaged = page.evaluate("""async () => {
        localStorage.setItem('localgen-chat-pending:noted', JSON.stringify({id: 'noted', messages: {}}));
        const tree = await import('./webui/tree.js');
        const store = await import('./webui/store.js');
        const bad = tree.conversation();
        bad.name = 'Damaged';
        tree.add(bad, 'root', {role: 'user', content: 'q'});
        delete bad.messages[bad.current];  // the message on screen is gone from the record
        await store.save(bad, tree.merge);
        return bad.id;
    }""")
    page.goto("about:blank")
    page.goto(f"{tab.url}#{damaged}")  # its address opened anew
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    assert page.locator("#banner-text").inner_text().startswith(
        "That conversation cannot be shown: what this browser keeps of it is damaged (message ")
    assert page.eval_on_selector_all("#conversations .conv .open", "bs => bs.map(b => b.textContent)") == ["Damaged"]
    assert page.evaluate("Object.keys(localStorage).filter(k => k.includes('pending'))") == []
    with page.expect_download() as got:  # Export all keeps it as it is
        page.click("#export-all")
    kept = json.loads(Path(got.value.path()).read_text())["conversations"]
    assert [(c["id"], c["name"]) for c in kept] == [(damaged, "Damaged")]
    page.once("dialog", lambda d: d.accept())
    page.hover("#conversations .conv")
    page.get_by_role("button", name="Delete Damaged").click()
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 0")
    page.goto(tab.url + "#%E0%A4%A")
    page.wait_for_function(BANNER_SAYS, arg="That conversation is no longer in this browser.")
    settings(page, max_tokens=4)
    assert ask(page, "Hello").locator(".body").inner_text()


LOOP = """(name) => {  // a conversation whose messages x and y name each other as parent, x on screen
    const conv = {id: `loop-${name}`, name, created: 1, updated: 1, model: null, system: '', current: 'x',
                  settings: {}, messages: {root: {id: 'root', parent: null, children: [], role: 'root'}}};
    conv.messages.x = {id: 'x', parent: 'y', children: ['y'], role: 'user', content: 'x', created: 1};
    conv.messages.y = {id: 'y', parent: 'x', children: ['x'], role: 'assistant', content: 'y', created: 1};
    return conv;
}"""


def test_a_loop_of_parents_kept_in_the_browser_is_refused_not_drawn(tab: Tab) -> None:
    """What this browser keeps never stops the page (docs/webui.md): a conversation whose messages' parents form a
    loop (so they never reach the first message), kept in IndexedDB, says it cannot be shown when opened; in a
    pending note in localStorage, whole or of the changes to a record kept, the note is dropped (the record stays
    as it was). The page lists the models and answers as ever."""
    page = tab.open()
    page.evaluate(f"""async () => {{
        const loop = {LOOP};
        const tree = await import('./webui/tree.js');
        const store = await import('./webui/store.js');
        await store.save(loop('Looped'), tree.merge);
        localStorage.setItem('localgen-chat-pending:loop-Noted', JSON.stringify(loop('Noted')));
        const kept = tree.conversation();  // kept whole; then a note of changes to it that adds the loop
        kept.id = 'kept';
        kept.name = 'Kept';
        tree.add(kept, 'root', {{role: 'user', content: 'q'}});
        await store.save(kept, tree.merge);
        const {{x, y}} = loop('Kept').messages;
        localStorage.setItem('localgen-chat-pending:kept',
                             JSON.stringify({{...kept, current: 'x', upon: true, messages: {{x, y}}}}));
    }}""")
    page.goto("about:blank")
    page.goto(f"{tab.url}#loop-Looped")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0", timeout=60_000)
    assert page.locator("#banner-text").inner_text() == (
        "That conversation cannot be shown: what this browser keeps of it is damaged (message x does not reach "
        "the first message: its parents go round in a loop). Delete it, or keep it as it is with Export all.")
    listed = page.eval_on_selector_all("#conversations .conv .open", "bs => bs.map(b => b.textContent)")
    assert sorted(listed) == ["Kept", "Looped"]
    assert page.evaluate("Object.keys(localStorage).filter(k => k.includes('pending'))") == []
    page.get_by_role("button", name="Kept", exact=True).click()  # as it was kept, the note's loop left out
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'q'")
    page.goto(f"{tab.url}#loop-Noted")
    page.wait_for_function(BANNER_SAYS, arg="That conversation is no longer in this browser.", timeout=60_000)
    settings(page, max_tokens=4)
    assert ask(page, "Hello").locator(".body").inner_text()


def test_the_site_data_cleared_while_the_page_is_open_loses_no_later_change(tab: Tab) -> None:
    """The site's storage cleared while the page is open (the browser's Clear site data): the page opens its
    storage again, so what is sent next is kept (the conversation on screen whole), and no banner says the storage
    cannot be read."""
    page = tab.open()
    settings(page, max_tokens=3)
    ask(page, "one")
    cdp = tab.context.new_cdp_session(page)
    cdp.send("Storage.clearDataForOrigin", {"origin": tab.url.rstrip("/"), "storageTypes": "indexeddb"})
    ask(page, "two")
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 1")
    assert page.locator("#banner").is_hidden(), page.locator("#banner-text").inner_text()
    assert stored_user_texts(page) == [["one", "two"]]


def test_a_full_local_storage_and_a_model_removed_while_picked(tab: Tab, server: Server) -> None:
    """With this browser's localStorage full, picking a model still picks it (the note and the attach button
    speak of it), only the pick is not remembered. A model deleted on the server while the page has it picked
    gets the server's reason, and the picker then lists only what the server offers. An answer stopped before
    its first word has no stats (no `about 0 tokens`)."""
    page = tab.open()
    page.evaluate("""() => {
        for (const size of [1 << 20, 1 << 14, 1 << 8, 1]) {
            const s = 'x'.repeat(size);
            try { for (let k = 0; ; k++) localStorage.setItem(`filler-${size}-${k}`, s); } catch {}
        }
    }""")
    page.select_option("#model", "gemma3:270m")
    page.wait_for_function("() => document.getElementById('attach').title === 'gemma3:270m takes no images'")
    assert page.locator("#model-note").inner_text().startswith("a base model, with no chat template: it cannot chat")
    page.evaluate("localStorage.clear()")
    r = httpx.post(f"{server.url}/api/create", headers=_auth(), json={
        "model": "gone-soon", "from": "smollm2:135m", "stream": False})
    assert r.status_code == 200, r.text
    page.reload()
    page.wait_for_function("() => [...document.querySelectorAll('#model option')].some(o => o.value === 'gone-soon')")
    page.select_option("#model", "gone-soon")
    assert httpx.request("DELETE", f"{server.url}/api/delete", headers=_auth(),
                         json={"model": "gone-soon"}).status_code == 200
    settings(page, max_tokens=4)
    note = ask(page, "Hi").locator(".note").inner_text()
    assert note.startswith("model 'gone-soon' is not served here"), note
    page.wait_for_function("() => document.getElementById('model').value === 'smollm2:135m'")
    assert "gone-soon" not in page.eval_on_selector_all("#model option", "os => os.map(o => o.value)")
    # a Stop before the first word: the request held back (as a model that loads holds it), then stopped
    page.route("**/v1/chat/completions", lambda route: None)
    before = answer_ids(page)
    page.fill("#input", "Never answered")
    page.press("#input", "Enter")
    page.wait_for_function("() => !document.getElementById('stop').hidden")
    page.click("#stop")
    article = wait_answer(page, before)
    assert article.locator(".note").inner_text() == "Stopped."
    assert article.locator(".stats").count() == 0
    page.unroute("**/v1/chat/completions")


# The chat route's stream scripted in the page, piece by piece as the test feeds it (window.feed, window.finish),
# every other call going to the server: where a test must see the page between two given pieces, which no model's
# pace allows. The real model's stream is test_an_answer_streams_in_as_markdown_with_its_stats_and_is_kept's.
SCRIPTED_STREAM = """() => {
    const real = window.fetch;
    const encode = (doc) => new TextEncoder().encode(`data: ${JSON.stringify(doc)}\\n\\n`);
    let stream = null;
    window.feed = (text) => stream.enqueue(encode({choices: [{index: 0, delta: {content: text}}]}));
    window.finish = () => {
        stream.enqueue(encode({choices: [{index: 0, delta: {}, finish_reason: 'stop'}]}));
        stream.enqueue(new TextEncoder().encode('data: [DONE]\\n\\n'));
        stream.close();
    };
    window.fetch = (url, init) => {
        if (!String(url).endsWith('v1/chat/completions')) return real(url, init);
        const body = new ReadableStream({start(c) { stream = c; }});
        init.signal.addEventListener('abort', () => stream.error(new DOMException('stopped', 'AbortError')));
        return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
    };
}"""


def feed(page: Any, text: str) -> None:
    """A piece of the scripted answer, sent once the page has asked for the answer (its stream is open)."""
    page.wait_for_function("(t) => { try { window.feed(t); return true; } catch { return false; } }", arg=text)


def body_has(page: Any, text: str) -> None:
    page.wait_for_function("(t) => document.querySelector('article.assistant:last-of-type .body')"
                           "?.textContent.includes(t)", arg=text)


def scripted_answer(page: Any, question: str, first: str, shown: str) -> None:
    """`question` sent, its answer's stream scripted, `first` piece fed, and `shown` seen in the answer."""
    page.evaluate(SCRIPTED_STREAM)
    page.fill("#input", question)
    page.press("#input", "Enter")
    feed(page, first)
    body_has(page, shown)


def test_a_streaming_answer_draws_again_only_its_last_block(tab: Tab) -> None:
    """While an answer streams, what a blank line outside a code fence ended is drawn once and kept (its nodes
    stay the same nodes as more comes), so a long answer does not cost a full Markdown drawing per frame; a code
    block with a blank line inside is still one block; once the answer ends it is drawn whole, as render() draws
    it (a loose list the blank lines split is one list again)."""
    page = tab.open()
    scripted_answer(page, "Write something long.", "# Title\n\nThe first paragraph.\n\n", "The first paragraph.")
    page.evaluate("document.querySelector('article.assistant .body p').dataset.kept = 'yes'")
    for piece in ["The second ", "paragraph.", "\n\n```py\nx = 1\n", "\ny = 2\n", "```\n\n1. one\n", "\n2. two\n"]:
        feed(page, piece)
    body_has(page, "two")
    assert page.evaluate("document.querySelector('article.assistant .body p')?.dataset.kept") == "yes", \
        "the first paragraph was drawn again"
    assert page.evaluate("document.querySelector('article.assistant .body pre code').textContent") == "x = 1\n\ny = 2"
    page.evaluate("window.finish()")
    article = wait_answer(page, [])
    whole = ("# Title\n\nThe first paragraph.\n\nThe second paragraph.\n\n```py\nx = 1\n\ny = 2\n```\n\n"
             "1. one\n\n2. two\n")
    assert article.locator(".body").evaluate("b => b.innerHTML") == page.evaluate(RENDER, whole)
    assert article.locator(".body ol > li").count() == 2 and article.locator(".body ol").count() == 1


BIG_CONVERSATION = """async () => {
    const tree = await import('./webui/tree.js');
    const store = await import('./webui/store.js');
    const c = tree.conversation();
    c.name = 'Big';
    let at = 'root';
    for (let k = 0; k < 60; k++) {  // 12 million characters: past any browser's localStorage quota
        at = tree.add(c, at, {role: 'user', content: `Question ${k}`}).id;
        at = tree.add(c, at, {role: 'assistant', content: `Answer ${k} ` + 'x'.repeat(200000)}).id;
    }
    await store.save(c, tree.merge);
    return c.id;
}"""

# IndexedDB held by another page of the origin (a readwrite transaction kept open until window.release), so that
# the page's writes wait: what a reload in the moment before a write commits finds.
HOLD_STORE = """() => new Promise((resolve) => {
    const open = indexedDB.open('localgen-chat', 1);
    open.onsuccess = () => {
        const s = open.result.transaction('conversations', 'readwrite').objectStore('conversations');
        window.release = false;
        const spin = () => { if (!window.release) s.get('none').onsuccess = spin; };
        spin();
        resolve(true);
    };
})"""


def rename_first(page: Any, name: str) -> None:
    page.hover("#conversations .conv")
    page.locator("#conversations .conv").get_by_role("button", name=re.compile("^Rename ")).click()
    page.fill("#conversations input.rename", name)
    page.press("#conversations input.rename", "Enter")


def test_a_conversation_past_the_local_storage_quota_keeps_each_change(tab: Tab, server: Server) -> None:
    """A conversation larger than localStorage holds (12 million characters) still has each change noted there
    until IndexedDB commits it (the note holds what changed, not the whole conversation): a reload before the
    commit keeps the change. Where even that does not fit (localStorage full), the browser asks before the page
    is closed until the write commits, and not after."""
    page = tab.open()
    big = page.evaluate(BIG_CONVERSATION)
    page.goto(f"{tab.url}#{big}")
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 60", timeout=120_000)
    holder = tab.context.new_page()
    holder.goto(f"{server.url}/health")  # the same origin, without the page's script
    holder.evaluate(HOLD_STORE)
    rename_first(page, "Renamed")
    note = page.wait_for_function(f"() => localStorage.getItem('localgen-chat-pending:{big}')").json_value()
    assert '"Renamed"' in note and len(note) < 10_000, len(note)
    page.reload()
    holder.evaluate("window.release = true")
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Renamed'")
    page.wait_for_function("() => Object.keys(localStorage).every(k => !k.startsWith('localgen-chat-pending:'))")
    # drawn whole again (12 million characters: on a busy machine the count came before the drawing ended)
    page.wait_for_function("() => document.querySelectorAll('article.assistant').length === 60", timeout=120_000)
    # localStorage full: no note fits, so closing the page asks until the write has committed
    page.evaluate("""() => {
        for (const size of [1 << 20, 1 << 14, 1 << 8, 1]) {
            const s = 'x'.repeat(size);
            try { for (let k = 0; ; k++) localStorage.setItem(`filler-${size}-${k}`, s); } catch {}
        }
    }""")
    holder.evaluate(HOLD_STORE)
    asked: list[str] = []

    def dialog(d: Any) -> None:
        asked.append(d.type)
        d.dismiss()

    page.on("dialog", dialog)
    rename_first(page, "Full")
    page.close(run_before_unload=True)
    deadline = time.monotonic() + 30
    while not asked and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert asked == ["beforeunload"] and not page.is_closed()
    holder.evaluate("window.release = true")
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Full'")
    page.evaluate("localStorage.clear()")
    page.close(run_before_unload=True)
    holder.wait_for_timeout(500)
    assert asked == ["beforeunload"] and page.is_closed()


def test_an_import_over_the_bound_is_refused_before_it_is_read(tab: Tab, tmp_path: Path) -> None:
    """A file over 64 MB is refused with its size, before the page reads it, and nothing is imported; the notice
    goes at the next thing the user does (a new chat), as a conversation's address that names none does. A write
    the browser's storage refuses says so (an import is not said to be done), until a later change is kept."""
    page = tab.open()
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(80 * 1024 * 1024)  # sparse: no disk spent
    page.set_input_files("#import-file", str(big))
    page.wait_for_function("() => !document.getElementById('banner').hidden")
    said = page.inner_text("#banner-text")
    assert said == "big.json cannot be imported: it is 80.0 MB, over the 64 MB an import may be.", said
    assert page.locator("#conversations .conv").count() == 0
    page.click("#new-chat")
    assert page.locator("#banner").is_hidden()
    page.goto(tab.url + "#no-such-conversation")
    page.wait_for_function(BANNER_SAYS, arg="That conversation is no longer in this browser.")
    page.click("#new-chat")
    assert page.locator("#banner").is_hidden()
    # the browser's storage refusing a write (as a full disk does): said, not claimed imported; gone once a
    # later change is kept
    page.evaluate("""() => {
        const put = IDBObjectStore.prototype.put;
        window.refuse = true;
        IDBObjectStore.prototype.put = function (...args) {
            if (!window.refuse) return put.apply(this, args);
            this.transaction.abort();  // as the browser aborts a write past its quota
            return null;
        };
    }""")
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"name": "Small", "current": "q", "messages": {
        "root": {"id": "root", "children": ["q"], "role": "root"},
        "q": {"id": "q", "role": "user", "content": "Kept?", "children": []}}}))
    page.set_input_files("#import-file", str(small))
    page.wait_for_function("() => document.getElementById('banner-text').textContent"
                           ".startsWith('This browser would not keep the conversation')")
    assert page.locator("#conversations .conv").count() == 0 and page.inner_text("article.user .text") == "Kept?"
    page.evaluate("window.refuse = false")
    settings(page, **{"conv-name": "Kept now"})
    page.wait_for_function("() => document.querySelector('#conversations .conv .open')?.textContent === 'Kept now'")
    assert page.locator("#banner").is_hidden()


def test_export_all_past_the_import_bound_saves_files_import_reads_back(tab: Tab, tmp_path: Path) -> None:
    """docs/webui.md: conversations over 64 MB together (three with a 24 MB picture each) are saved by Export all
    as several files, each within what Import JSON reads, and each imports back."""
    page = tab.open()
    page.evaluate("""async () => {
        const store = await import('./webui/store.js');
        const tree = await import('./webui/tree.js');
        const picture = 'data:image/png;base64,' + 'A'.repeat(24 << 20);
        for (const k of [0, 1, 2]) {
            const c = tree.conversation();
            c.name = `big${k}`;
            tree.add(c, 'root', {role: 'user', content: `picture ${k}`, images: [picture]});
            await store.save(c, tree.merge);
        }
    }""")
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 3")
    downloads: list[Any] = []
    page.on("download", lambda d: downloads.append(d))
    page.click("#export-all")
    page.wait_for_function(BANNER_SAYS, arg="Saved as 2 files, each within the 64 MB Import JSON reads.")
    _until(page, lambda: len(downloads) == 2)  # download events may come after the banner
    names = sorted(d.suggested_filename for d in downloads)
    assert names == ["localgen-chats-1-of-2.json", "localgen-chats-2-of-2.json"]
    for d in downloads:
        path = tmp_path / d.suggested_filename
        d.save_as(path)
        assert path.stat().st_size <= 64 << 20
    for k, n in ((1, 2), (2, 1)):
        page.set_input_files("#import-file", str(tmp_path / f"localgen-chats-{k}-of-2.json"))
        page.wait_for_function(BANNER_SAYS, arg=f"Imported {n} conversation{'s' if n > 1 else ''}.")
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 6")


def test_escape_closes_the_drawer_first_and_a_tab_shown_again_reads_the_models(browser: Any, server: Server) -> None:
    """On a phone, Escape while an answer streams with the drawer open closes the drawer, and a second Escape stops
    the answer. A tab shown again reads the models again: one added on the server meanwhile is listed, and the
    banner of a server that could not be reached goes once it answers."""
    t = Tab(browser, server, PHONE)
    page = t.open()
    scripted_answer(page, "Hello", "Hello there, a long answer", "Hello there")
    page.click("#open-sidebar")
    page.wait_for_function("() => document.getElementById('app').classList.contains('sidebar-open')")
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.getElementById('app').classList.contains('sidebar-open')")
    assert page.is_visible("#stop"), "the first Escape stopped the answer"
    page.keyboard.press("Escape")
    assert wait_answer(page, []).locator(".note").inner_text() == "Stopped."
    page.route("**/v1/models", lambda route: route.abort())
    shown = """() => {
        Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'visible'});
        document.dispatchEvent(new Event('visibilitychange'));
    }"""
    page.evaluate(shown)
    page.wait_for_function("() => document.getElementById('banner-text').textContent"
                           ".startsWith('Cannot reach the server')")
    page.unroute("**/v1/models")
    r = httpx.post(f"{server.url}/api/create", headers=_auth(), json={
        "model": "came-meanwhile", "from": "smollm2:135m", "stream": False})
    assert r.status_code == 200, r.text
    try:
        page.evaluate(shown)
        page.wait_for_function("() => [...document.querySelectorAll('#model option')]"
                               ".some(o => o.value === 'came-meanwhile')")
        assert page.locator("#banner").is_hidden()
    finally:
        httpx.request("DELETE", f"{server.url}/api/delete", headers=_auth(), json={"model": "came-meanwhile"})
    t.close()


# what has the focus: its mark (set by mark()), else its tag and accessible label (or text), else BODY
FOCUSED = """() => {
    const a = document.activeElement;
    if (!a || a === document.body) return 'BODY';
    return a.dataset.mark || `${a.tagName}:${a.getAttribute('aria-label') || a.id || a.textContent.trim()}`;
}"""
THE_NEW_ANSWER = "() => document.activeElement === [...document.querySelectorAll('article.assistant')].pop()"


def focused(page: Any) -> str:
    return str(page.evaluate(FOCUSED))


def mark(page: Any, name: str) -> None:
    """The element with the focus marked: focused() says `name` for it as long as it is that very element."""
    page.evaluate("(name) => { document.activeElement.dataset.mark = name; }", name)


def count_is(page: Any, text: str) -> None:
    page.wait_for_function("(t) => document.querySelector('article.assistant:last-of-type .count')?.textContent === t",
                           arg=text)


def _the_new_answer_keeps_the_focus(page: Any, ids: Any, words: str, shown: str) -> None:
    """The answer asked for gets `words` (`shown` once drawn) and has the focus while it comes and after."""
    feed(page, words)
    body_has(page, shown)
    assert page.evaluate(THE_NEW_ANSWER)
    page.evaluate("window.finish()")
    wait_answer(page, ids)
    assert page.evaluate(THE_NEW_ANSWER)


def test_send_is_off_until_there_is_something_to_send(tab: Tab) -> None:
    """docs/webui.md: Send is off, saying why, while the message box is empty or only blank (Enter then sends
    nothing); typing turns it on, and it is off again once the message has gone: pressed from the keyboard, the
    focus goes to the message box (a browser drops a button's focus as it turns off: it went nowhere)."""
    page = tab.open()
    page.evaluate(SCRIPTED_STREAM)
    assert page.is_disabled("#send")
    assert page.get_attribute("#send", "title") == "Type a message (or attach an image) first"
    page.fill("#input", "  \n ")
    assert page.is_disabled("#send")
    page.press("#input", "Enter")
    assert page.locator("article").count() == 0
    page.fill("#input", "Hello")
    assert page.is_enabled("#send") and page.get_attribute("#send", "title") == ""
    page.fill("#input", "")
    assert page.is_disabled("#send")
    page.fill("#input", "Hello")
    page.focus("#send")
    page.keyboard.press("Enter")  # Send, from the keyboard: it goes off as the box empties, the focus to the box
    assert focused(page) == "TEXTAREA:Message"
    feed(page, "Hello there")
    body_has(page, "Hello there")
    assert focused(page) == "TEXTAREA:Message"
    page.evaluate("window.finish()")
    page.wait_for_function("() => !document.getElementById('send').hidden")
    assert page.input_value("#input") == "" and page.is_disabled("#send")


def test_the_focus_stays_where_the_keyboard_left_it(tab: Tab) -> None:
    """docs/webui.md: a button pressed from the keyboard keeps the focus where it still is, and where it went, the
    focus goes on: Send to the message box (while the answer comes, in Stop's place), Stop back to it, Regenerate to
    the new answer, ‹ › to the arrow of the version shown, Edit's Escape back to Edit, an edit saved to the new
    version's Edit. A button focused while the answer streams and ends stays focused (the very button)."""
    page = tab.open()
    page.evaluate(SCRIPTED_STREAM)
    page.fill("#input", "Hello")
    page.focus("#send")
    page.keyboard.press("Enter")  # Send, from the keyboard: it goes while the answer comes
    feed(page, "Hello there")
    body_has(page, "Hello there")
    assert focused(page) == "TEXTAREA:Message"
    page.locator("article.assistant").get_by_role("button", name="Copy the answer").focus()
    mark(page, "copy")
    for piece in [" and", " some more", " words."]:
        feed(page, piece)
    body_has(page, "some more words.")
    assert focused(page) == "copy", "the next words took the focus"
    page.evaluate("window.finish()")
    wait_answer(page, [])
    assert focused(page) == "copy", "the answer's end took the focus"
    # Stop from the keyboard: the message box has the focus after it
    ids = answer_ids(page)
    page.fill("#input", "Again")
    page.press("#input", "Enter")
    feed(page, "Some words")
    body_has(page, "Some words")
    page.focus("#stop")
    page.keyboard.press("Enter")
    assert wait_answer(page, ids).locator(".note").inner_text() == "Stopped."
    assert focused(page) == "TEXTAREA:Message"
    # Regenerate: the new answer has the focus, while it comes and after
    ids = answer_ids(page)
    page.locator("article.assistant").last.get_by_role("button", name="Regenerate").focus()
    page.keyboard.press("Enter")
    _the_new_answer_keeps_the_focus(page, ids, "A new version", "A new version")
    # ‹ and ›: the arrow of the version shown, or the other one where the end of the versions turned it off
    last = page.locator("article.assistant").last
    last.get_by_role("button", name="Previous version").focus()
    page.keyboard.press("Enter")
    count_is(page, "1/2")
    assert focused(page) == "BUTTON:Next version of the answer"
    page.keyboard.press("Enter")
    count_is(page, "2/2")
    assert focused(page) == "BUTTON:Previous version of the answer"
    # Edit, then Escape: back on Edit; an edit saved: the new version's Edit
    last.get_by_role("button", name="Edit the answer").focus()
    page.keyboard.press("Enter")
    assert focused(page) == "TEXTAREA:Edit the answer"
    page.keyboard.press("Escape")
    assert focused(page) == "BUTTON:Edit the answer"
    page.keyboard.press("Enter")
    page.keyboard.type(" Edited.")
    last.get_by_role("button", name="Save").focus()
    page.keyboard.press("Enter")
    count_is(page, "3/3")
    assert focused(page) == "BUTTON:Edit the answer"
    assert page.evaluate("document.activeElement.closest('article').querySelector('.count').textContent") == "3/3"
    # an edited message of yours saved: the new answer it asks for has the focus, while it comes and after
    ids = answer_ids(page)
    page.locator("article.user").last.get_by_role("button", name="Edit your message").focus()
    page.keyboard.press("Enter")
    assert focused(page) == "TEXTAREA:Edit the message"
    page.keyboard.type(" Edited.")
    page.keyboard.press("Enter")
    _the_new_answer_keeps_the_focus(page, ids, "The edited question's answer", "edited question's answer")
    # Send and Stop clicked (or tapped), not pressed from the keyboard: the focus is let go, not put in the message
    # box (on a phone its keyboard would pop up over the answer)
    ids = answer_ids(page)
    page.fill("#input", "Clicked")
    page.click("#send")
    feed(page, "Clicked words")
    body_has(page, "Clicked words")
    assert focused(page) == "BODY"
    page.click("#stop")
    wait_answer(page, ids)
    assert focused(page) == "BODY"


# three conversations kept in the browser, straight through its store (none sent to a model)
THREE_CONVERSATIONS = """async () => {
    const tree = await import('./webui/tree.js');
    const store = await import('./webui/store.js');
    for (const name of ['First', 'Second', 'Third']) {
        const c = tree.conversation();
        c.name = name;
        const q = tree.add(c, 'root', {role: 'user', content: `${name}?`});
        tree.add(c, q.id, {role: 'assistant', content: `Answer to ${name}`, model: 'smollm2:135m'});
        await store.save(c, tree.merge);
    }
}"""


def test_the_conversation_list_works_from_the_keyboard(tab: Tab) -> None:
    """docs/webui.md: Tab reaches each conversation's ✎ and ✕, not only the open one's (shown as the keyboard's focus
    comes, not after a click); a conversation opened with Enter keeps the focus on its name, a rename ended with Enter
    or Escape puts it on the name, a delete on the name now in its place, or, the open one deleted, the message box."""
    page = tab.open()
    page.evaluate(THREE_CONVERSATIONS)
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 3")
    item = lambda name: page.locator("#conversations .conv", has_text=name)  # noqa: E731
    # after a click (a delete not confirmed) the focus is on ✕, but ✎ and ✕ show only while the pointer is there
    page.once("dialog", lambda d: d.dismiss())
    item("Second").get_by_role("button", name="Delete Second").click()
    assert focused(page) == "BUTTON:Delete Second"
    page.mouse.move(900, 700)
    assert page.evaluate("getComputedStyle(document.activeElement).opacity") == "0"
    item("First").get_by_role("button", name="First", exact=True).focus()
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'First?'")
    page.wait_for_function("() => document.querySelector('#conversations [aria-current]')?.textContent === 'First'")
    assert focused(page) == "BUTTON:First"
    # another conversation's ✎ and ✕ are in the Tab order, and shown when the focus is on them
    item("Second").get_by_role("button", name="Second", exact=True).focus()
    page.keyboard.press("Tab")
    assert focused(page) == "BUTTON:Rename Second"
    assert page.evaluate("getComputedStyle(document.activeElement).opacity") == "1"
    page.keyboard.press("Tab")
    assert focused(page) == "BUTTON:Delete Second"
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    assert focused(page) == "INPUT:New name"
    page.keyboard.press("Control+A")
    page.keyboard.type("Renamed")
    page.keyboard.press("Enter")
    page.wait_for_function("() => [...document.querySelectorAll('#conversations .open')]"
                           ".some(b => b.textContent === 'Renamed')")
    assert focused(page) == "BUTTON:Renamed"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.keyboard.type("Not kept")
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.activeElement.textContent === 'Renamed'")
    assert page.locator("#conversations input.rename").count() == 0 and page.locator("article").count() == 2
    page.once("dialog", lambda d: d.accept())
    item("Renamed").get_by_role("button", name="Delete Renamed").focus()
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 2")
    page.wait_for_function("() => document.activeElement.closest('#conversations .conv') !== null")
    assert focused(page) == "BUTTON:First"  # newest first: Third, Renamed, First
    # the open conversation deleted: the page is a new chat, the focus in its message box
    page.once("dialog", lambda d: d.accept())
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert focused(page) == "BUTTON:Delete First"
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 1")
    page.wait_for_function("() => document.activeElement.id === 'input'")
    assert page.locator("article").count() == 0


# each text the live region says, in order, from now on (it is emptied before each: the same words are said again)
COUNT_ANNOUNCED = """() => {
    const region = document.getElementById('announce');
    window.announced = [];
    new MutationObserver(() => {
        if (region.textContent) window.announced.push(region.textContent);
    }).observe(region, {childList: true, characterData: true, subtree: true});
}"""


def test_screen_readers_hear_who_wrote_each_message_and_each_answer_once(tab: Tab) -> None:
    """docs/webui.md: each message is named by who wrote it (a heading: You, or the model), its buttons say what
    they act on, the page's heading names the conversation; an answer is marked busy while it streams and said
    once when it ends (the model, its words, its note), through a polite live region, not word by word; what Copy did
    is said too."""
    page = tab.open()
    settings(page, max_tokens=8)
    page.evaluate(SCRIPTED_STREAM)
    page.fill("#input", "Say hi")
    page.press("#input", "Enter")
    page.get_by_role("img", name="The answer is coming").wait_for()  # the typing dots, before the first words
    feed(page, "Hi there")
    body_has(page, "Hi there")
    answer = page.get_by_role("article", name="smollm2:135m")
    assert answer.get_attribute("aria-busy") == "true"
    page.evaluate(COUNT_ANNOUNCED)
    feed(page, ", friend.")
    body_has(page, "friend.")
    assert page.evaluate("window.announced") == [], "said while it streamed"
    page.evaluate("window.finish()")
    wait_answer(page, [])
    assert answer.get_attribute("aria-busy") is None
    page.wait_for_function("() => window.announced.length > 0")
    assert page.evaluate("window.announced") == ["smollm2:135m answered: Hi there, friend."]
    assert page.get_attribute("#announce", "aria-live") == "polite"
    # nothing among the messages is a live region: nothing in them is said as it changes, nor said twice
    assert page.locator("#messages [role=status], #messages [role=alert], #messages [aria-live]").count() == 0
    assert page.get_by_role("article", name="You").locator(".text").inner_text() == "Say hi"
    assert page.get_by_role("heading", name="You", level=2).count() == 1
    for name in ["Copy your message", "Edit your message", "Copy the answer", "Edit the answer",
                 "Regenerate the answer"]:
        assert page.get_by_role("button", name=name, exact=True).count() == 1, name
    assert page.get_by_role("heading", level=1).inner_text() == "Say hi"
    # a second answer: said once too, and the first one not again in between
    ids = answer_ids(page)
    page.fill("#input", "Again")
    page.press("#input", "Enter")
    feed(page, "Hello again.")
    body_has(page, "Hello again.")
    page.evaluate("window.finish()")
    wait_answer(page, ids)
    page.wait_for_function("() => window.announced.length > 1")
    assert page.evaluate("window.announced") == ["smollm2:135m answered: Hi there, friend.",
                                                  "smollm2:135m answered: Hello again."]
    # what Copy did is said: its aria-label hides the button's own text
    page.locator("article.assistant").last.get_by_role("button", name="Copy the answer").click()
    page.wait_for_function("() => window.announced.length > 2")
    assert page.evaluate("window.announced")[2] in ("Copied", "Copy failed")
    # the real model's answer, said once it has ended: its words and its note
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    page.evaluate(COUNT_ANNOUNCED)
    ids = answer_ids(page)
    article = ask(page, "Say hello.")
    words = article.locator(".body").inner_text().strip()
    note = article.locator(".note").inner_text()  # cut at max_tokens (8), or none: the model ended first
    page.wait_for_function("() => window.announced.length > 0")
    assert page.evaluate("window.announced") == [" ".join(x for x in ["smollm2:135m answered:", words, note] if x)]
    assert words
    assert len(answer_ids(page)) == len(ids) + 1


NARROW = {"width": 320, "height": 640}


def test_at_320_px_the_open_drawer_keeps_the_focus(browser: Any, server: Server) -> None:
    """docs/webui.md: on a phone, ☰ says whether the drawer is open, and Tab stays in the open drawer (the page under
    it inert: out of reach) until it closes, with Escape or a conversation chosen."""
    t = Tab(browser, server, NARROW)
    page = t.open()
    page.evaluate(THREE_CONVERSATIONS)
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('#conversations .conv').length === 3")
    assert page.get_attribute("#open-sidebar", "aria-expanded") == "false"
    assert page.evaluate("document.querySelector('main').inert") is False
    page.focus("#open-sidebar")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.id === 'new-chat'")
    assert page.get_attribute("#open-sidebar", "aria-expanded") == "true"
    assert page.evaluate("document.querySelector('main').inert") is True  # out of reach, to a screen reader too
    where = []
    for key in ["Tab"] * 6 + ["Shift+Tab"] * 6:
        page.keyboard.press(key)
        where.append(page.evaluate("document.activeElement.closest('#sidebar') ? 'in' : document.activeElement.id"))
    assert set(where) == {"in"}, where
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.activeElement.id === 'open-sidebar'")
    assert page.get_attribute("#open-sidebar", "aria-expanded") == "false"
    assert page.evaluate("document.querySelector('main').inert") is False
    # a conversation chosen in the drawer closes it: the page is in reach again
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.id === 'new-chat'")
    assert page.evaluate("document.querySelector('main').inert") is True
    page.locator("#conversations .conv", has_text="Second").get_by_role("button", name="Second", exact=True).click()
    page.wait_for_function("() => document.querySelector('article.user .text')?.textContent === 'Second?'")
    page.wait_for_function("() => document.getElementById('open-sidebar').getAttribute('aria-expanded') === 'false'")
    assert page.evaluate("document.querySelector('main').inert") is False
    t.close()


def test_at_320_px_the_model_picker_and_its_note_are_not_cut(browser: Any, server: Server) -> None:
    """docs/webui.md: on a phone the model picker shows the model's whole name, and the note under it wraps."""
    t = Tab(browser, server, NARROW)
    page = t.open()
    page.select_option("#model", "gemma3:270m")  # its note the longest: a base model's
    page.wait_for_function("() => document.getElementById('model-note').textContent"
                           " === 'a base model, with no chat template: it cannot chat; pick another'")
    shown = page.evaluate("""() => {
        const picker = document.getElementById('model');
        const name = document.createElement('span');  // the name in the picker's font, measured
        name.textContent = picker.value;
        name.style.cssText = `position: absolute; visibility: hidden; font: ${getComputedStyle(picker).font}`;
        document.body.append(name);
        const s = getComputedStyle(picker);
        const room = picker.getBoundingClientRect().width - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)
            - parseFloat(s.borderLeftWidth) - parseFloat(s.borderRightWidth) - 16;  // less the arrow
        const needs = name.getBoundingClientRect().width;
        name.remove();
        const note = document.getElementById('model-note');
        return {picker: room >= needs,
                note: note.scrollWidth <= note.clientWidth && note.getBoundingClientRect().right <= 320};
    }""")
    assert shown == {"picker": True, "note": True}
    t.close()


def test_at_320_px_a_table_in_an_answer_keeps_its_words_whole(browser: Any, server: Server) -> None:
    """docs/webui.md: an answer's table keeps its words whole on a phone, scrolling sideways in its box (not a letter
    a line), and the page does not scroll sideways."""
    t = Tab(browser, server, NARROW)
    page = t.open()
    page.evaluate(SCRIPTED_STREAM)
    page.fill("#input", "A table, please.")
    page.press("#input", "Enter")
    feed(page, "| " + " | ".join(f"column{k}" for k in range(8)) + " |\n|" + "---|" * 8 + "\n| "
         + " | ".join(f"value{k}" for k in range(8)) + " |\n")
    page.evaluate("window.finish()")
    wait_answer(page, [])
    lines = page.evaluate("""() => [...document.querySelectorAll('article.assistant .body :is(th, td)')].map(cell => {
        const r = document.createRange();  // the lines its text takes
        r.selectNodeContents(cell);
        return r.getClientRects().length;
    })""")
    assert lines == [1] * 16, lines
    assert page.evaluate("(() => { const t = document.querySelector('article.assistant .table');"
                         " return t.scrollWidth > t.clientWidth; })()")
    assert page.evaluate("[document.documentElement.scrollWidth, innerWidth]") == [320, 320]
    t.close()


# the contrast of the message box's placeholder on the colour behind it (WCAG's formula)
PLACEHOLDER_CONTRAST = """() => {
    const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
    const input = document.getElementById('input');
    let behind = input;
    while (rgb(getComputedStyle(behind).backgroundColor)[3] === 0) behind = behind.parentElement;
    const lum = ([r, g, b]) => [r, g, b].map((v) => {
        v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    }).reduce((s, v, k) => s + v * [0.2126, 0.7152, 0.0722][k], 0);
    const style = getComputedStyle(input, '::placeholder');
    const bg = rgb(getComputedStyle(behind).backgroundColor);
    const alpha = (rgb(style.color)[3] ?? 1) * Number(style.opacity);
    const fg = rgb(style.color).slice(0, 3).map((v, k) => v * alpha + bg[k] * (1 - alpha));
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    return (hi + 0.05) / (lo + 0.05);
}"""


def test_the_message_box_placeholder_reads_in_light_and_dark(tab: Tab) -> None:
    """The placeholder of the message box has a contrast of at least 4.5:1 in both colour schemes (WCAG AA)."""
    page = tab.open()
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        ratio = page.evaluate(PLACEHOLDER_CONTRAST)
        assert ratio >= 4.5, (scheme, ratio)


def test_the_server_out_of_reach_is_no_longer_said_once_it_answers(tab: Tab) -> None:
    """The banner that says the server cannot be reached (the models could not be read) goes once the server
    answers again: an answer to the next message, or, with nothing done, the page's own ask every 5 s (webui.md;
    it stayed until Retry, a tab switch or a message)."""
    page = tab.open()
    settings(page, max_tokens=3)
    for ended_by in ("a message", "the page's ask"):
        page.route("**/models", lambda route: route.abort())
        page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")  # a tab shown again reads them
        page.wait_for_function(BANNER_SAYS, arg="Cannot reach the server: is localgen serve still running?")
        page.unroute("**/models")
        if ended_by == "a message":
            ask(page, "Hi")
        page.wait_for_function("() => document.getElementById('banner').hidden", timeout=30_000)

    asked: list[Any] = []  # the page's asks: /v1/models, the first refused, the later ones left hanging

    def ask_once(route: Any) -> None:
        if not route.request.url.endswith("/v1/models"):
            route.abort()  # the loaded models' /models: an answer would say the server is back
            return
        asked.append(route)
        if len(asked) == 1:
            route.abort()

    page.route("**/models", ask_once)
    # a page loaded again: the calls of the ask that found the server back end with the old page (on this one, an
    # answer to its last call, coming after the refusal, said the server was back again, and the page stopped asking)
    page.reload()
    page.wait_for_function(BANNER_SHOWS, arg="Cannot reach the server: is localgen serve still running?")
    page.wait_for_timeout(11_000)  # two of the page's asks were due
    assert len(asked) == 2, len(asked)  # the refused one, then one left hanging
    page.unroute("**/models")


def test_a_message_sent_while_the_server_is_out_of_reach_still_watches_for_it(tab: Tab) -> None:
    """A message typed on a page opened while the server was out of reach (no model listed) said so, and the page
    stopped asking every 5 s: once the server was back the banner stayed, the picker empty, until Retry."""
    page = tab.page
    page.route("**/models", lambda route: route.abort())
    page.goto(tab.url)
    page.wait_for_function(BANNER_SHOWS, arg="Cannot reach the server: is localgen serve still running?")
    page.fill("#input", "Hello")
    page.press("#input", "Enter")
    page.wait_for_function(BANNER_SHOWS, arg="There is no model to answer yet: Cannot reach the server: is localgen "
                                             "serve still running?")
    page.unroute("**/models")
    page.locator("#key-dialog").wait_for(state="visible", timeout=30_000)  # the page's own ask found it: its key
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    page.wait_for_function("() => document.getElementById('banner').hidden")


def test_a_server_that_hangs_is_asked_once_at_a_time(tab: Tab) -> None:
    """While the server is out of reach the page asks every 5 s; one that hangs rather than refuses is asked once
    at a time (an ask every 5 s piled up, each answered at once when it came back)."""
    page = tab.open()
    page.wait_for_function("() => document.getElementById('model-note').textContent === 'loaded'")  # (its calls
    # answered: one answered once the server was out of reach would say it is back)
    asked: list[Any] = []

    def hang_after_the_first(route: Any) -> None:  # (every call of the server's: any answer says it is back)
        asked.append(route.request.url)
        if len(asked) == 1:
            route.abort()  # refused: the banner; the later ones are never answered

    page.route("**/*", lambda route: route.continue_() if "/webui/" in route.request.url else
               hang_after_the_first(route))
    page.evaluate("() => document.dispatchEvent(new Event('visibilitychange'))")  # a tab shown again reads them
    page.wait_for_function(BANNER_SAYS, arg="Cannot reach the server: is localgen serve still running?")
    page.wait_for_timeout(16_000)  # three of the page's asks were due
    assert [url.rpartition("/")[2] for url in asked] == ["models", "models"], asked  # refused, then one hanging


def test_if_none_match_is_read_with_rfc_9110s_weak_comparison(server: Server) -> None:
    """docs/webui.md: a weak tag (W/"..."), as a proxy that compresses the file sends back, a list of tags, or `*`
    was a 200 with the whole file again; each is a 304. A tag that is not the file's is a 200."""
    first = httpx.get(f"{server.url}/webui/app.js")
    tag = first.headers["etag"]
    for asked in (f"W/{tag}", f'"0123", {tag}', f'W/"x", W/{tag}', "*", f"{tag},"):
        r = httpx.get(f"{server.url}/webui/app.js", headers={"If-None-Match": asked})
        assert r.status_code == 304 and not r.content and r.headers["etag"] == tag, asked
    for asked in ('"0123"', tag.strip('"'), f'"{tag}"', ""):
        r = httpx.get(f"{server.url}/webui/app.js", headers={"If-None-Match": asked})
        assert r.status_code == 200 and r.content == first.content, asked


def test_a_server_that_went_away_is_said_plainly(tab: Tab, server: Server) -> None:
    """The last test of the module: it stops the server. The page then says the server cannot be reached,
    and keeps the message for a Regenerate."""
    page = tab.open()
    settings(page, max_tokens=4)
    assert server.stop() == 0
    article = ask(page, "Are you there?")
    note = article.locator(".note").inner_text()
    assert note.startswith("Cannot reach the server: is localgen serve still running?"), note
    assert page.locator("article.user .text").inner_text() == "Are you there?"
