"""`serve` at its edges, as a client meets them: a prompt of no tokens (never decoded, whatever the mode), a
decode that fails (`internal error`, counted), a load whose clients left (dropped before it evicts anything),
clients that leave mid-body or mid-stream (499, with the tokens made for them), stalled connections (closed),
doubled headers, loose types and the words of the errors. Each runs against a `localgen serve` child; the
engine's own refusal and the decode fault run in this process."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_serve import Server
from tests.test_serve_hostile import InProcess

MODEL = "smollm2:135m"
pytestmark = pytest.mark.slow  # every test talks to a server on SmolLM2


@pytest.fixture(scope="module")
def child(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "2048", "--read-timeout", "2")
    yield s
    assert s.stop() == 0


def _still_answers(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "The capital of France is",
                                                  "max_tokens": 3}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


# ---- 1. a prompt of no tokens -------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"prompt": "", "max_tokens": 2, "exact": True},  # the exact path decoded it: llama.cpp aborted the server
    {"prompt": [""], "max_tokens": 2},  # the batch: llama_decode failed, a 500 with its text
    {"prompt": "", "max_tokens": 2, "stream": True},
])
def test_a_prompt_of_no_tokens_is_a_400_and_the_server_lives(child: Server, body: dict[str, Any]) -> None:
    before = child.health()["failed_jobs"]
    r = httpx.post(f"{child.url}/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith("prompt must not be empty") and err["param"] == "prompt"
    assert child.proc.poll() is None, child.log()
    assert child.health()["failed_jobs"] == before
    _still_answers(child.url)


@pytest.mark.parametrize(("path", "param"), [("/v1/chat/completions", "messages"), ("/v1/responses", "input")])
def test_a_chat_that_renders_to_nothing_is_the_templates_error(child: Server, path: str, param: str) -> None:
    name = "blank" + path.replace("/", "-")
    # a template that renders nothing at all is refused by create (engine/template.py); one that shows only system
    # messages renders nothing for a conversation without one
    only_system = "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% endif %}{% endfor %}"
    made = httpx.post(f"{child.url}/api/create", json={"model": name, "from": MODEL, "stream": False,
                                                       "template": only_system}, timeout=60)
    assert made.status_code == 200, made.text
    try:
        body = {"messages": HI, "max_tokens": 2} if param == "messages" else {"input": "hi", "max_output_tokens": 2}
        r = httpx.post(f"{child.url}{path}", json={"model": name, **body}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "chat template rendered nothing for this conversation" in err["message"], err
    finally:
        httpx.request("DELETE", f"{child.url}/api/delete", json={"model": name}, timeout=60)


def test_an_empty_string_a_model_gives_a_bos_for_is_a_prompt(child: Server) -> None:
    # gemma3 adds BOS: "" is one token there, which it completes (decided on tokens, not on the string)
    r = httpx.post(f"{child.url}/v1/completions", json={"model": "gemma3:270m", "prompt": "", "max_tokens": 2,
                                                        "exact": True}, timeout=300)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1, r.text


def test_the_engine_refuses_a_prompt_of_no_tokens(smollm2_engine: Any) -> None:
    from localgen.errors import EmptyPrompt, UsageError
    from localgen.native.prompt import Prompt
    from localgen.types import SamplingParams

    with pytest.raises(EmptyPrompt) as e:
        smollm2_engine.generate(Prompt.text([]), SamplingParams(max_tokens=2))
    assert isinstance(e.value, UsageError) and e.value.exit_code == 2 and e.value.status == 400


def test_llamacpp_abort_is_a_json_line_when_the_log_is_json(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("from localgen.native.lib import abort_line, lib, libggml\n"
              "from localgen.serve.servelog import fatal_line\n"
              "abort_line(fatal_line)\nlib()\nlibggml().ggml_abort(b'x.c', 1, b'GGML_ASSERT(boom) failed')\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stderr.strip().splitlines()[-1])
    assert doc["event"] == "error" and "llama.cpp stopped: GGML_ASSERT(boom) failed" in doc["message"]
    assert doc["exit_code"] == 1


# ---- 2. a decode that fails ---------------------------------------------------------------------------

def test_a_failed_decode_says_internal_error_and_health_counts_it(smollm2_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen.errors import LocalgenError

    s = InProcess(smollm2_path)
    try:
        _still_answers(s.url)  # warmed up (in the worker's thread) before the fault goes in
        pc = s.worker.residence.pc

        def decode(n: int, cancelled: Any = None) -> bool:
            raise LocalgenError("llama_decode failed (-1) with 1 sequence")

        monkeypatch.setattr(pc, "decode", decode)
        r = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4}, timeout=60)
        monkeypatch.undo()
        assert r.status_code == 500 and r.json()["error"]["message"].startswith("internal error"), r.text
        assert "llama_decode" not in r.text
        health = httpx.get(f"{s.url}/health").json()["models"][MODEL]
        assert health["failed_jobs"] == 1 and health["last_error"].startswith("decoding")
        _still_answers(s.url)
    finally:
        s.close()


# ---- 3. a load whose clients left ---------------------------------------------------------------------

LEAVERS = [  # a generation, and the loads that generate nothing (llama-server's, Ollama's empty prompt)
    ("/v1/completions", {"model": "gemma3:270m", "prompt": "Hi", "max_tokens": 2}),
    ("/models/load", {"model": "gemma3:270m"}),
    ("/api/generate", {"model": "gemma3:270m", "prompt": ""}),
]


@pytest.mark.parametrize(("path", "body"), LEAVERS, ids=[p for p, _ in LEAVERS])
def test_a_load_whose_client_left_evicts_nothing(cli_env: dict[str, str], gemma_path: Path, path: str,
                                                 body: dict[str, Any]) -> None:
    s = Server(cli_env, "--max-models", "1", "-np", "1")
    try:
        busy: dict[str, Any] = {}

        def long() -> None:
            busy["r"] = httpx.post(f"{s.url}/v1/completions", json={
                "model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}, timeout=300)

        t = threading.Thread(target=long)
        t.start()
        while s.health()["running"] == 0:
            time.sleep(0.05)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{s.url}{path}", json=body, headers={"X-Request-Id": "leaver"}, timeout=2)
        assert " 499 " in s.access("leaver"), s.log()  # dropped at once, not after --load-wait
        assert "gemma3:270m waits for room" in s.log(), "the load waited for SmolLM2's room when its client left"
        health = httpx.get(f"{s.url}/health", timeout=10).json()
        assert health["residency"]["waiting"] == [] and health["models"][MODEL]["yielding_to"] == []
        t.join()
        assert busy["r"].status_code == 200
        _still_answers(s.url)  # a load still waiting would have had the room first (fair swap), evicting SmolLM2
        assert httpx.get(f"{s.url}/health", timeout=10).json()["residency"]["loaded"] == [MODEL]
        assert "to make room for gemma3" not in s.log() and "loaded gemma3" not in s.log()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize(("path", "body"), [("/models/load", {"model": MODEL}),
                                            ("/api/generate", {"model": MODEL, "prompt": ""})])
def test_a_load_answers_nothing_so_counts_no_tokens(child: Server, path: str, body: dict[str, Any]) -> None:
    def prompt_tokens() -> float:
        text = httpx.get(f"{child.url}/metrics", timeout=10).text
        found = re.search(r'^localgen_prompt_tokens_total\{model="smollm2:135m"\} (\S+)$', text, re.M)
        return float(found[1]) if found else 0.0

    before = prompt_tokens()
    rid = "loadonly" + path.replace("/", "-")
    r = httpx.post(f"{child.url}{path}", json=body, headers={"X-Request-Id": rid}, timeout=60)
    assert r.status_code == 200, r.text
    line = child.access(rid)
    assert " 200 " in line and " tokens " not in line, line
    assert prompt_tokens() == before


# ---- 5. clients that leave ----------------------------------------------------------------------------

def test_a_client_that_leaves_mid_stream_is_a_499_with_its_tokens(child: Server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{child.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Request-Id": "streamleaver"}) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    line = child.access("streamleaver")
    assert re.search(r" 499 \d+\+\d+ tokens ", line), child.log()


def test_a_client_that_leaves_mid_body_is_a_499(child: Server) -> None:
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: bodyleaver\r\nContent-Length: 100\r\n\r\n{\"mo")
        time.sleep(0.5)
    assert " 499 " in child.access("bodyleaver"), child.log()
    metrics = httpx.get(f"{child.url}/metrics", timeout=10).text
    assert 'status="none"' not in metrics


_ASK = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2}).encode()  # a completion of two tokens


def _completion_request() -> bytes:
    """_ASK as a raw /v1/completions request, to send on a socket and leave."""
    return (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(_ASK)) + _ASK


def _hold_decodes(s: Any, gate: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process server warmed up, then each decode of its worker held until `gate` is set (a long step)."""
    _still_answers(s.url)
    pc = s.worker.residence.pc
    real = pc.decode

    def decode(n: int, cancelled: Any = None) -> bool:
        gate.wait(120)
        return bool(real(n, cancelled))

    monkeypatch.setattr(pc, "decode", decode)


