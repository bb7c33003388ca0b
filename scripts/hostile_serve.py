#!/usr/bin/env python3
"""A hostile client for `localgen serve`: bad Unicode, a huge body, deep nesting, the wrong content type, a
foreign Origin and Host, a PNG bomb, a private image URL, a tool schema with $ref/$defs, chat_template_kwargs
that would replace `messages`, a tool call the model repeats, a rerank query too long for the window,
disconnects (streamed and not), an unload mid-stream, a slow reader, and a crowd of concurrent connections
against a small queue; and the bounds of a request's head (64 KiB of line and headers: a long URL, many headers,
one huge header, each sent at once and slowly, while others are answered), of a DELETE's body (over --max-body, and
stalled past --read-timeout), a transfer coding the server does not decode (gzip, chunked: a 501), and a model name
with blanks around it (a 400). Each check prints PASS or FAIL; the last one asks the model for an answer, which
must still come. Exits 1 if any check failed.

    scripts/hostile_serve.py                      # starts `localgen serve -np 2 --max-queue 8 --allow-image-urls
                                                  #   --read-timeout 5`
    scripts/hostile_serve.py --url http://127.0.0.1:11435 --max-queue 8 --slots 2   # started with --allow-image-urls
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import select
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import harness
import httpx

JSON = {"Content-Type": "application/json"}
MAX_HEAD = 64 << 10  # serve's bound on a request's line and headers together (serve/stalls.py)


class Checks:
    def __init__(self, url: str, model: str, key: str | None, read_timeout: float = 30.0) -> None:
        self.url, self.model = url, model
        self.read_timeout = read_timeout  # the server's --read-timeout
        self.auth = {"Authorization": f"Bearer {key}"} if key else {}
        self.failed: list[str] = []
        self.run = 0

    def check(self, name: str, fn: Callable[[], str | None]) -> None:
        self.run += 1
        t0 = time.perf_counter()
        try:
            problem = fn()
        except Exception as e:  # a check that blew up failed, whatever the reason
            problem = f"{type(e).__name__}: {e}"
        took = time.perf_counter() - t0
        print(f"{'PASS' if problem is None else 'FAIL'}  {name:44} {took:6.2f} s" + (f"  {problem}" if problem else ""),
              flush=True)
        if problem is not None:
            self.failed.append(name)

    def post(self, path: str, content: bytes | None = None, headers: dict[str, str] | None = None,
             timeout: float = 60, **body: object) -> httpx.Response:
        data = content if content is not None else json.dumps({"model": self.model, **body}).encode()
        return httpx.post(self.url + path, content=data, headers={**JSON, **self.auth, **(headers or {})},
                          timeout=timeout)

    def health(self) -> dict[str, object]:
        doc = httpx.get(f"{self.url}/health", timeout=10).json()
        return dict(doc["models"][self.model] if self.model in doc["models"] else next(iter(doc["models"].values())))

    def idle_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.health()["running"]:
                return True
            time.sleep(0.05)
        return False

    def answers(self) -> str | None:
        r = self.post("/v1/completions", prompt="The capital of France is", max_tokens=4, temperature=0)
        if r.status_code != 200:
            return f"{r.status_code}: {r.text[:200]}"
        return None if httpx.get(f"{self.url}/health", timeout=10).json()["status"] == "ok" else "health not ok"

    # ---- the checks ---------------------------------------------------------------------------------

    def bad_unicode(self) -> str | None:
        raw = json.dumps({"model": self.model, "prompt": "x", "max_tokens": 2}).replace('"x"', '"hi \\ud800"')
        r = self.post("/v1/completions", content=raw.encode())
        return None if r.status_code == 400 else f"status {r.status_code}"

    def huge_body(self) -> str | None:
        r = self.post("/v1/completions", prompt="x" * (64 << 20), max_tokens=1)
        return None if r.status_code == 413 else f"status {r.status_code}"

    def deep_nesting(self) -> str | None:
        raw = b'{"model": "m", "prompt": "x", "a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        r = self.post("/v1/completions", content=raw)
        if r.status_code != 400:
            return f"status {r.status_code}"
        return "internals in the error body" if "Error" in r.text or "Traceback" in r.text else None

    def wrong_content_type(self) -> str | None:
        body = json.dumps({"model": self.model, "prompt": "x", "max_tokens": 1}).encode()
        r = self.post("/v1/completions", content=body, headers={"Content-Type": "text/plain"})
        return None if r.status_code == 415 else f"status {r.status_code}"

    def foreign_origin(self) -> str | None:
        r = self.post("/v1/completions", headers={"Origin": "https://evil.example"}, prompt="x", max_tokens=1)
        pre = httpx.options(f"{self.url}/v1/completions", headers={"Origin": "https://evil.example",
                                                                    "Access-Control-Request-Method": "POST"})
        return None if r.status_code == 403 and pre.status_code == 403 else f"status {r.status_code}/{pre.status_code}"

    def rebinding_host(self) -> str | None:
        r = httpx.get(f"{self.url}/v1/models", headers={**self.auth, "Host": "attacker.example"}, timeout=10)
        return None if r.status_code == 403 else f"status {r.status_code} (fine if serving off loopback)"

    def chat(self, **body: object) -> httpx.Response:
        return self.post("/v1/chat/completions", timeout=120, **body)

    def png_bomb(self) -> str | None:
        # a 64×64 header whose pixel data inflates to 64 MiB: refused before any decoder sees it
        def chunk(kind: bytes, data: bytes) -> bytes:
            return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

        ihdr = (64).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64 << 20), 9)) \
            + chunk(b"IEND", b"")
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        r = self.chat(max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]}])
        if r.status_code != 400:
            return f"status {r.status_code}"
        return None if "inflates" in r.text else f"400 for another reason: {r.text[:160]}"

    def private_image_url(self) -> str | None:
        # with --allow-image-urls a request's URL is still refused inside the server's own network
        r = self.chat(max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/x.png"}},
            {"type": "text", "text": "What is this?"}]}])
        if r.status_code != 400:
            return f"status {r.status_code}"
        return None if "refused" in r.text else f"400 without \"refused\": {r.text[:160]}"

    def tool_with_refs(self) -> str | None:
        item = {"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["name", "count"]}
        tool = {"type": "function", "function": {"name": "add_item", "description": "Add an item to the list.",
                                                 "parameters": {"type": "object", "$defs": {"item": item},
                                                                "properties": {"item": {"$ref": "#/$defs/item"}},
                                                                "required": ["item"]}}}
        r = self.chat(max_tokens=120, temperature=0, tools=[tool], tool_choice="required",
                      messages=[{"role": "user", "content": "Add three apples."}])
        if r.status_code != 200:
            return f"status {r.status_code}: {r.text[:200]}"
        calls = r.json()["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            return "no tool call"
        args = json.loads(calls[0]["function"]["arguments"])
        return None if isinstance(args.get("item"), dict) and "name" in args["item"] else f"arguments {args}"

    def repeated_tool_call(self) -> str | None:
        # SmolLM2 made to call a tool without arguments writes the same call until max_tokens: one call comes
        # back, and generation stops at the first repeat
        clock = {"type": "function", "function": {"name": "get_time", "description": "The current time.",
                                                  "parameters": {"type": "object", "properties": {}}}}
        r = self.chat(max_tokens=160, temperature=0, tools=[clock], tool_choice="required",
                      messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        if r.status_code != 200:
            return f"status {r.status_code}: {r.text[:200]}"
        doc = r.json()
        calls = doc["choices"][0]["message"].get("tool_calls") or []
        if [c["function"]["name"] for c in calls] != ["get_time"]:
            return f"calls {calls}"
        used = doc["usage"]["completion_tokens"]
        return None if used < 160 else f"generated to max_tokens ({used} tokens)"

    def rerank_long_query(self) -> str | None:
        # a query the window cannot hold is refused before it is tokenized with every document
        r = self.post("/v1/rerank", timeout=60, query="word " * 200_000, documents=["a", "b"])
        if r.status_code != 400:
            return f"status {r.status_code}"
        return None if r.json()["error"].get("param") == "query" else f"400 without param query: {r.text[:160]}"

    def template_kwargs_collide(self) -> str | None:
        r = self.chat(max_tokens=1, chat_template_kwargs={"messages": [{"role": "system", "content": "pwned"}]},
                      messages=[{"role": "user", "content": "Hi"}])
        return None if r.status_code == 400 else f"status {r.status_code}"

    def disconnect_mid_stream(self) -> str | None:
        body = {"model": self.model, "prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, headers=self.auth, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    break
        return None if self.idle_within(5) else "still generating 5 s after the client left"

    def disconnect_non_streamed(self) -> str | None:
        try:
            self.post("/v1/completions", timeout=1.5, prompt="Once", max_tokens=4000, ignore_eos=True)
            return "answered before the client gave up"
        except httpx.TimeoutException:
            pass
        return None if self.idle_within(5) else "still generating 5 s after the client left"

    def unload_mid_stream(self) -> str | None:
        got: dict[str, list[str]] = {}

        def stream() -> None:
            body = {"model": self.model, "prompt": "Once", "max_tokens": 150, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, headers=self.auth, timeout=120) as r:
                got["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data:")]

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.monotonic() + 30
        while not self.health()["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        r = self.post("/api/generate", prompt="", keep_alive=0)
        t.join(120)
        self.post("/api/generate", prompt="", keep_alive="5m")  # loaded again, for the rest
        if r.status_code != 200:
            return f"unload answered {r.status_code}"
        lines = got.get("lines", [])
        return None if lines and lines[-1] == "data: [DONE]" else "the stream did not finish"

    def slow_reader(self) -> str | None:
        body = {"model": self.model, "prompt": "Once", "max_tokens": 64, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        data: list[str] = []
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, headers=self.auth, timeout=120) as r:
            lines = r.iter_lines()
            next(lines)
            other = self.post("/v1/completions", prompt="Hello", max_tokens=8, temperature=0)  # while it stalls
            for line in lines:
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                time.sleep(0.02)
        if other.status_code != 200:
            return f"another client got {other.status_code} while one read slowly"
        # the whole stream reached it: every token (pieces may join tokens that make one character), then [DONE]
        usage = json.loads(data[-2]).get("usage") if len(data) >= 2 and data[-1] == "[DONE]" else None
        got = usage.get("completion_tokens") if isinstance(usage, dict) else None
        return None if got == 64 else f"the slow reader's stream ended without its 64 tokens ({got})"

    # ---- a request's head, a DELETE's body, transfer codings and model names, in raw bytes ----------------

    def raw(self, data: bytes, piece: int = 0, pause: float = 0.0) -> bytes:
        """What the server sends back on a connection of its own for `data` (at once, or `piece` bytes at a time
        with `pause` seconds between: no more once an answer came), read until the server closes it."""
        from urllib.parse import urlsplit

        where = urlsplit(self.url)
        auth = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in self.auth.items())
        if auth and b"\r\n" in data:  # the key after the request line, where a server that wants one reads it
            line, rest = data.split(b"\r\n", 1)
            data = line + b"\r\n" + auth + rest
        with socket.create_connection((where.hostname or "127.0.0.1", where.port or 80)) as sock:
            sock.settimeout(self.read_timeout + 30)  # a connection held open past this fails the check
            step = piece or len(data) or 1
            try:
                for i in range(0, len(data), step):
                    if select.select([sock], [], [], 0)[0]:
                        break  # answered (and closed) before it had everything
                    sock.sendall(data[i:i + step])
                    time.sleep(pause)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed mid-send: what it answered first is still to be read
            out = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    out += chunk
            return out

    def head_bound(self, head: bytes, slowly: bool) -> str | None:
        """A request head past 64 KiB is a 431 and the connection closed, sent at once or slowly; meanwhile (and
        after) another client's /health answers."""
        got: dict[str, bytes] = {}
        t = threading.Thread(target=lambda: got.update(out=self.raw(head, 1024 if slowly else 0,
                                                                   0.005 if slowly else 0.0)))
        t.start()
        while_sent = httpx.get(f"{self.url}/health", timeout=10).status_code
        t.join(self.read_timeout + 60)
        out = got.get("out", b"")
        if not out.startswith(b"HTTP/1.1 431"):
            return f"answered {out[:60]!r}"
        if b"%d bytes" % MAX_HEAD not in out:
            return f"a 431 that names no bound: {out[:200]!r}"
        after = httpx.get(f"{self.url}/health", timeout=10).status_code
        return None if while_sent == after == 200 else f"/health answered {while_sent} meanwhile, {after} after"

    def delete_body_over_the_bound(self) -> str | None:
        out = self.raw(b"DELETE /api/delete HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Connection: close\r\nContent-Length: %d\r\n\r\n{" % (1 << 30))
        return None if out.startswith(b"HTTP/1.1 413") else f"answered {out[:80]!r}"

    def delete_body_stalled(self) -> str | None:
        t0 = time.monotonic()
        out = self.raw(b"DELETE /api/delete HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 100\r\n\r\n{")
        if not out.startswith(b"HTTP/1.1 408"):
            return f"answered {out[:80]!r}"
        took = time.monotonic() - t0
        return None if took < self.read_timeout + 10 else f"closed after {took:.0f} s, not --read-timeout"

    def gzip_chunked(self) -> str | None:
        body = json.dumps({"model": self.model, "prompt": "Hi", "max_tokens": 1}).encode()
        out = self.raw(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Connection: close\r\nTransfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                       % (len(body), body))
        return None if out.startswith(b"HTTP/1.1 501") else f"answered {out[:80]!r}"

    def name_with_blanks(self) -> str | None:
        for path in ("/api/show", "/api/pull"):  # never /api/delete: a server that took the name would delete it
            for name in (f" {self.model}", f"{self.model}\n", f"{self.model}\t"):
                r = httpx.post(f"{self.url}{path}", json={"model": name, "stream": False}, headers=self.auth,
                               timeout=60)
                if r.status_code != 400:
                    return f"{path} {name!r}: status {r.status_code}"
        return None

    def crowd(self, n: int, max_queue: int, slots: int) -> str | None:
        async def one(client: httpx.AsyncClient) -> int:
            r = await client.post(f"{self.url}/v1/completions", headers={**JSON, **self.auth}, content=json.dumps(
                {"model": self.model, "prompt": "Tell me a story", "max_tokens": 16, "ignore_eos": True}))
            return r.status_code

        async def all_of_them() -> list[int]:
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                return await asyncio.gather(*(one(client) for _ in range(n)))

        # loaded first (an unload asked mid-stream above happens once the model is idle): the crowd meets the
        # queue, not a load
        self.post("/api/generate", prompt="", keep_alive="5m", timeout=300)
        codes = asyncio.run(all_of_them())
        ok, busy = codes.count(200), codes.count(503)
        if ok + busy != n:
            return f"unexpected answers: {sorted(set(codes))}"
        if ok < slots + max_queue:
            return f"only {ok} of {n} were served (slots + queue = {slots + max_queue})"
        print(f"      {n} connections: {ok} answered, {busy} told 503 (queue full)")
        return None


