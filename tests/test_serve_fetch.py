"""Image URLs that `serve --allow-image-urls` fetches, against a loopback HTTP server of pictures, redirects,
errors and slow bodies: private addresses refused (directly, after a redirect, through DNS), the deadline,
the bounded pool (a plain request still answers, SIGTERM still stops the server), a fetch that stops when its
client leaves, `run -a URL`, and the access line each request leaves on stderr."""

from __future__ import annotations

import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT
from tests.test_serve import Server

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, write_mmproj

FETCH_TIMEOUT = 6  # the servers' --fetch-timeout: a slow body ends at it


class Pictures:
    """A threading HTTP server on 127.0.0.1: /cat.png, /to-cat (302 to it by 127.0.0.1), /loop (a redirect
    to itself), /404 (with a body no client may see), /slow.png (a byte every 0.3 s for a minute); it notes
    when a slow body's reader hangs up."""

    SECRET = b"internal admin console: do not show"

    def __init__(self) -> None:
        self.picture = png(32, 32)
        self.hung_up: list[float] = []  # when each slow body's reader went away (monotonic)
        self.slow_started = 0  # slow bodies begun (counted under `lock`: each handler has its thread)
        self.lock = threading.Lock()
        self.cut = threading.Event()  # set: slow bodies end now, cut short (their fetch fails)
        pictures = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/cat.png":
                    self._send(200, pictures.picture, "image/png")
                elif self.path == "/to-cat":
                    self._redirect(f"http://127.0.0.1:{pictures.port}/cat.png")
                elif self.path == "/loop":
                    self._redirect("/loop")
                elif self.path.startswith("/slow"):
                    self._slow()
                else:
                    self._send(404, pictures.SECRET, "text/plain")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, where: str) -> None:
                self.send_response(302)
                self.send_header("Location", where)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _slow(self) -> None:
                with pictures.lock:
                    pictures.slow_started += 1
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(pictures.picture)))
                self.end_headers()
                try:
                    for b in pictures.picture[:200]:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        if pictures.cut.wait(0.3):
                            self.close_connection = True
                            return
                except OSError:
                    pictures.hung_up.append(time.monotonic())

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def pictures() -> Iterator[Pictures]:
    p = Pictures()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def proj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_mmproj(tmp_path_factory.mktemp("fetch") / "proj.gguf"))


@pytest.fixture(scope="module")
def lan(cli_env: dict[str, str], proj: Path) -> Iterator[Server]:
    """A server that may fetch from private addresses (its LAN's image server: here, loopback)."""
    s = Server(cli_env, "--mmproj", str(proj), "-np", "2", "--ctx", "1024", "--allow-image-urls",
               "--allow-private-urls", "--fetch-timeout", str(FETCH_TIMEOUT))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def guarded(cli_env: dict[str, str], proj: Path) -> Iterator[Server]:
    """A server with --allow-image-urls alone: nothing inside is fetched. --quiet: no access lines."""
    s = Server(cli_env, "--mmproj", str(proj), "-np", "1", "--ctx", "512", "--allow-image-urls", "--quiet")
    yield s
    s.stop()


def _ask(server: Server, url: str, timeout: float = 60, **extra: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=timeout, json={
        "model": "smollm2:135m", "max_tokens": 2, "temperature": 0, **extra,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": "What is it?"}]}]})


# ---- the address checker, in process


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "a loopback address"), ("127.3.2.1", "a loopback address"), ("::1", "a loopback address"),
    ("10.0.0.7", "a private address"), ("172.16.3.4", "a private address"), ("192.168.1.1", "a private address"),
    ("100.64.0.1", "a private address"), ("fd12:3456::1", "a private address"),
    ("169.254.1.1", "a link-local address"), ("fe80::1", "a link-local address"),
    ("fe80::1%lo", "a link-local address"),
    ("169.254.169.254", "a cloud metadata address"), ("fd00:ec2::254", "a cloud metadata address"),
    ("100.100.100.200", "a cloud metadata address"),
    ("224.0.0.251", "a multicast address"), ("ff02::1", "a multicast address"),
    ("0.0.0.0", "a reserved address"), ("240.0.0.1", "a reserved address"), ("::", "a reserved address"),
    ("::ffff:127.0.0.1", "a loopback address"), ("::ffff:169.254.169.254", "a cloud metadata address"),
    ("2002:7f00:1::", "a loopback address"), ("64:ff9b::a00:1", "a private address"),
    ("8.8.8.8", None), ("2606:4700:4700::1111", None), ("::ffff:8.8.8.8", None),
])
def test_which_addresses_a_server_refuses(address: str, why: str | None) -> None:
    from localgen import fetch

    assert fetch.refusal(address) == why