def test_clients_that_leave_the_queue_give_up_their_places_at_once(smollm2_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued client that leaves frees its place in the queue (its bound, /health's queued and /metrics'
    queue_depth) when it leaves, not at the model's next step: here the worker is held inside its first decode
    all along (a long step), and the queue was full (a 503 "all 2 slots are busy and 4 requests wait") until it
    returned."""
    s = InProcess(smollm2_path)  # 2 slots, 4 in the queue
    head = _completion_request()
    socks: list[socket.socket] = []
    gate = threading.Event()
    try:
        _hold_decodes(s, gate, monkeypatch)
        socks.append(socket.create_connection(("127.0.0.1", s.port)))
        socks[0].sendall(head)
        health = _until(s.url, lambda h: h["running"] == 1)
        assert health["running"] == 1, "the first request is in its slot, its decode held"
        for _ in range(5):  # one more slot and the queue: each waits, as the worker is held
            socks.append(socket.create_connection(("127.0.0.1", s.port)))
            socks[-1].sendall(head)
        assert _until(s.url, lambda h: h["queued"] == 5)["queued"] == 5
        full = httpx.post(f"{s.url}/v1/completions", content=_ASK, headers={"Content-Type": "application/json"},
                          timeout=30)
        assert full.status_code == 503 and "requests wait" in full.json()["error"]["message"], full.text
        for sock in socks[2:]:  # four queued clients leave
            sock.close()
        assert _until(s.url, lambda h: h["queued"] == 1)["queued"] == 1, "their places are free"
        metrics = httpx.get(f"{s.url}/metrics", timeout=10).text
        assert re.search(r'localgen_queue_depth\{model="smollm2:135m"\} 1\.0', metrics), metrics
        got: dict[str, httpx.Response] = {}
        later = threading.Thread(target=lambda: got.update(r=httpx.post(
            f"{s.url}/v1/completions", content=_ASK, headers={"Content-Type": "application/json"}, timeout=120)))
        later.start()
        assert _until(s.url, lambda h: h["queued"] == 2)["queued"] == 2, "the next client took a place"
        gate.set()
        later.join(120)
        assert got["r"].status_code == 200, got["r"].text
    finally:
        gate.set()
        for sock in socks:
            sock.close()
        s.close()


def test_clients_that_send_and_leave_while_the_model_is_busy_do_not_pile_up(smollm2_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves gives up its place at once, but its request waits for the model's next step: past
    twice the bound (2 slots + 4 in the queue) of them held there, a new request is a 503, so clients that send
    and leave while the worker is held (a long step) cannot pile up requests without limit."""
    from localgen.serve.jobs import WAITING
    from localgen.serve.livejobs import left

    s = InProcess(smollm2_path)  # 2 slots, 4 in the queue
    head = _completion_request()
    gate = threading.Event()
    first = socket.create_connection(("127.0.0.1", s.port))
    try:
        _hold_decodes(s, gate, monkeypatch)
        first.sendall(head)
        assert _until(s.url, lambda h: h["running"] == 1)["running"] == 1, "the worker is held in a decode"
        live = s.worker._live
        refused = 0
        for _ in range(16):
            before = len(live)
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(head)
            sock.settimeout(0.05)
            answer = b""
            deadline = time.monotonic() + 30  # a safety net: either its job is taken in or it is answered
            while len(live) == before and not answer and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    answer = sock.recv(65536)
            if answer.startswith(b"HTTP/1.1 503"):
                refused += 1
                while b"step" not in answer and time.monotonic() < deadline:  # its body, if it came apart
                    with contextlib.suppress(TimeoutError):
                        answer += sock.recv(65536)
                assert b"clients that left wait for the model's next step" in answer, answer
            sock.close()
            deadline = time.monotonic() + 30  # the server sees it leave before the next one comes (loaded,
            while any(not left(j) for j in live.of(*WAITING)) and time.monotonic() < deadline:  # not at once)
                time.sleep(0.01)
        assert len(live) <= 12, f"{len(live)} jobs held for clients that left"
        assert refused >= 5, refused
    finally:
        gate.set()
        first.close()
        s.close()


def _until(url: str, done: Any) -> dict[str, Any]:
    """/health's entry for the model once `done` says so of it (or after 30 s, a safety net: the caller asserts)."""
    deadline = time.monotonic() + 30
    while True:
        health = dict(httpx.get(f"{url}/health", timeout=10).json()["models"][MODEL])
        if done(health) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


# ---- 4. stalled connections ---------------------------------------------------------------------------

def _closed_by_server(port: int, data: bytes) -> bytes:
    """What the server sends on a connection the client stalls on, until the server closes it (a safety net
    well past --read-timeout: a connection held open fails the test)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(60)
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(4096):
            out += chunk
        return out


@pytest.mark.parametrize("data", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: loc"], ids=["nothing", "half-header"])
def test_a_connection_that_sends_no_whole_request_is_closed(child: Server, data: bytes) -> None:
    assert _closed_by_server(child.port, data) == b""


def _one_answer(sock: socket.socket) -> bytes:
    """One whole response (with a Content-Length) read from the connection; b"" when it was closed."""
    out = b""
    while b"\r\n\r\n" not in out and (chunk := sock.recv(65536)):
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    while length is not None and len(body) < int(length[1]) and (chunk := sock.recv(65536)):
        body += chunk
    return out and head + b"\r\n\r\n" + body


def test_an_idle_connection_stays_open_for_the_read_timeout(cli_env: dict[str, str]) -> None:
    # serve.md: the next request's headers are due within --read-timeout of the previous answer's end
    s = Server(cli_env, "--read-timeout", "9")
    try:
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.settimeout(30)
            ask = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
            sock.sendall(ask)
            assert _one_answer(sock).startswith(b"HTTP/1.1 200")
            time.sleep(6)  # past uvicorn's own keep-alive default (5 s), well within --read-timeout
            sock.sendall(ask)
            assert _one_answer(sock).startswith(b"HTTP/1.1 200"), "the idle connection was closed early"
            assert sock.recv(65536) == b"", "closed after --read-timeout idle"
    finally:
        assert s.stop() == 0


def test_a_stalled_body_is_a_408_and_closed(child: Server) -> None:
    out = _closed_by_server(child.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                                        b"application/json\r\nContent-Length: 100\r\n\r\n{")
    assert out.startswith(b"HTTP/1.1 408") and b"--read-timeout" in out, out


def _trickled(port: int, head: bytes) -> bytes:
    """What the server answers a body sent a byte at a time, each well within --read-timeout (2 s) of the one
    before, until it closes the connection (a safety net of 60 s: a connection held that long fails the test)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head)
        sock.settimeout(0.5)
        out = b""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(b" ")
                continue
            if not chunk:
                break
            out += chunk
        return out


