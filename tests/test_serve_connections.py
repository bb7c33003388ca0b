"""`serve` and the connections its clients hold (docs/serve.md, Limits): requests pipelined on a connection whose
answers are never read, a client that never reads what it asked for, a malformed request after good ones, a
client that half-closes its side once it has asked, and bodies trickled after a burst. Each runs against a
`localgen serve` child with a short --read-timeout, on raw sockets; what is asserted is what a client or the
server's log sees, never how long it took."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.test_serve import Server

MODEL = "smollm2:135m"
pytestmark = pytest.mark.slow  # every test talks to a server on SmolLM2
SAFETY_NET_S = 60  # a connection the server should have closed by then fails the test


@pytest.fixture(scope="module")
def child(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "2048", "--read-timeout", "1", "--max-body", "1M")
    yield s
    assert s.stop() == 0


def _rss(pid: int) -> int:
    """The process's resident memory, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) << 10


def _all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a safety net: a connection held open fails)."""
    sock.settimeout(SAFETY_NET_S)
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


GET = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"


# serve.md: requests pipelined on a connection are parsed one at a time, each once the one before is answered: one
# client that sent GET /v1/models 500,000 times and read nothing grew the server by 700 MB (uvicorn queued each)
def test_requests_pipelined_by_a_client_that_reads_nothing_are_not_queued_in_the_server(child: Server) -> None:
    before = _rss(child.proc.pid)
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.settimeout(10)  # once the server stops reading, what the client still sends waits in the buffers
        with contextlib.suppress(TimeoutError):
            for _ in range(50):
                sock.sendall(GET * 5000)  # 10 MB in all
        grown = _rss(child.proc.pid) - before
        assert grown < 64 << 20, f"the server grew by {grown >> 20} MB"
        assert httpx.get(f"{child.url}/health", timeout=30).status_code == 200


# serve.md: a malformed request after good ones pipelined is answered 400 after their answers (uvicorn wrote it
# inside the stream before them, and logged a traceback for the answer it then could not write)
def test_a_malformed_request_pipelined_after_a_stream_is_answered_after_it(child: Server) -> None:
    body = b'{"model": "smollm2:135m", "prompt": "Once upon a time", "max_tokens": 8, "stream": true}'
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: beforebad\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                     + GET + b"NOT HTTP AT ALL\r\n\r\n")
        out = _all(sock)
    stream, _, rest = out.partition(b"data: [DONE]")
    assert stream.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 400" not in stream, out[:600]
    answers = re.findall(rb"HTTP/1\.1 (\d+)", rest)
    assert answers == [b"200", b"400"], rest[:600]
    assert " 200 " in child.access("beforebad"), child.log()[-2000:]
    assert "Traceback" not in child.log() and "Exception in ASGI application" not in child.log()


# serve.md: a client that half-closes its side once it has asked (`nc -N`, HTTP/1.0 tools) still reads the answers
# (the server closed the connection at its end of file: 0 bytes back)
@pytest.mark.parametrize("asked", [GET, GET + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
                                   b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 2\r\n\r\n{}"], ids=["one", "two", "an error"])
def test_a_client_that_half_closes_after_asking_gets_the_answers(child: Server, asked: bytes) -> None:
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(asked)
        sock.shutdown(socket.SHUT_WR)
        out = _all(sock)
    answers = re.findall(rb"HTTP/1\.1 (\d+)", out)
    assert answers == ([b"400"] if b"POST" in asked else [b"200"] * asked.count(b"GET")), out[:600]
    assert out.rstrip().endswith(b"}"), out[-300:]


def test_a_generation_whose_client_half_closes_stops_as_for_one_that_left(child: Server) -> None:
    # serve.md: the server cannot tell a half-close from a client that left, and a generation stops for one that left
    body = b'{"model": "smollm2:135m", "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": true}'
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: halfgen\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.shutdown(socket.SHUT_WR)
        assert _all(sock) == b""
    assert " 499 " in child.access("halfgen"), child.log()[-2000:]


# serve.md: a connection whose answers wait --read-timeout seconds for its client to read them is closed (uvicorn
# has no write timeout: such clients were never closed, and past the cap of connections new ones were refused)
def test_a_client_that_never_reads_its_answers_is_closed(child: Server) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting: the window stays small)
        sock.connect(("127.0.0.1", child.port))
        sock.settimeout(10)  # once the server stops reading, what the client still sends waits in the buffers
        with contextlib.suppress(TimeoutError):
            for _ in range(20):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" * 1000)  # 1.4 KB answers
        end = time.monotonic() + SAFETY_NET_S
        while (state := _server_side(child.port, sock.getsockname()[1])) == "01" and time.monotonic() < end:
            time.sleep(0.1)  # (read nothing: reading would let the answers go)
        assert state != "01", "the connection that reads nothing was left open"
    assert httpx.get(f"{child.url}/health", timeout=30).status_code == 200


def _server_side(port: int, client: int) -> str:
    """The TCP state of the server's end of the connection from port `client` ("01": established), as the kernel
    lists it; "" once it is gone."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, state = line.split()[1:4]
            if local.endswith(f":{port:04X}") and remote.endswith(f":{client:04X}"):
                return state
    return ""