@pytest.mark.parametrize("host", ["2130706433", "0177.0.0.1", "0x7f.1", "127.1", "localhost", "[::1]",
                                  "[::ffff:7f00:1]"])
def test_every_spelling_of_loopback_is_refused(host: str) -> None:
    """Decimal, octal, hex and short IPv4 forms, names and IPv6 literals are judged by what they resolve to
    (httpx itself refuses some, such as 0177.0.0.1, as URLs)."""
    from localgen import fetch

    with pytest.raises(fetch.FetchError, match=r"^(refused: a loopback address|not a valid URL)$"):
        fetch.Fetcher().get(f"http://{host}:9/cat.png")


def test_a_redirect_inside_is_refused_at_its_hop(pictures: Pictures, monkeypatch: pytest.MonkeyPatch) -> None:
    from localgen import fetch

    real = fetch.addresses

    def addresses(host: str, port: int, private: bool) -> list[str]:
        # public.example stands for a public server that redirects: here it is the loopback one
        return [str(pictures.http.server_address[0])] if host == "public.example" else real(host, port, private)

    monkeypatch.setattr(fetch, "addresses", addresses)
    public = f"http://public.example:{pictures.port}"
    assert fetch.Fetcher().get(f"{public}/cat.png") == pictures.picture, "the first hop itself is fetched"
    with pytest.raises(fetch.FetchError, match="refused: a loopback address"):
        fetch.Fetcher().get(f"{public}/to-cat")
    with pytest.raises(fetch.FetchError, match="more than 5 redirects"):
        fetch.Fetcher().get(f"{public}/loop")
    assert fetch.Fetcher(private=True).get(f"{pictures.url}/to-cat") == pictures.picture