UPLOAD_HEAD = (b"POST /v1/files HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
               b"Content-Length: 100000\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n")


@pytest.mark.parametrize(("head", "what"), [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
     b"Content-Length: 100000\r\n\r\n{", b"the request body"),
    (UPLOAD_HEAD, b"the upload")], ids=["json", "upload"])
def test_a_trickled_body_is_a_408_and_closed(child: Server, head: bytes, what: bytes) -> None:
    # serve.md: a body has --read-timeout seconds and one more per 500 bytes; one byte every 0.5 s never
    # stalled for --read-timeout, and ~300 such connections locked every client out
    out = _trickled(child.port, head)
    assert out.startswith(b"HTTP/1.1 408") and what + b" came too slowly" in out, out[:400]
    assert b"--read-timeout" in out and b'"error"' in out, out


@pytest.mark.parametrize("route", [b"/v1/files", b"/v1/audio/transcriptions"])
def test_a_client_that_leaves_mid_upload_is_a_499_not_a_traceback(child: Server, route: bytes) -> None:
    # batch.md: an upload cut short leaves nothing; the server's log had the 499's line, then a traceback of
    # starlette's ClientDisconnect (a `curl -F file=@big.jsonl` stopped with Ctrl-C)
    ident = "upleaver" + route.decode().rsplit("/", 1)[-1]
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(UPLOAD_HEAD.replace(b"/v1/files", route).replace(b"Host: localhost\r\n", b"Host: localhost\r\n"
                                                                      b"X-Request-Id: " + ident.encode() + b"\r\n"))
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while " 499 " not in child.access(ident) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert " 499 " in child.access(ident), child.log()
    assert "Traceback" not in child.log() and "ClientDisconnect" not in child.log(), child.log()