READ_TIMEOUT = 5  # the --read-timeout of the server this script starts: a stalled body's 408 comes soon


def _server(port: int, max_queue: int, slots: int) -> contextlib.AbstractContextManager[object]:
    """A `localgen serve` for the checks on `port` (its log shown), stopped with SIGTERM at the end."""
    root = Path(__file__).resolve().parent.parent
    return harness.server([sys.executable, "-m", "localgen", "serve", "--port", str(port), "-np", str(slots),
                           "--max-queue", str(max_queue), "--ctx", "8192", "--allow-image-urls",
                           "--read-timeout", str(READ_TIMEOUT)],
                          f"http://127.0.0.1:{port}/health", cwd=root, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                          quiet=False, grace=60, name="localgen serve")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--api-key")
    ap.add_argument("--max-queue", type=int, default=8, help="the server's --max-queue")
    ap.add_argument("--slots", type=int, default=2, help="the server's -np")
    ap.add_argument("--crowd", type=int, default=200, help="concurrent connections")
    ap.add_argument("--read-timeout", type=float, help="the server's --read-timeout (default: 30, or the "
                    f"{READ_TIMEOUT} s of the server it starts)")
    args = ap.parse_args()
    port = harness.free_port()
    url = args.url or f"http://127.0.0.1:{port}"
    read_timeout = args.read_timeout or (30.0 if args.url else READ_TIMEOUT)
    c = Checks(url.rstrip("/"), args.model, args.api_key, read_timeout)
    long_url = b"GET /health?" + b"x" * (MAX_HEAD + 4096) + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
    many = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(7000)) \
        + b"\r\n"
    huge = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"y" * (MAX_HEAD + 4096) + b"\r\n\r\n"
    with contextlib.nullcontext() if args.url else _server(port, args.max_queue, args.slots):
        c.check("invalid Unicode is a 400", c.bad_unicode)
        c.check("a 64 MiB body is a 413", c.huge_body)
        c.check("200,000 levels of nesting are a 400", c.deep_nesting)
        c.check("text/plain is a 415", c.wrong_content_type)
        c.check("a foreign Origin is a 403 (and its preflight)", c.foreign_origin)
        c.check("a rebinding Host is a 403", c.rebinding_host)
        c.check("a PNG bomb is a 400", c.png_bomb)
        c.check("a private image URL is a 400 (refused)", c.private_image_url)
        c.check("a tool schema with $ref/$defs is a 200", c.tool_with_refs)
        c.check("chat_template_kwargs.messages is a 400", c.template_kwargs_collide)
        c.check("a repeated tool call is one call, stopped early", c.repeated_tool_call)
        c.check("a rerank query too long for the window is a 400", c.rerank_long_query)
        c.check("a stream's client leaves: generation stops", c.disconnect_mid_stream)
        c.check("a waiting client leaves: generation stops", c.disconnect_non_streamed)
        c.check("unload mid-stream: the stream finishes", c.unload_mid_stream)
        c.check("a slow reader holds up no one", c.slow_reader)
        for label, head in (("a 68 KiB URL", long_url), (f"{many.count(b'X-H'):,} headers", many),
                            ("a 68 KiB header", huge)):
            for slowly in (False, True):
                c.check(f"{label}, sent {'slowly' if slowly else 'at once'}, is a 431",
                        functools.partial(c.head_bound, head, slowly))
        c.check("a DELETE body over --max-body is a 413", c.delete_body_over_the_bound)
        c.check("a stalled DELETE body is a 408", c.delete_body_stalled)
        c.check("Transfer-Encoding gzip, chunked is a 501", c.gzip_chunked)
        c.check("a model name with blanks around it is a 400", c.name_with_blanks)
        c.check(f"{args.crowd} connections, --max-queue {args.max_queue}",
                lambda: c.crowd(args.crowd, args.max_queue, args.slots))
        c.check("the model still answers", c.answers)
    failed = f"; failed: {', '.join(c.failed)}" if c.failed else ""
    print(f"hostile_serve: {c.run - len(c.failed)} of {c.run} checks held{failed}")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
