"""What a red team found in `run`/`chat`/`bench --endpoint` (docs/remote.md), against raw-socket fakes that
misbehave as real servers can: a key an error repeats, an endpoint that refuses every line in a fan-out, a
silent one holding answers back at Ctrl-C, a line or a model list past its bound, an HTML page sent as a
stream, a bench where every request failed, and what the log keeps of a remote exchange."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI
from tests.fake_openai import FakeServer

KEY = "sk-verysecret123"
OK_SSE = (b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": null}]}\n\n'
          b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')


def _head(status: str, kind: str, length: int | None = None) -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n{size}Connection: close\r\n\r\n".encode()


class Raw:
    """A loopback server that answers each request with `answer(path, authorization, socket)`; counts them."""

    def __init__(self, answer: Callable[[str, str, socket.socket], None]) -> None:
        self.answer = answer
        self.seen = 0  # counted under `lock`: each connection has its thread
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.host = self.url.removeprefix("http://")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            auth = next((x.split(":", 1)[1].strip() for x in lines if x.lower().startswith("authorization:")), "")
            with self.lock:
                self.seen += 1
            with contextlib.suppress(OSError):
                self.answer(lines[0].split()[1], auth, conn)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[[Callable[[str, str, socket.socket], None]], Raw]]:
    made: list[Raw] = []

    def make(answer: Callable[[str, str, socket.socket], None]) -> Raw:
        made.append(Raw(answer))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _json(conn: socket.socket, status: str, doc: object) -> None:
    body = json.dumps(doc).encode()
    conn.sendall(_head(status, "application/json", len(body)) + body)


def _models(path: str, conn: socket.socket) -> bool:
    if path.endswith("/models"):
        _json(conn, "200 OK", {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        return True
    return False


def echo401(path: str, auth: str, conn: socket.socket) -> None:
    """A 401 whose message repeats the Authorization header, and the key's first 8 characters apart."""
    key = auth.split()[-1] if auth else "none"
    _json(conn, "401 Unauthorized", {"error": {"message": f"invalid key: Authorization: {auth}; prefix {key[:8]}"}})


def echo_stream(path: str, auth: str, conn: socket.socket) -> None:
    """A stream that sends "x", then an error event repeating the key."""
    if _models(path, conn):
        return
    key = auth.split()[-1] if auth else "none"
    conn.sendall(_head("200 OK", "text/event-stream")
                 + b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}\n\n'
                 + b'data: {"error": {"message": "upstream died; key was ' + key.encode() + b'"}}\n\n')


def ok(path: str, auth: str, conn: socket.socket) -> None:
    if not _models(path, conn):
        conn.sendall(_head("200 OK", "text/event-stream") + OK_SSE)


def _keyed(cli: CLI, home: Path) -> CLI:
    return CLI({**cli.env, "SECRETK": KEY, "LOCALGEN_HOME": str(home)})