def test_a_malformed_chunk_as_its_handler_reads_is_its_400_and_no_traceback(child: Server) -> None:
    # uvicorn answers a malformed chunk 400 and closes while the route still waits for the body: a close made to
    # linger (as after a 408) left the route deaf to it, and its own 408, due 2 s later, was written after the
    # half-close ("Cannot call write() after write_eof()", a traceback; the access line said 408)
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.settimeout(30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: badchunk\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        time.sleep(1.5)  # (within --read-timeout 2 of the first part; the route's deadline falls 0.5 s on)
        sock.sendall(b"zz\r\n")  # not a chunk's size
        out = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                out += chunk
        assert out.startswith(b"HTTP/1.1 400"), out[:200]
        time.sleep(2)  # the socket held open past the route's deadline
    line = child.access("badchunk")
    assert " 408 " not in line and "Traceback" not in child.log() and "write_eof" not in child.log(), child.log()


def test_a_408_names_the_deadline_that_bounded_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # which deadline a timed-out wait had decides the line, not the clock when the 408 is written: on a loaded
    # machine a trickle's 408 (CI, 2026-12-01) came out as a stall
    from types import SimpleNamespace

    from localgen.serve import stalls
    now = [100.0]
    monkeypatch.setattr(stalls, "time", SimpleNamespace(monotonic=lambda: now[0]))
    clock = stalls.BodyClock(2)
    now[0] += 0.003  # a body that sends nothing (or its first byte with the headers, and no more) is a stall
    assert clock.wait() == pytest.approx(1.997) and "stalled: no byte came for 2 s" in clock.late("the body").message
    now[0] -= 0.003
    now[0] += 0.5
    clock.took(b"x")
    assert clock.wait() == pytest.approx(1.502)
    now[0] += 0.001  # the 408 is written before the whole body's deadline has passed by the clock now
    assert "the body came too slowly: 1 bytes in 1 s" in clock.late("the body").message


def test_a_body_on_a_slow_link_is_read_past_the_read_timeout(child: Server) -> None:
    # a body that keeps coming at a few KB/s is never cut, however long it takes (here 3 s, past --read-timeout 2)
    body = b'{"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 1}' + b" " * (30 << 10)
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 3 << 10):
            sock.sendall(body[i:i + (3 << 10)])
            time.sleep(0.3)
        sock.settimeout(60)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200") and b'"completion_tokens":1' in out.replace(b" ", b""), out[:300]


# serve.md: a request's line and headers are at most 64 KiB together (httptools bounds neither, and builds
# them at a cost quadratic in their length, holding every client: the server answered /health after 12 s
# while one client sent a 128 MB URL)
@pytest.mark.parametrize("head", [b"GET /health?" + b"x" * (70 << 10),  # never ends: refused as it comes
                                  b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"y" * (70 << 10),
                                  b"GET /health?" + b"x" * (40 << 10) + b" HTTP/1.1\r\nHost: localhost\r\nX-Big: "
                                  + b"y" * (30 << 10) + b"\r\n\r\n"],  # each under the bound, not the two
                         ids=["url", "header", "both"])
def test_a_request_head_over_64_kib_is_a_431_and_closed(child: Server, head: bytes) -> None:
    out = _closed_by_server(child.port, head)
    assert out.startswith(b"HTTP/1.1 431") and b"65536 bytes" in out, out[:300]
    assert httpx.get(f"{child.url}/health", timeout=10).status_code == 200


