"""What tests/test_doc_examples_run.py checks of the docs' examples: the output of a command that ends
(`check`), and the examples that serve until stopped (`serve`, `rpc-server`).

A serving example starts as written (its argv and environment, in its page's home and directory) on the port
it names or its default (serve 11435, rpc-server 50052): the port is the example's, so none is given in its
place, and no environment variable sets either command's port. Other tests' servers take free ports, which
Linux picks from 32768-60999 (ip_local_port_range), never these two; what can hold one is another process on
this machine (a user's own `localgen serve`, another run of this file). So the port is checked first as the
command itself checks it (a bind with SO_REUSEADDR): a busy one is waited for, BUSY_S, then a failure that
says what to stop. The example is waited for until it listens (a TCP connect: serve listens once its models
have loaded), asked what is cheap (serve: /health holds the models it names, loaded at start, with its
`--parallel` slots and `--max-models`, and /v1/models lists them, given the example's key, and is 401 without
it, and a chat request that names no model is answered by its default model; rpc-server: its HELLO answer,
this build's protocol), and stopped as a user stops it (serve: SIGTERM, exit 0; rpc-server: Ctrl-C, its
banner says, which ends it by SIGINT as it ends llama.cpp's own), without a traceback. A `localgen ps`
right after a serve on its page asks that server, up until the ps has run (`kept`).
About 0.4 s of CPU a start with SmolLM2, 1.1 s with Gemma too."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI

SMOLLM2 = "smollm2:135m"
SERVES = {"serve": 11435, "rpc-server": 50052}  # the commands that serve until stopped, and their default ports
BUSY_S, START_S = 60, 300  # waiting for a busy port; a safety net for a start on busy cores


def values(argv: tuple[str, ...], *flags: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in flags]


def address(argv: tuple[str, ...]) -> tuple[str, int]:
    """Where a serving example listens: its --host and --port (rpc-server's -p too), else the defaults."""
    ports = values(argv, "--port", *(("-p",) if argv[0] == "rpc-server" else ()))
    return (values(argv, "--host") or ["127.0.0.1"])[-1], int((ports or [SERVES[argv[0]]])[-1])


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass
class Served:
    """A serving example's process (stderr in `log`), where it answers, and the API key it was given."""

    proc: Any
    argv: tuple[str, ...]
    port: int
    log: Path
    key: str | None

    url = property(lambda self: f"http://127.0.0.1:{self.port}")

    def listens(self) -> bool:  # serve listens once its models have loaded
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def check(self) -> None:
        if self.argv[0] == "rpc-server":
            from localgen.native import devices

            assert devices.rpc_hello(f"127.0.0.1:{self.port}")[0] == devices.RPC_PROTO_MAJOR
            return
        auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        with httpx.Client(base_url=self.url, timeout=120) as http:
            health = http.get("/health").json()
            got = http.get("/v1/models", headers=auth)
            assert not self.key or http.get("/v1/models").status_code == 401, "no key, no models"
            chat = http.post("/v1/chat/completions", headers=auth, json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        # a request that names no model (a chat front-end's, the chat page's) goes to the example's default model
        assert chat.status_code == 200, f"the default model does not chat: {chat.text}"
        named = values(self.argv, "-m", "--model") or [SMOLLM2]  # loaded at start; without -m, the default
        assert set(named) <= health["models"].keys(), health
        slots = int((values(self.argv, "--parallel", "-np") or ["4"])[-1])
        assert all(health["models"][m]["slots"] == slots for m in named), health
        assert health["residency"]["max_models"] == int((values(self.argv, "--max-models") or ["3"])[-1]), health
        assert got.status_code == 200 and set(named) <= {m["id"] for m in got.json()["data"]}, got.text

    def stop(self) -> None:
        rpc = self.argv[0] == "rpc-server"
        self.proc.send_signal(signal.SIGINT if rpc else signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        assert rc == (-signal.SIGINT if rpc else 0) and "Traceback" not in self.said(), \
            f"exit {rc}: {self.said()[-3000:]}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)


def start(cli: CLI, argv: tuple[str, ...], cwd: Path, where: str) -> Served:
    """The serving example started as written in `cwd`, once its port is free, and waited for until it answers."""
    host, port = address(argv)
    deadline = time.monotonic() + BUSY_S
    while not _free(host, port):
        if time.monotonic() > deadline:
            pytest.fail(f"{where} listens on {host}:{port} as written, and something else has held that port for "
                        f"{BUSY_S} s (a localgen {argv[0]} of yours, another run of this file?): stop it")
        time.sleep(0.5)
    key = (values(argv, "--api-key") or [None])[-1] or cli.env.get("LOCALGEN_API_KEY")
    if files := values(argv, "--api-key-file"):
        key = (cwd / files[-1]).read_text().strip()
    log = cwd.parent / f"{argv[0]}-{where.replace('/', '-')}.log"  # kept, to read after a failure
    with log.open("wb") as err:
        served = Served(cli.popen(*argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err), argv, port, log, key)
    deadline = time.monotonic() + START_S
    while not served.listens():
        if served.proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                served.kill()
            pytest.fail(f"{where} did not start (exit {served.proc.poll()}): {served.said()[-3000:]}")
        time.sleep(0.05)
    return served


@contextlib.contextmanager
def kept(page: Any, keep: bool) -> Iterator[None]:
    """Around an example: the page's server (`page.server`) stays up after it only when `keep` (the next
    example that runs on the page is a `ps` that asks it); else it is stopped and its end checked. An
    example that fails kills it, so the next serving example finds its port free."""
    try:
        yield
    except BaseException:
        server, page.server = page.server, None
        if server is not None:
            server.kill()
        raise
    if page.server is not None and not keep:
        server, page.server = page.server, None
        server.stop()


def json_lines(out: str) -> list[Any]:  # one JSON document, or one a line
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def check(out: str, page: Any, a: tuple[str, ...]) -> None:
    """What is cheap to check of each kind of example that ends (`page`: its Page, for its files and stdin)."""
    flags = set(a)
    tools = bool({"--functions", "--mcp"} & flags)
    if tools:  # tools.md: a call the 4 tokens cut is left out, so the answer may be none; never the call's JSON
        assert '{"tool_call' not in out and "<tool_call>" not in out, out
    elif a[0] in ("run", "chat") and not {"--json", "--file", "--each-line", "-l"} & flags:
        assert out.strip(), "no answer on stdout"
    if a[0] == "run" and {"--file", "--each-line"} & flags:  # a batch: one answer per line, none an error
        named = values(a, "--file")[0] if "--file" in flags else "-"  # --file - is stdin, as --each-line's
        given = page.given if named == "-" else (page.work / named).read_text()
        got = json_lines(out) if "--json" in flags else out.splitlines()
        assert len(got) == len(given.splitlines()), out
        assert all(not isinstance(g, dict) or (g.get("text") and "error" not in g) for g in got), out
    elif a[0] == "run" and "--json" in flags:
        [got] = json_lines(out)
        # with tools, the call the 4 tokens cut (mid-marker too) is left out: the text may be none (above)
        text = got["text"].strip()
        assert (text or tools) and ("yesno.gbnf" not in flags or text in ("yes", "no")), out
    if "--no-log" in flags:  # the prompt is not in the log; a home where nothing was logged yet has none at all
        logs, prompt = page.home / "data" / "logs" / "logs.db", (values(a, "-p", "--prompt") or [a[-1]])[-1]
        if logs.exists():
            with sqlite3.connect(logs) as db:
                assert not db.execute("SELECT count(*) FROM responses WHERE prompt LIKE ?",
                                      (f"%{prompt}%",)).fetchone()[0]
    if a[0] == "logs" and "--json" in flags:
        [entries] = json_lines(out)
        assert entries and all(e["conversation_id"] == values(a, "--cid")[0] for e in entries), out
    if a[:2] == ("logs", "path"):
        assert out.strip().endswith("logs.db"), out
    if a[:2] in (("logs", "off"), ("logs", "on")):
        assert (page.home / "config" / "logs-off").exists() == (a[1] == "off")
    if a[0] == "embed" and "--store" not in flags:  # with --store, `similar` finds them
        vectors = json_lines(out)[0]["data"] if "--json" in flags else json_lines(out)
        assert vectors and all(len(g["embedding"]) > 0 for g in vectors), out
    if a[0] == "collections" and len(a) == 1:  # the page's collection, as stored just before
        assert out.startswith("NAME") and "notes" in out, out
    if a[:2] == ("collections", "show"):  # the ids the page's rm --id takes
        assert out.startswith(f"name          {a[2]}\n") and "\ncar " in out, out
    if a[0] in ("similar", "rerank"):
        scores = [g["score"] for g in json_lines(out)]
        assert scores and scores == sorted(scores, reverse=True), out
    if a[0] == "list":
        assert ("qwen2.5:7b" if "--catalogue" in flags else SMOLLM2) in out, out
    if a[0] == "show":
        assert "FROM " in out if "--modelfile" in flags else out.strip(), out
    if a[0] == "ps":  # the server the page's serve example left up: the default model, loaded at its start
        assert SMOLLM2 in out, out
    if a[0] == "stop":  # quiet: it unloaded the model, which that server no longer lists as loaded
        assert out == "", out
        assert SMOLLM2 not in httpx.get(f"{page.server.url}/api/ps", timeout=10).text
    if a[0] in ("create", "cp"):
        assert (page.home / "data" / "presets" / f"{a[-1] if a[0] == 'cp' else a[1]}.json".replace(":", "@")).exists()
    if a[:2] == ("chat", "-l"):
        assert out.strip(), "no saved chat listed"