def _trickled_after(port: int, burst: bytes, every: float, piece: bytes) -> bytes:
    """What the server answers a body sent `burst` first, then `piece` each `every` seconds (each well within
    --read-timeout of the one before), until it answers or closes (a safety net: a body held that long fails)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        with contextlib.suppress(OSError):  # (a server that refuses mid-burst may close on it: its answer is read)
            sock.sendall(burst)
        sock.settimeout(every)
        out = b""
        end = time.monotonic() + SAFETY_NET_S
        while time.monotonic() < end:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(piece)
                continue
            except ConnectionResetError:  # the server closed on bytes it had not read (a refusal, or a piece sent
                break  # after an answer): the kernel's reset ends it, what came before it stands
            if not chunk:
                break
            out += chunk
        return out


def _json_head(size: int, rid: bytes = b"x") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n{" % (rid, size))


# serve.md: what a body sent fast is no credit for a trickle after it past --read-timeout seconds (16 MB sent at
# once, then a byte every 29 s, held its connection and its 16 MB for nine hours: one second each 500 bytes)
def test_a_body_sent_fast_then_trickled_is_a_408(child: Server) -> None:
    out = _trickled_after(child.port, _json_head(900_000) + b" " * 800_000, 0.3, b" ")
    assert out.startswith(b"HTTP/1.1 408") and b"the request body came too slowly" in out, out[:400]


# serve.md: the bodies still arriving hold at most 4 x --max-body (here 1M) at once, all connections together;
# past it a body is a 503 (30 clients each holding 16 MB short of its end held 520 MB)
def test_bodies_held_past_four_times_max_body_are_a_503(child: Server) -> None:
    answers: list[bytes] = []

    def hold(i: int) -> None:  # 990 KB at once, then the rest at some 3 KB/s: never too slow
        answers.append(_trickled_after(child.port, _json_head(1_000_000, b"held%d" % i) + b" " * 990_000, 0.3,
                                       b" " * 1000))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert refused and b"too many request bodies" in refused[0], [a[:200] for a in answers]
    assert httpx.get(f"{child.url}/health", timeout=30).status_code == 200


# api.md: a gzip body of several members (RFC 1952; `cat a.gz b.gz`, which gzip -d reads) is their contents one
# after the other, within --max-body; it was a 400 "bytes after its end"
def test_a_gzip_body_of_two_members_is_read_whole(child: Server) -> None:
    import gzip

    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).encode()
    packed = gzip.compress(body[:20]) + gzip.compress(body[20:])
    r = httpx.post(f"{child.url}/v1/completions", content=packed, timeout=60,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text
    bomb = gzip.compress(b'{"prompt": "' + b" " * 600_000) + gzip.compress(b" " * 600_000 + b'"}')
    r = httpx.post(f"{child.url}/v1/completions", content=bomb, timeout=60,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "once decompressed" in r.json()["error"]["message"], r.text


# api.md: another coding is a 415 that names it, on an upload too (gzip there was a misleading multipart error,
# and `br` was stored as sent)
@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_an_upload_with_a_content_encoding_is_a_415_that_names_it(child: Server, coding: str) -> None:
    r = httpx.post(f"{child.url}/v1/files", data={"purpose": "batch"}, timeout=60,
                   files={"file": (f"sent-{coding}.jsonl", b'{"custom_id": "a"}\n', "application/jsonl")},
                   headers={"Content-Encoding": coding})
    assert r.status_code == 415 and f"Content-Encoding {coding} is not supported" in r.text, r.text
    listed = httpx.get(f"{child.url}/v1/files", timeout=30).json()["data"]
    assert not any(f["filename"] == f"sent-{coding}.jsonl" for f in listed), listed


def test_a_gzip_body_of_many_members_is_decoded_in_slices_and_their_number_bounded() -> None:
    """Each member's leftover was a copy of the whole rest of the body: 16 MB of empty 20-byte members took ~2
    minutes of CPU (quadratic). The body is fed in slices (a member's leftover is a copy of one slice at most) and
    more than MAX_MEMBERS members is a 400; members split across slices are read whole."""
    import gzip

    from localgen.serve.apierror import HTTPError
    from localgen.serve.guard import MAX_MEMBERS, SLICE, decoded

    big = [b"x" * (SLICE + 123), b"y" * (3 * SLICE), b"z"]  # members across slice boundaries
    assert decoded(b"".join(gzip.compress(p) for p in big), "gzip", 1 << 20) == b"".join(big)
    assert decoded(gzip.compress(b"") * (MAX_MEMBERS - 1) + gzip.compress(b"ok"), "gzip", 100) == b"ok"
    with pytest.raises(HTTPError, match=f"more than {MAX_MEMBERS:,} gzip members") as e:
        decoded(gzip.compress(b"") * 800_000, "gzip", 16 << 20)  # 16 MB: refused at the 1,001st member
    assert e.value.status == 400



class _Transport(asyncio.Transport):
    """A transport for uvicorn's protocol in process, with no socket: it writes nothing anywhere and says how it
    was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = self.aborted = self.half_closed = False

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.half_closed = True

    def is_reading(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)


def _protocol(seconds: float, transport: _Transport) -> Any:
    """serve's protocol (uvicorn's, its read timeout `seconds`) on `transport`, in the running loop."""
    import uvicorn
    from uvicorn.server import ServerState

    from localgen.serve.connection import with_header_deadline

    config = uvicorn.Config(lambda scope, receive, send: None, lifespan="off", ws="none")
    config.load()
    protocol = with_header_deadline(seconds)(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    protocol.connection_made(transport)
    return protocol


def test_a_closing_connection_whose_client_reads_nothing_is_cut_off_after_read_timeout() -> None:
    """An answer written before the connection closes (HTTP/1.0, `Connection: close`, a 408 or 431) that its client
    never reads: asyncio's close() waits for it to be read, with no limit, and the deadline stopped looking at a
    connection once it was closing, so such clients held their descriptors for ever, past the cap too (uvicorn's
    protocol here over a transport that never drains; a real socket's buffers take too much to fill in a test)."""

    class Stuck(_Transport):
        def get_write_buffer_size(self) -> int:
            return 0 if self.aborted else 80_000  # written, never read

    async def main() -> bool:
        transport = Stuck()
        _protocol(0.05, transport)
        transport.close()  # an answer sent with Connection: close
        for _ in range(100):
            await asyncio.sleep(0.02)
            if transport.aborted:
                break
        return transport.aborted

    assert asyncio.run(main()), "a closing connection that drains nothing was left open"


def test_an_answer_that_closes_as_its_client_still_sends_is_read_whole_and_then_the_end() -> None:
    """An answer with `Connection: close` written before the request's body all came (a 408 of a trickled body):
    the connection closed with the body's bytes unread, which the kernel answers with a RST, and the client's read
    failed ("connection reset by peer", a CI run's), or lost the answer where the RST came first. It half-closes and
    reads on (drops) what comes, and the client reads the answer, then the end of the connection. (uvicorn with
    serve's protocol, in process, and an app that answers without reading the body.)"""
    import uvicorn

    from localgen.serve.connection import with_header_deadline

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(0.2)  # the client has sent what it sends (it waits in the buffers, not all read)
        await send({"type": "http.response.start", "status": 408, "headers": [(b"connection", b"close"),
                                                                              (b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"late"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", ws="none", log_level="error",
                            http=with_header_deadline(5))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(SAFETY_NET_S)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (64 << 20)
                         + b" " * (512 << 10))
            out = b""
            while chunk := sock.recv(65536):  # a reset raises here
                out += chunk
    finally:
        server.should_exit = True
        thread.join(SAFETY_NET_S)
    assert out.startswith(b"HTTP/1.1 408") and out.endswith(b"\r\n\r\nlate"), out[:300]


def test_a_connection_closed_idle_or_evicted_does_not_linger() -> None:
    """Only a close after an answer lingers: one with a half-sent head, closed by the header deadline or evicted
    past the cap, closes at once (lingering, a flood of them held twice the cap's descriptors)."""

    async def main() -> tuple[bool, bool]:
        transport = _Transport()
        protocol = _protocol(5, transport)
        protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nHost: loc")  # a head begun
        protocol.transport.close()  # as the deadline, or an eviction, closes it
        return transport.closing, transport.half_closed

    assert asyncio.run(main()) == (True, False), "an idle connection's close lingered"


def test_a_blank_line_is_found_in_place_across_the_bytes_before() -> None:
    """The end of a head or of a chunked body is found in what is held without copying it (a copy at each blank
    line made a body of blank lines quadratic), and a blank line begun in the bytes before counts."""
    from localgen.serve.connection import _blank_line

    assert _blank_line(b"", bytearray(b"ab\n\ncd"), 8) == 4
    assert _blank_line(b"", bytearray(b"ab\n\r\ncd"), 8) == 5
    assert _blank_line(b"x\n", bytearray(b"\r\nz"), 4) == 2  # begun before: "\n" then "\r\n"
    assert _blank_line(b"\n\r", bytearray(b"\nz"), 2) == 1
    assert _blank_line(b"", bytearray(b"ab\ncd\n\n"), 5) is None  # past `within`: not looked at
    assert _blank_line(b"ab", bytearray(b"\n\n" * 100_000), 200_000) == 2