def test_a_head_under_64_kib_and_a_body_sent_with_it_are_read(child: Server) -> None:
    body = b'{"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 1}' + b" " * (200 << 10)
    out = _closed_by_server(child.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close"
                            b"\r\nContent-Type: application/json\r\nX-Big: " + b"y" * (60 << 10) +
                            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 200") and b'"completion_tokens":1' in out.replace(b" ", b""), out[:300]


# serve.md: every body is bounded, Ollama's DELETE /api/delete's too (it read any body, whole, with no deadline)
DELETE = b"DELETE /api/delete HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


def test_a_delete_body_over_max_body_is_a_413(child: Server) -> None:
    out = _closed_by_server(child.port, DELETE + b"Content-Length: %d\r\n\r\n{" % (17 << 20))
    assert out.startswith(b"HTTP/1.1 413") and b"--max-body" in out, out[:300]


def test_a_stalled_delete_body_is_a_408_and_closed(child: Server) -> None:
    out = _closed_by_server(child.port, DELETE + b"Content-Length: 100\r\n\r\n{")
    assert out.startswith(b"HTTP/1.1 408") and b"--read-timeout" in out, out


def test_a_delete_client_that_leaves_mid_body_is_a_499_not_a_traceback(child: Server) -> None:
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(DELETE + b"X-Request-Id: deleteleaver\r\nContent-Length: 100\r\n\r\n{\"mo")
        time.sleep(0.5)
    assert " 499 " in child.access("deleteleaver"), child.log()
    assert "Traceback" not in child.log()


def test_a_delete_with_no_type_still_deletes_what_it_names(child: Server) -> None:
    r = httpx.request("DELETE", f"{child.url}/api/delete", content=b'{"model": "no-such-model:1b"}', timeout=30)
    assert r.status_code == 404, r.text  # read as JSON, as Ollama's /api/* bodies are: its name was looked up


# api.md: a path no route serves is the API's 404, a trailing slash too (Starlette answered a bare 307 to a URL
# built from the Host header)
@pytest.mark.parametrize("path", ["/health/", "/v1/chat/completions/", "/api/tags/"])
def test_a_trailing_slash_is_the_apis_404_not_a_redirect(child: Server, path: str) -> None:
    r = httpx.get(f"{child.url}{path}", timeout=30)
    assert r.status_code == 404 and "error" in r.json(), (r.status_code, r.headers, r.text)
    assert "location" not in r.headers


# serve.md: a transfer coding other than chunked is a 501 (RFC 9112); `gzip, chunked` was read as if not gzipped
def test_a_transfer_coding_the_server_does_not_decode_is_a_501(child: Server) -> None:
    body = b'{"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 1}'
    out = _closed_by_server(child.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                            b"application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                            % (len(body), body))
    assert out.startswith(b"HTTP/1.1 501") and b"gzip, chunked" in out, out[:300]
    chunked = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close"
    out = _closed_by_server(child.port, chunked + b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                            % (len(body), body))
    assert out.startswith(b"HTTP/1.1 200"), out[:300]  # chunked alone is read


# /api/pull read " smollm2:135m\n" as smollm2:135m and answered success, where other routes found no such model
@pytest.mark.parametrize("path", ["/api/pull", "/api/show"])
@pytest.mark.parametrize("name", [MODEL + "\n", " " + MODEL, MODEL + "\t"])
def test_a_model_name_with_blanks_around_it_is_a_400(child: Server, path: str, name: str) -> None:
    r = httpx.post(f"{child.url}{path}", json={"model": name, "stream": False}, timeout=60)
    assert r.status_code == 400 and "blanks around it or control characters" in r.json()["error"], r.text


# ---- 6. headers a request may carry once --------------------------------------------------------------

@pytest.mark.parametrize("doubled", [b"Host: localhost\r\nHost: evil.com",
                                     b"Host: localhost\r\nContent-Type: application/json\r\nContent-Type: text/plain",
                                     b"Host: localhost\r\nContent-Type: application/json\r\nContent-Length: 2"])
def test_a_doubled_host_or_content_type_is_a_400(child: Server, doubled: bytes) -> None:
    body = b'{"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 1}'
    out = _closed_by_server(child.port, b"POST /v1/completions HTTP/1.1\r\n" + doubled + b"\r\nConnection: close"
                            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 400"), out
    if b"Content-Length: 2" in doubled:  # the HTTP parser refuses that one itself, before serve (serve.md)
        assert b"text/plain" in out and out.endswith(b"Invalid HTTP request received."), out
    else:
        assert b"more than one" in out, out


def test_a_request_without_host_is_allowed(child: Server) -> None:  # HTTP/1.0 clients send none (serve.md)
    out = _closed_by_server(child.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out


# ---- 7-9. loose types and the words of the errors: each a 400 naming the request's own field ---------------

HI = [{"role": "user", "content": "hi"}]
WORDS = [  # (route, body, words the message holds, the param, or None for APIs whose errors carry none)
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "mirostat_tau": 500}, "mirostat_tau must be",
     "mirostat_tau"),
    ("/api/chat", {"messages": HI, "stream": False, "options": {"mirostat_tau": 500}}, "options.mirostat_tau must be",
     None),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "dynatemp_exponent": 50}, "dynatemp_exponent must be",
     "dynatemp_exponent"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "dry_sequence_breakers": 5},
     "dry_sequence_breakers must be", "dry_sequence_breakers"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "temperature": 50}, "temperature must be within",
     "temperature"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": True}, "max_tokens must be an integer", "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": 50}, "logprobs must be an integer from 0 to 20",
     "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "system, developer, user", "messages"),
    ("/v1/messages", {"messages": HI, "max_tokens": 2, "tools": [{"name": "x", "input_schema": 5}]},
     "input_schema must be a JSON Schema object", None),
    ("/v1/messages", {"messages": HI, "max_tokens": 2, "tools": [{"name": 5, "input_schema": {}}]},
     "tools[0].name must be", None),
    ("/v1/messages", {"messages": HI, "max_tokens": 10**12}, "max_tokens must be an integer from 1 to", None),
    ("/v1/messages", {"messages": HI, "max_tokens": 2, "thinking": {"type": "enabled", "budget_tokens": 3 * 10**9}},
     "thinking.budget_tokens must be an integer from 1,024 to 2,147,483,647", None),
    ("/v1/messages", {"messages": HI, "max_tokens": 2, "temperature": 5}, "temperature must be a number from 0 to 1",
     None),
    ("/v1/messages", {"messages": HI, "max_tokens": 2, "top_p": 1.5}, "top_p must be a number from 0 to 1", None),
    ("/v1/messages", {"messages": [{"role": "user", "content": []}], "max_tokens": 2},
     "messages.0: all messages must have non-empty content", None),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": 5}]}, "tools[0].name must be",
     "tools[0]"),
    ("/v1/responses", {"input": "hi", "previous_response_id": "x" * 100_000}, "Previous response with id",
     "previous_response_id"),
    ("/api/embed", {"input": "hi", "dimensions": 10**9}, "dimensions must be within 1 to", None),
    ("/api/generate", {"prompt": "hi", "stream": "no"}, "`stream` must be true or false", None),
    ("/api/generate", {"prompt": "hi", "suffix": "end", "stream": False}, "`suffix` is not supported", None),
    ("/api/generate", {"prompt": "hi", "context": [1, 2, 3], "stream": False}, "`context` is not supported", None),
    ("/api/generate", {"prompt": "hi", "context": "x", "stream": False}, "`context` must be a list", None),
    ("/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}", "stream": False}, "`template` is not supported",
     None),
    ("/api/generate", {"prompt": "hi", "template": 5, "stream": False}, "`template` must be a string", None),
    ("/api/generate", {"prompt": "hi", "think": True, "stream": False}, '"smollm2:135m" does not support thinking',
     None),
    ("/api/chat", {"messages": HI, "think": "low", "stream": False}, '"smollm2:135m" does not support thinking', None),
    ("/api/chat", {"messages": [*HI, {"role": "tool", "content": "x", "tool_name": 5}], "stream": False},
     "`tool_name` must be a string", None),
    ("/api/pull", {"model": "x/y:", "stream": False}, "empty parts", None),
    ("/api/chat", {"messages": HI, "options": {"stop": "x"}, "stream": False},
     "options.stop must be a list of strings", None),  # as Ollama: 'option "stop" must be of type array'
]