def test_a_key_the_server_repeats_is_nowhere_in_what_localgen_says_or_keeps(cli: CLI, raw: Callable[..., Raw],
                                                                          tmp_path: Path) -> None:
    """docs/remote.md, Keys: the key (or its first 8 characters) an upstream's text repeats is `***` on stderr, in
    --json, in run --file's output and in the bench history; a refused key is said to be refused."""
    keyed = _keyed(cli, tmp_path / "home")
    refuses, breaks = raw(echo401), raw(echo_stream)
    r = keyed("run", "--endpoint", refuses.url, "--api-key-env", "SECRETK", "-m", "fake", "-p", "hi", "-n", "4")
    assert r.returncode == 1 and "refused the request (401)" in r.stderr, r.stderr
    assert KEY[:8] not in r.stderr and "Bearer ***" in r.stderr and "prefix ***" in r.stderr, r.stderr
    assert "refused the key in SECRETK" in r.stderr and "name the variable" not in r.stderr, r.stderr
    r = keyed("run", "--endpoint", breaks.url, "--api-key-env", "SECRETK", "-m", "fake", "-p", "hi", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["partial"] is True, r.stdout
    assert "key was ***" in r.stdout and KEY[:8] not in r.stdout + r.stderr, (r.stdout, r.stderr)
    lines = tmp_path / "in.txt"
    lines.write_text("a\n")
    r = keyed("run", "--file", str(lines), "--json", "--endpoint", breaks.url, "--api-key-env", "SECRETK", "-m", "fake")
    assert r.returncode == 1 and "key was ***" in r.stdout and KEY[:8] not in r.stdout + r.stderr, r.stdout
    r = keyed("bench", "--endpoint", breaks.url, "--api-key-env", "SECRETK", "-m", "fake", "-npl", "1", "-p", "8",
              "-n", "4", "--num-prompts", "1", timeout=120)
    assert r.returncode == 1 and "every request failed" in r.stderr and KEY[:8] not in r.stderr + r.stdout, r.stderr
    for db in (tmp_path / "home").rglob("*.sqlite"):
        assert KEY[:8].encode() not in db.read_bytes(), db


def test_a_url_with_a_key_in_its_query_is_refused_without_showing_it(cli: CLI) -> None:
    r = cli("run", "--endpoint", "http://127.0.0.1:9/v1?api_key=SECRETQ", "-m", "x", "-p", "hi")
    assert r.returncode == 2 and "?query" in r.stderr and "SECRETQ" not in r.stderr, r.stderr
    r = CLI({**cli.env, "LOCALGEN_ENDPOINT": "http://bob:hunter2@127.0.0.1:9"})("run", "-p", "hi")
    assert r.returncode == 2 and "LOCALGEN_ENDPOINT URLs may not carry credentials" in r.stderr, r.stderr
    assert "hunter2" not in r.stderr


@pytest.mark.parametrize("bad", ["401", "html", "404", "405", "501"])
def test_a_fan_out_drops_an_endpoint_that_refuses_and_the_healthy_one_answers_every_line(
        cli: CLI, raw: Callable[..., Raw], tmp_path: Path, bad: str) -> None:
    """docs/remote.md, Fan-out: an endpoint that fails for good (401/403, not an OpenAI stream, a 404, 405 or 501:
    a web server that is not the API, as `python -m http.server` answers a POST) is dropped like a dead one; its
    lines go to the others, so no line fails while one endpoint answers."""
    def refuse(path: str, auth: str, conn: socket.socket) -> None:
        if bad == "html":
            body = b"<html>Welcome to nginx</html>"
            conn.sendall(_head("200 OK", "text/html", len(body)) + body)
        elif bad in ("405", "501"):
            body = b"<!DOCTYPE HTML><html><body>Unsupported method ('POST')</body></html>"
            conn.sendall(_head(f"{bad} {'Method Not Allowed' if bad == '405' else 'Unsupported method'}",
                               "text/html", len(body)) + body)
        else:
            _json(conn, "401 Unauthorized" if bad == "401" else "404 Not Found", {"error": {"message": "no"}})

    def slow_ok(path: str, auth: str, conn: socket.socket) -> None:
        time.sleep(0.2)  # the refusing endpoint would take every line if it were kept
        ok(path, auth, conn)

    refusing, good = raw(refuse), raw(slow_ok)
    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"q{i}\n" for i in range(12)))
    r = cli("run", "--file", str(lines), "--json", "--stats", "-m", "fake", "-np", "2",
            "--endpoint", refusing.url, "--endpoint", good.url, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == list(range(1, 13)) and all(d["text"] == "ok" for d in docs), r.stdout
    assert " failed" not in r.stderr.replace("a failed one", "") and "moved off a failed one" in r.stderr, r.stderr
    assert refusing.seen <= 2, "dropped at its first refusal (one per line in flight)"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_writes_the_answers_held_behind_a_silent_line_and_resume_skips_them(
        cli: CLI, raw: Callable[..., Raw], tmp_path: Path, sig: int) -> None:
    """docs/remote.md, Resuming: with --json, a stop (Ctrl-C, or a SIGTERM: a scheduler's time limit, which then
    ends the process by it; it wrote none of them) writes the answers held behind an unanswered line (out of
    order, each with its line number), and --resume-from then runs only the rest."""
    def hang(path: str, auth: str, conn: socket.socket) -> None:
        time.sleep(60)

    def ok_but_the_tenth(path: str, auth: str, conn: socket.socket) -> None:
        # with -np 1 its 10th request (line 11) is sent only once the answer before it was handed on: when it
        # comes, the 9 answers (lines 2 to 10) are certain to be held; it goes unanswered too
        if good.seen == 10:
            hang(path, auth, conn)
        else:
            ok(path, auth, conn)

    silent, good = raw(hang), raw(ok_but_the_tenth)
    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"q{i}\n" for i in range(11)))
    out = tmp_path / "out.jsonl"
    with open(out, "w") as sink:
        p = cli.popen("run", "--file", str(lines), "--json", "-m", "fake", "-np", "1", "--endpoint", silent.url,
                      "--endpoint", good.url, stdout=sink, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60  # a safety net for busy cores, not a timing
        while good.seen < 10:
            assert time.monotonic() < deadline, f"the good endpoint had {good.seen} of 10 requests in 60 s"
            time.sleep(0.05)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    assert p.returncode == (130 if sig == signal.SIGINT else -sig), err
    assert good.seen == 10 and out.read_text(), (good.seen, err)
    held = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(d["line"] for d in held) == list(range(2, 11)) and all(d["text"] == "ok" for d in held), held
    before = good.seen
    with open(out, "a") as sink:
        p = cli.popen("run", "--file", str(lines), "--json", "-m", "fake", "--endpoint", good.url,
                      "--resume-from", str(out), stdout=sink, stderr=subprocess.PIPE, text=True)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and good.seen == before + 2, (err, good.seen)
    assert sorted(json.loads(x)["line"] for x in out.read_text().splitlines()) == list(range(1, 12))


def test_a_stream_line_past_16_mib_is_an_error_naming_the_endpoint(cli: CLI, raw: Callable[..., Raw]) -> None:
    def endless(path: str, auth: str, conn: socket.socket) -> None:
        if _models(path, conn):
            return
        conn.sendall(_head("200 OK", "text/event-stream"))
        for _ in range(40):  # 40 MiB with no line end
            conn.sendall(b"a" * 2**20)

    def whole(path: str, auth: str, conn: socket.socket) -> None:
        conn.sendall(_head("200 OK", "application/json", 20 * 2**20) + b"{" + b" " * (20 * 2**20 - 1))

    big, json_big = raw(endless), raw(whole)
    r = cli("run", "--endpoint", big.url, "-m", "fake", "-p", "hi", timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"{big.host} sent a stream line over 16 MiB" in r.stderr, r.stderr
    r = cli("run", "--endpoint", json_big.url, "-m", "fake", "-p", "hi", timeout=120)
    assert r.returncode == 1 and f"the answer from {json_big.host} is over 16 MiB" in r.stderr, r.stderr


def test_a_model_list_past_16_mib_is_an_error_naming_the_endpoint(cli: CLI, raw: Callable[..., Raw]) -> None:
    def many(path: str, auth: str, conn: socket.socket) -> None:
        conn.sendall(_head("200 OK", "application/json", 40 * 2**20) + b'{"data": [' + b" " * (40 * 2**20 - 10))

    big = raw(many)
    r = cli("run", "--endpoint", big.url, "-p", "hi", timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"{big.host}'s answer to GET /models is over 16 MiB" in r.stderr, r.stderr


def test_an_endpoints_file_past_1_mib_is_one_line_and_an_unknown_key_warns(cli: CLI, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    path = home / "config" / "endpoints.toml"
    path.write_text('[box]\nurl = "http://127.0.0.1:9/v1"\n' + "# pad\n" * 200_000)
    r = CLI({**cli.env, "LOCALGEN_HOME": str(home)})("run", "-m", "box", "-p", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"{path} is over 1 MiB" in r.stderr, r.stderr
    path.write_text('[box]\nurl = "http://127.0.0.1:9/v1"\nurll = "x"\n')
    r = CLI({**cli.env, "LOCALGEN_HOME": str(home)})("run", "-m", "box", "-p", "hi")
    assert "[box] has an unknown key 'urll', which is ignored (did you mean url?)" in r.stderr, r.stderr


def test_html_sent_as_a_stream_and_a_reset_are_said_in_words(cli: CLI, raw: Callable[..., Raw]) -> None:
    def html(path: str, auth: str, conn: socket.socket) -> None:
        body = b"<html><body>Welcome</body></html>"
        conn.sendall(_head("200 OK", "text/event-stream", len(body)) + body)

    def reset(path: str, auth: str, conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    page, cut = raw(html), raw(reset)
    r = cli("run", "--endpoint", page.url, "-m", "fake", "-p", "hi")
    assert r.returncode == 1 and "text/event-stream that is not an OpenAI stream: '<html>" in r.stderr, r.stderr
    r = cli("run", "--endpoint", cut.url, "-m", "fake", "-p", "hi")
    assert r.returncode == 1 and f"{cut.host} closed the connection without answering" in r.stderr, r.stderr
    assert "Error" not in r.stderr and "Exception" not in r.stderr, r.stderr


def test_a_bench_where_every_request_failed_saves_nothing_and_uncounted_tokens_show_a_dash(
        cli: CLI, raw: Callable[..., Raw], tmp_path: Path) -> None:
    """docs/bench.md: a sweep point with no request answered is no result (nothing enters the history); where the
    server sends no usage, the prompt and gen columns show `-`."""
    home = tmp_path / "home"
    local = CLI({**cli.env, "LOCALGEN_HOME": str(home)})
    broken = raw(echo_stream)
    r = local("bench", "--endpoint", broken.url, "-m", "fake", "-npl", "1", "-p", "8", "-n", "4",
              "--num-prompts", "2", timeout=120)
    assert r.returncode == 1 and "every request failed" in r.stderr and "saved as run" not in r.stderr, r.stderr
    db = home / "data" / "bench.sqlite"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM results").fetchone() == (0,)
    good = raw(ok)
    r = local("bench", "--endpoint", good.url, "-m", "fake", "-npl", "1", "-p", "8", "-n", "4", "--num-prompts", "2",
              timeout=120)
    assert r.returncode == 0 and "saved as run 1" in r.stderr, r.stderr
    row = next(x for x in r.stdout.splitlines() if good.url.removeprefix("http://") in x)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:7] == ["2", "-", "-"], cells
    r = local("bench", "--endpoint", f"{good.url},{broken.url}", "-m", "fake")
    assert r.returncode == 2 and "bench --endpoint measures one server, not 2" in r.stderr, r.stderr


def test_the_log_keeps_what_was_sent_and_a_cut_off_answer(cli: CLI, raw: Callable[..., Raw],
                                                           tmp_path: Path) -> None:
    """docs/logs.md: a remote exchange's settings are those sent (as run --json's `sampling`); an answer a broken
    stream cut off is logged as far as it came, with finish reason `error` (run's and chat's alike)."""
    local = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path / "home")})
    good, broken = raw(ok), raw(echo_stream)
    r = local("run", "--endpoint", good.url, "-m", "fake", "-p", "hello", "--json", "--top-k", "5")
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)["sampling"]
    logged = json.loads(local("logs", "-n", "1", "--json").stdout)[0]
    assert logged["settings"] == sent == {"seed": sent["seed"], "top_k": 5}, logged["settings"]
    r = local("run", "--endpoint", broken.url, "-m", "fake", "-p", "hello")
    assert r.returncode == 1, r.stderr
    logged = json.loads(local("logs", "-n", "1", "--json").stdout)[0]
    assert (logged["response"], logged["finish_reason"]) == ("x", "error"), logged
    listed = local("logs", "-n", "1").stdout  # and the listing says so (it looked finished)
    assert "\n## Response (broken off by an error)\n\nx\n" in listed, listed
    r = local("chat", "--endpoint", broken.url, "-m", "fake", input="hello\n", timeout=60)
    logged = json.loads(local("logs", "-n", "1", "--json").stdout)[0]
    assert (logged["response"], logged["finish_reason"]) == ("x", "error"), logged


@pytest.mark.parametrize("mode", ["drip", "huge"])
def test_a_model_list_that_drips_or_is_huge_ends_run_bench_and_serves_start(
        cli_in_process: InProcessCLI, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """A /models that drips a space every 50 ms has one deadline for the whole list (here 1 s, 10 s by default),
    not one per read; one past 16 MiB is refused by serve --endpoint as by run, read no further."""
    from localgen.remote import client
    from localgen.serve import remotes

    monkeypatch.setattr(client, "GET_S", 1.0)
    monkeypatch.setattr(remotes, "LIST_S", 1.0)
    server = FakeServer()
    server.models_mode = mode
    said = "did not arrive within 1 s" if mode == "drip" else "is over 16 MiB"
    try:
        for args in (("run", "-p", "hi", "-n", "4"), ("bench", "-n", "4", "-p", "8"), ("serve", "--port", "18806")):
            r = cli_in_process(*args, "--endpoint", server.url)
            assert r.returncode == 1 and r.stderr.startswith("localgen: error: ") and said in r.stderr, (args, r.stderr)
            assert "GET /models" in r.stderr and r.stdout == "", r.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(("mode", "said"), [
    ("404", "answered 404 to GET {url}/nowhere/models: Not Found (check the URL: it should be the API base"),
    ("html", "answered GET {url}/v1/models with text/html that is not JSON (check the URL: it should be"),
    ("redirect", "redirects to {url}/elsewhere; localgen does not follow redirects"),
])
def test_a_model_list_that_is_not_one_is_said_as_what_came(cli_in_process: InProcessCLI, mode: str,
                                                           said: str) -> None:
    """Without -m the endpoint's /models is read: a 404 (an --endpoint with the wrong path: /api, /v1/v1), a web
    page or a redirect was "did not list its models (name the model with -m)", which sent the user to -m when
    the URL was wrong (remote.md: a redirect is an error naming where it pointed)."""
    server = FakeServer()
    server.models_mode = mode
    url = server.url + "/nowhere" if mode == "404" else server.url
    try:
        r = cli_in_process("run", "-p", "hi", "-n", "4", "--endpoint", url)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert said.format(url=server.url) in r.stderr, r.stderr
    finally:
        server.stop()


def test_without_m_an_endpoint_that_cannot_be_reached_is_passed_over(cli_in_process: InProcessCLI,
                                                                       tmp_path: Path) -> None:
    """remote.md: while one endpoint answers, no line fails for another's fault. Without -m the model was asked of
    the first endpoint only: one that was down ended the run before any line went to the one up."""
    server = FakeServer()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "hi"}\n')
    try:
        r = cli_in_process("run", "--file", str(prompts), "--endpoint", dead, "--endpoint", server.url)
        assert r.returncode == 0 and r.stdout == "Hello world\n" * 2, r.stderr
        assert [q["body"]["model"] for q in server.requests[-2:]] == ["plain", "plain"]
        r = cli_in_process("run", "--file", str(prompts), "--endpoint", dead, "--endpoint", dead.replace("127.0.0.1",
                                                                                                        "localhost"))
        assert r.returncode == 1 and "no endpoint could be asked for its models: cannot reach" in r.stderr, r.stderr
        assert "(and 1 more)" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    finally:
        server.stop()