def test_a_dns_answer_that_changes_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name is resolved once: the addresses checked are the ones connected to, so a resolver that answers
    a public address and then loopback (DNS rebinding) is never asked the second time."""
    from localgen import fetch

    answers = [["93.184.216.34"], ["127.0.0.1"]]
    asked: list[str] = []
    connected: list[Any] = []

    def getaddrinfo(host: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        if host != "rebind.example":
            return real_getaddrinfo(host, port, *args, **kw)
        asked.append(host)
        ips = answers.pop(0) if answers else ["127.0.0.1"]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ips]

    def create_connection(address: Any, *args: Any, **kw: Any) -> socket.socket:
        connected.append(address[0])
        raise OSError("no route (the test has no network)")

    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    with pytest.raises(fetch.FetchError, match="could not connect"):
        fetch.Fetcher().get("http://rebind.example/cat.png")
    assert asked == ["rebind.example"] and connected == ["93.184.216.34"]
    answers[:] = [["93.184.216.34", "10.0.0.1"]]  # one private address among public ones
    with pytest.raises(fetch.FetchError, match="refused: a private address"):
        fetch.Fetcher().get("http://rebind.example/cat.png")
    assert connected == ["93.184.216.34"], "nothing was connected to"


def test_the_pool_bounds_the_wait_the_deadline_and_shutdown() -> None:
    """A fetch that finds every thread busy gets FetchBusy after the pool's wait; its caller never waits
    past the deadline, even for a thread that cannot be interrupted (a slow name lookup); close() stops
    the fetches in flight."""
    import asyncio

    from localgen import fetch

    release = threading.Event()

    def stuck(cancel: threading.Event) -> str:
        release.wait(10)
        return "late"

    def polite(cancel: threading.Event) -> str:
        cancel.wait(10)
        raise fetch.FetchError("cancelled")

    async def main() -> None:
        pool = fetch.FetchPool(fetch.Fetcher(timeout=0.5), size=1, wait=0.3)
        first = asyncio.ensure_future(pool.run(stuck))
        await asyncio.sleep(0.05)
        with pytest.raises(fetch.FetchBusy, match="1 URL fetches are in flight"):
            await pool.run(lambda cancel: "never run")
        with pytest.raises(fetch.FetchError, match=r"timed out after 0\.5 s"):
            await first
        closing = fetch.FetchPool(size=1)
        running = asyncio.ensure_future(closing.run(polite))
        await asyncio.sleep(0.05)
        closing.close()
        with pytest.raises(fetch.FetchBusy, match="shutting down"):
            await running

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_fetch_errors_say_why_in_general_terms(pictures: Pictures) -> None:
    from localgen import fetch

    lan = fetch.Fetcher(private=True)
    for url, why in ((f"https://localhost:{pictures.port}/cat.png", "the connection failed"),  # not TLS
                     ("http://no-such-host.invalid/x", "the host name does not resolve"),
                     ("http://127.0.0.1:1/x", "could not connect"),
                     ("ftp://127.0.0.1/x", "only http and https URLs are fetched"),
                     (f"{pictures.url}/404", "HTTP 404")):
        with pytest.raises(fetch.FetchError) as e:
            lan.get(url)
        assert e.value.message == why, url
    with pytest.raises(fetch.FetchError, match="larger than 0 MiB"):
        fetch.Fetcher(private=True, max_bytes=100).get(f"{pictures.url}/cat.png")


# ---- through serve


def test_a_server_refuses_private_addresses_and_says_only_that(guarded: Server, pictures: Pictures) -> None:
    for url in (f"{pictures.url}/cat.png", f"http://localhost:{pictures.port}/cat.png",
                f"http://2130706433:{pictures.port}/cat.png", f"http://[::ffff:127.0.0.1]:{pictures.port}/404",
                "http://169.254.169.254/latest/meta-data/"):
        r = _ask(guarded, url)
        assert r.status_code == 400, (url, r.text)
        message = r.json()["error"]["message"]
        assert message.startswith(f"cannot fetch {url}: refused: a ") and "address" in message, message
    ollama = httpx.post(f"{guarded.url}/api/chat", timeout=60, json={
        "model": "smollm2:135m", "stream": False,
        "messages": [{"role": "user", "content": "What is it?", "images": [f"{pictures.url}/cat.png"]}]})
    assert ollama.status_code == 400 and "refused: a loopback address" in ollama.json()["error"]


def test_allow_private_urls_fetches_from_the_lan(lan: Server, pictures: Pictures) -> None:
    for path in ("/cat.png", "/to-cat"):
        r = _ask(lan, pictures.url + path)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 16, "the picture's tokens are in the prompt"
    r = _ask(lan, f"{pictures.url}/404")
    assert r.status_code == 400 and r.json()["error"]["message"] == f"cannot fetch {pictures.url}/404: HTTP 404"
    assert Pictures.SECRET.decode() not in r.text, "what answered stays on the server"


def test_a_slow_body_ends_at_the_deadline(lan: Server, pictures: Pictures) -> None:
    r = _ask(lan, f"{pictures.url}/slow.png?deadline")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].endswith(f": timed out after {FETCH_TIMEOUT} s")


def test_a_fetch_stops_when_its_client_leaves(lan: Server, pictures: Pictures) -> None:
    before = len(pictures.hung_up)
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _ask(lan, f"{pictures.url}/slow.png?leaving", timeout=1)
    while len(pictures.hung_up) == before and time.monotonic() - start < 30:
        time.sleep(0.05)
    assert len(pictures.hung_up) > before
    assert pictures.hung_up[-1] - start < FETCH_TIMEOUT, "the fetch stopped when its client left, not at the deadline"


def test_slow_urls_fill_only_their_own_pool(cli_env: dict[str, str], proj: Path, pictures: Pictures) -> None:
    """A dozen slow URLs take every fetch thread (and wait for one, then 503): a request with a JSON schema
    (whose grammar is built on the loop's default pool) still answers while they are in flight. Their bodies
    last until the test cuts them (a deadline far off), so a busy machine cannot end them first."""
    s = Server(cli_env, "--mmproj", str(proj), "-np", "2", "--ctx", "1024", "--allow-image-urls",
               "--allow-private-urls", "--fetch-timeout", "600")
    got: list[httpx.Response] = []
    slow = [threading.Thread(target=lambda i=i: got.append(_ask(s, f"{pictures.url}/slow.png?{i}", timeout=600)))
            for i in range(12)]
    before = pictures.slow_started
    try:
        for t in slow:
            t.start()
        give_up = time.monotonic() + 300  # a guard against a hang, not a timing
        while (pictures.slow_started - before < 8 or len(got) < 4) and time.monotonic() < give_up:
            time.sleep(0.05)  # until 8 fetches are under way and 4 were turned away
        assert len(got) == 4 and pictures.slow_started - before == 8, [r.text for r in got]
        plain = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
            "model": "smollm2:135m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Give me a name as JSON."}],
            "response_format": {"type": "json_object"}})
        assert plain.status_code == 200, plain.text
        assert len(got) == 4, "the plain request answered while the 8 slow fetches were still in flight"
    finally:
        pictures.cut.set()
        for t in slow:
            t.join(120)
        pictures.cut.clear()
        s.stop()
    busy = [r for r in got if r.status_code == 503]
    assert len(busy) == 4 and all("8 URL fetches are in flight" in r.json()["error"]["message"] for r in busy)
    assert sorted(r.status_code for r in got) == [400] * 8 + [503] * 4, [r.text for r in got]


def test_the_access_log_is_one_line_per_request(lan: Server, guarded: Server) -> None:
    """Method, path, status, tokens, milliseconds and the request's id (its X-Request-Id: the client's or a
    fresh one), so a failed request a user reports by its id is found in the log (docs/serve.md, Request ids)."""
    health = httpx.get(f"{lan.url}/health", timeout=5)
    r = httpx.post(f"{lan.url}/v1/chat/completions", timeout=60, json={
        "model": "smollm2:135m", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
    usage = r.json()["usage"]
    bad = httpx.post(f"{lan.url}/v1/chat/completions", headers={"X-Request-Id": "ticket-7"}, timeout=60,
                     json={"model": "smollm2:135m", "messages": []})
    assert bad.status_code == 400 and bad.json()["request_id"] == "ticket-7", bad.text
    assert lan.access("ticket-7") and lan.access(r.headers["x-request-id"])  # each written after its answer
    lines = lan.log().splitlines()
    want = f"POST /v1/chat/completions 200 {usage['prompt_tokens']}+{usage['completion_tokens']} tokens "
    assert any(re.fullmatch(re.escape(want) + rf"\d+ ms id={r.headers['x-request-id']}", line)
               for line in lines), lines[-5:]
    assert r.headers["x-request-id"].startswith("req_")
    assert any(re.fullmatch(rf"GET /health 200 \d+ ms id={health.headers['x-request-id']}", line) for line in lines)
    assert any(re.fullmatch(r"POST /v1/chat/completions 400 \d+ ms id=ticket-7", line) for line in lines), lines[-5:]
    assert not any("HTTP/1.1" in line for line in lines), "uvicorn's own access log is off"
    assert guarded.proc.stderr is not None
    assert not any(" ms" in line for line in guarded.proc.stderr.read().decode().splitlines()), "--quiet"


def test_sigterm_stops_the_server_while_slow_fetches_are_in_flight(lan: Server, pictures: Pictures) -> None:
    got: list[Any] = []

    def ask(i: int) -> None:
        try:
            got.append(_ask(lan, f"{pictures.url}/slow.png?term{i}").status_code)
        except httpx.HTTPError as e:
            got.append(type(e).__name__)

    slow = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    before = pictures.slow_started
    for t in slow:
        t.start()
    deadline = time.monotonic() + 60  # a safety net for busy cores, not a timing
    while pictures.slow_started - before < 6:  # the signal comes once every fetch is under way
        assert time.monotonic() < deadline, f"{pictures.slow_started - before} of 6 slow fetches began in 60 s"
        time.sleep(0.02)
    lan.proc.send_signal(signal.SIGTERM)
    assert lan.proc.wait(timeout=60) == 0
    for t in slow:
        t.join(10)
    assert got == [503] * 6, "each fetch was stopped by the signal, before its deadline (a 400 'timed out')"


# ---- the CLI


def test_run_attach_url_goes_through_the_same_fetcher(cli: CLI, proj: Path, pictures: Pictures) -> None:
    """`run -a URL` (--image takes files) may fetch from private addresses (a user's own LAN); its errors are
    one line."""
    ok = cli("run", "--mmproj", str(proj), "-a", f"{pictures.url}/to-cat", "-p", "What is it?", "-n", "2",
             "--ctx", "1024")
    assert ok.returncode == 0, ok.stderr
    bad = cli("run", "--mmproj", str(proj), "-a", f"{pictures.url}/404", "-p", "What is it?", "-n", "2")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [f"localgen: error: cannot fetch {pictures.url}/404: HTTP 404"]