@pytest.mark.parametrize(("path", "body", "words", "param"), WORDS, ids=[f"{p}-{w[:24]}" for p, _, w, _ in WORDS])
def test_an_error_names_what_the_client_sent(child: Server, path: str, body: dict[str, Any], words: str,
                                             param: str | None) -> None:
    r = httpx.post(f"{child.url}{path}", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    doc = r.json()
    err = doc["error"]
    message = err if isinstance(err, str) else err["message"]
    assert words in message, message
    assert "--" not in message and "mirostat_ent" not in message and "-1" not in message
    assert len(r.text) < 2_000, "a long value is cut, not echoed whole"
    if param is not None:
        assert err["param"] == param


def test_ollama_generate_takes_what_asks_nothing_of_it(child: Server) -> None:
    """`context: []` continues nothing, `template: ""` overrides nothing, `think: false` asks no thinking: each is
    answered as the request without it is (docs/api.md), and no answer carries a `context` to send back."""
    body = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 3, "temperature": 0}}
    plain = httpx.post(f"{child.url}/api/generate", json=body, timeout=60).json()
    assert "context" not in plain
    for extra in ({"context": []}, {"template": ""}, {"think": False}, {"context": None, "template": None}):
        r = httpx.post(f"{child.url}/api/generate", json={**body, **extra}, timeout=60)
        assert r.status_code == 200 and r.json()["response"] == plain["response"], (extra, r.text)


def test_anthropic_allows_an_empty_final_assistant_message(child: Server) -> None:
    r = httpx.post(f"{child.url}/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": [
        *HI, {"role": "assistant", "content": ""}]}, timeout=60)
    assert r.status_code == 200, r.text


# ---- true/false fields: "no" is a 400 naming the field, never read as true (api.md) ---------------------

RESULT = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4", "is_error": "no"}]}]
FLAGS = [  # (route, body, the field as the 400 names it)
    ("/api/generate", {"prompt": "hi", "raw": "no", "stream": False, "options": {"num_predict": 1}}, "raw"),
    ("/api/chat", {"messages": HI, "parallel_tool_calls": "no", "stream": False, "options": {"num_predict": 1}},
     "parallel_tool_calls"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "logprobs": "no"}, "logprobs"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "stream": True,
                              "stream_options": {"include_usage": "no"}}, "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "echo": "no"}, "echo"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1, "background": "no"}, "background"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "return_documents": "no"}, "return_documents"),
    ("/v1/messages", {"max_tokens": 1, "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]}, *RESULT]},
     "is_error"),
]


@pytest.mark.parametrize(("path", "body", "field"), FLAGS, ids=[f"{p}-{f}" for p, _, f in FLAGS])
def test_a_true_false_field_of_no_is_a_400(child: Server, path: str, body: dict[str, Any], field: str) -> None:
    r = httpx.post(f"{child.url}{path}", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    message = err if isinstance(err, str) else err["message"]
    assert f"`{field}` must be true or false" in message, message



# api.md: every field is validated as the flags are. JSON allows an integer past a float's range (1 and 400
# zeros); float() raised OverflowError on it: a 500 with a traceback, and the connection reset after it.
HUGE = "1" + "0" * 400
HUGE_FIELDS = [  # (route, body with the number as "HUGE", the field as the 400 names it)
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "temperature": "HUGE"}, "temperature"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "top_p": "HUGE"}, "top_p"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "min_p": "HUGE"}, "min_p"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "presence_penalty": "-HUGE"}, "presence_penalty"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "mirostat_tau": "HUGE"}, "mirostat_tau"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1, "temperature": "HUGE"}, "temperature"),
    ("/api/chat", {"messages": HI, "stream": False, "options": {"temperature": "HUGE"}}, "temperature"),
    ("/api/chat", {"messages": HI, "stream": False, "keep_alive": "HUGE"}, "keep_alive"),
    ("/api/generate", {"prompt": "hi", "stream": False, "keep_alive": "-HUGE"}, "keep_alive"),
    ("/api/embed", {"input": "hi", "keep_alive": "HUGE"}, "keep_alive"),
]


@pytest.mark.parametrize(("path", "body", "field"), HUGE_FIELDS, ids=[f"{p}-{f}" for p, _, f in HUGE_FIELDS])
def test_an_integer_past_a_floats_range_is_a_400_naming_the_field(child: Server, path: str, body: dict[str, Any],
                                                                  field: str) -> None:
    text = json.dumps({"model": MODEL, **body}).replace('"HUGE"', HUGE).replace('"-HUGE"', "-" + HUGE)
    r = httpx.post(f"{child.url}{path}", content=text, headers={"Content-Type": "application/json"}, timeout=120)
    assert r.status_code == 400, r.text
    assert field in r.text and "finite" in r.text, r.text


@pytest.mark.parametrize("bias", ['{"TOKEN": -HUGE}', "[[TOKEN, -HUGE]]"])
def test_a_logit_bias_past_a_floats_range_is_minus_infinity(child: Server, smollm2_engine: Any, bias: str) -> None:
    ask = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "temperature": 0}
    greedy = httpx.post(f"{child.url}/v1/completions", json=ask, timeout=120).json()["choices"][0]["text"]
    token = smollm2_engine.tokenize(greedy, add_special=False)[0]  # the session's SmolLM2: same vocabulary
    body = json.dumps({**ask, "logit_bias": "BIAS"})
    body = body.replace('"BIAS"', bias.replace("TOKEN", str(token)).replace("HUGE", HUGE))
    r = httpx.post(f"{child.url}/v1/completions", content=body, headers={"Content-Type": "application/json"},
                   timeout=120)
    assert r.status_code == 200, r.text  # as -1e400 is: a bias of -inf bans the token, the greedy first one here
    assert greedy and r.json()["choices"][0]["text"] != greedy, (greedy, r.text)


# ---- a worker thread that stops -----------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end, on purpose
def test_a_stopped_worker_makes_health_a_503_and_its_requests_503s_at_once(smollm2_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """serve.md, Faults: /health answers 503 with "status": "error" (and the model's `alive` false) once a
    model's worker has stopped, and its requests then get 503 at once."""
    s = InProcess(smollm2_path)
    try:
        _still_answers(s.url)
        assert httpx.get(f"{s.url}/health").json()["status"] == "ok"

        def step(sched: Any) -> None:
            raise RuntimeError("the worker's loop broke")

        monkeypatch.setattr(s.worker, "_step", step)
        r = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 500 and "the worker's loop broke" not in r.text, r.text
        s.worker.thread.join(30)
        health = httpx.get(f"{s.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert health.json()["models"][MODEL]["alive"] is False
        t0 = time.monotonic()
        again = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4},
                           timeout=60)
        assert again.status_code == 503 and "worker has stopped" in again.json()["error"]["message"], again.text
        assert time.monotonic() - t0 < 30, "at once, not after a wait"
    finally:
        s.close()


def test_a_downloaded_files_numbers_are_not_its_access_lines_tokens(child: Server) -> None:
    """The access line's tokens come from generation (and embeddings) alone: a file downloaded from
    /v1/files/{id}/content whose text holds usage numbers is no tokens."""
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL, "messages": HI, "metadata": {"prompt_tokens": 33, "completion_tokens": 4}}})
    up = httpx.post(f"{child.url}/v1/files", data={"purpose": "batch"},
                    files={"file": ("in.jsonl", (line + "\n").encode(), "application/jsonl")}, timeout=60)
    assert up.status_code == 200, up.text
    got = httpx.get(f"{child.url}/v1/files/{up.json()['id']}/content", headers={"X-Request-Id": "files-content"},
                    timeout=60)
    assert got.status_code == 200 and b'"prompt_tokens": 33' in got.content
    said = child.access("files-content")
    assert said.startswith(f"GET /v1/files/{up.json()['id']}/content 200 ") and "tokens" not in said, said
    made = httpx.post(f"{child.url}/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2},
                      headers={"X-Request-Id": "files-chat"}, timeout=120)
    usage = made.json()["usage"]
    assert f" 200 {usage['prompt_tokens']}+{usage['completion_tokens']} tokens " in child.access("files-chat")
    embedded = httpx.post(f"{child.url}/v1/embeddings", json={"model": MODEL, "input": "hi there"},
                          headers={"X-Request-Id": "files-embed"}, timeout=120)
    assert embedded.status_code == 200, embedded.text
    used = embedded.json()["usage"]["prompt_tokens"]
    line = child.access("files-embed")
    assert f" 200 {used}+0 tokens " in line or f" 200 {used} tokens " in line, line
    counted = httpx.post(f"{child.url}/v1/messages/count_tokens", json={"model": MODEL, "messages": HI},
                         headers={"X-Request-Id": "files-count"}, timeout=120)  # the prompt counted, none made
    assert counted.status_code == 200, counted.text
    assert f" 200 {counted.json()['input_tokens']}+0 tokens " in child.access("files-count")


def test_a_model_file_whose_name_is_not_utf8_is_served(cli_env: dict[str, str], smollm2_path: Path,
                                                       tmp_path: Path) -> None:
    """A file name's byte that is not UTF-8 (0xe8) was kept as a lone surrogate in the model's name: every route
    that names it (/health, /v1/models, an answer) was a 500 (Starlette's JSON encoding failed). It is named as
    \\xe8 now, and the file opens."""
    link = tmp_path / "mod\udce8le.gguf"
    link.symlink_to(smollm2_path)
    s = Server(cli_env, "-m", str(link), "--ctx", "512", "-np", "1")
    try:
        for route in ("/health", "/v1/models", "/api/tags", "/models"):
            r = httpx.get(f"{s.url}{route}", timeout=60)
            assert r.status_code == 200, (route, r.text)
        assert httpx.get(f"{s.url}/v1/models").json()["data"][0]["id"] == "mod\\xe8le.gguf"
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
            "model": "mod\\xe8le.gguf", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["model"] == "mod\\xe8le.gguf", r.text
    finally:
        assert s.stop() == 0


# ---- a number JSON has not: NaN, Infinity, past a double's range --------------------------------------

NOT_FINITE = [  # (route, body as JSON text, the param the 400 names: where the number is)
    ("/v1/responses", '{"input": "hi", "max_output_tokens": 16, "tools": [{"type": "function", "name": "f", '
     '"parameters": {"type": "object", "properties": {"a": {"type": "number", "maximum": 1e999}}}}]}',
     "tools.0.parameters.properties.a.maximum"),
    ("/v1/responses", '{"input": "hi", "max_output_tokens": 16, "stream": true, "text": {"format": {"type": '
     '"json_schema", "name": "n", "schema": {"type": "number", "minimum": NaN}}}}', "text.format.schema.minimum"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "metadata": '
     '{"a": "b"}, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": -Infinity}}}]}',
     "tools.0.function.parameters.default"),
    ("/v1/messages", '{"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
     "temperature"),
    ("/api/chat", '{"stream": false, "messages": [{"role": "user", "content": "hi"}], "format": {"maximum": 2e308}}',
     "format.maximum"),
]


@pytest.mark.parametrize(("path", "text", "where"), NOT_FINITE, ids=[w for _, _, w in NOT_FINITE])
def test_nan_infinity_and_a_number_past_a_doubles_range_are_a_400_naming_where(child: Server, path: str, text: str,
                                                                                where: str) -> None:
    """Python's json reads NaN, Infinity and 1e999 (as an infinity): in a Responses request's tool schema the whole
    answer was generated, then a 500 "internal error" (the answer, echoing the tools, could not be written as
    JSON); streamed, its events carried a bare Infinity; stored, every GET of it was a 500."""
    body = text.replace("{", '{"model": "' + MODEL + '", ', 1)
    before = child.health()["failed_jobs"]
    r = httpx.post(f"{child.url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=120)
    assert r.status_code == 400, r.text
    assert "not a finite number" in r.text and where in r.text, r.text
    if path.startswith("/v1/") and path != "/v1/messages":
        assert r.json()["error"]["param"] == where, r.text
    elif path == "/v1/messages":
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
    else:
        assert isinstance(r.json()["error"], str), r.text
    assert child.health()["failed_jobs"] == before
    _still_answers(child.url)


def test_a_number_near_a_doubles_range_is_answered_stored_and_read_back(child: Server) -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "number", "maximum": 1.7e308, "minimum": -5e-324}}}}]
    r = httpx.post(f"{child.url}/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2,
                                                      "tools": tools}, timeout=120)
    assert r.status_code == 200, r.text
    got = httpx.get(f"{child.url}/v1/responses/{r.json()['id']}", timeout=30)
    assert got.status_code == 200 and got.json()["tools"][0]["parameters"] == tools[0]["parameters"], got.text


# ---- an Upgrade this server does not take -----------------------------------------------------------

@pytest.mark.parametrize("upgrade", [
    b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n",
    b"Upgrade: websocket\r\nConnection: upgrade\r\n",  # no key: any client may send it
    b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
], ids=["websocket", "websocket-no-key", "h2c"])
def test_an_upgrade_is_answered_as_http_1_1_with_no_warning(child: Server, upgrade: bytes) -> None:
    """RFC 9110 §7.8: a server may ignore Upgrade. Each such request made uvicorn log two warnings (the second
    telling the operator to `pip install 'uvicorn[standard]'` or websockets, which localgen has no use for); it is
    answered as the route answers it, and the log says nothing of it."""
    ident = f"up-{len(upgrade)}".encode()
    before = len(child.log())
    with socket.create_connection(("127.0.0.1", child.port), timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: " + ident + b"\r\n" + upgrade +
                  b"\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), got[:300]
    assert json.loads(body)["data"][0]["id"] == MODEL
    assert child.access(ident.decode()).startswith("GET /v1/models 200 "), child.log()[before:]
    said = child.log()[before:]
    assert "WARNING" not in said and "upgrade" not in said.lower() and "pip install" not in said, said


@pytest.mark.parametrize("upgrade", [
    b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
    b"Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"], ids=["h2c", "websocket"])
def test_an_upgrade_with_a_body_is_a_400_and_its_connection_closed(child: Server, upgrade: bytes) -> None:
    """The HTTP parser takes what follows an upgrading request's head for the new protocol's bytes: the route read
    an empty body (a completion's 400 said `prompt` was missing), and a body that came in a later packet was read
    as requests of its own (here a /health, answered). It is a 400 that says why, and the connection is closed."""
    smuggled = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Request-Id: smuggled\r\n\r\n"
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "x": "y" * 10}).encode()
    before = len(child.log())
    with socket.create_connection(("127.0.0.1", child.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n" % (len(body) + len(smuggled)) + upgrade + b"\r\n" + body)
        time.sleep(0.5)  # the rest of the body in a packet of its own
        with contextlib.suppress(OSError):
            s.sendall(smuggled)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head.lower(), got[:400]
    err = json.loads(rest)["error"]
    assert err["message"].startswith("a request that asks to Upgrade (to another protocol: websocket, h2c) cannot "
                                     "have a body here"), err
    assert b"HTTP/1.1" not in rest and child.access("smuggled", timeout=1) == "", got
    assert "WARNING" not in child.log()[before:], child.log()[before:]
    _still_answers(child.url)
