"""A remote that sends odd fields, and URLs that are not URLs (docs/remote.md, Errors): a usage or timings field of
the wrong type is a count not known (the answer stands, in run, run --file, chat and bench), never a traceback; an
--endpoint URL that cannot be parsed (from the flag, LOCALGEN_ENDPOINT, endpoints.toml or serve --endpoint) is one
usage line and exit status 2, before anything connects."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import CLI, InProcessCLI


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


HI = {"choices": [{"delta": {"content": "hi"}}]}
HI_STOP = {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}
STREAMS: dict[str, list[dict[str, Any]]] = {  # model id → what the stream sends before [DONE]
    # the red team's two: a usage count that is a string (and no finish reason), timings of the wrong types
    "usage-bad": [HI, {"choices": [], "usage": {"prompt_tokens": "x", "completion_tokens": None}}],
    "timings-bad": [{**HI_STOP, "timings": {"predicted_per_second": "fast", "prompt_n": [], "cache_n": {},
                                            "prompt_per_second": "fast", "predicted_n": -4}}],
    "usage-list": [HI_STOP, {"choices": [], "usage": [1, 2]}],
    "details-bad": [HI_STOP, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2.5,
                                                        "prompt_tokens_details": "x"}}],
    "logprobs-odd": [{"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop", "logprobs": {"content": [
        {"token": "hi", "logprob": -0.5, "top_logprobs": [{"token": 7, "logprob": -1}, "x"]},
        {"token": "there", "logprob": -0.1, "top_logprobs": "none"}]}}]}],
}
COUNTS = {"usage-bad": (0, 1), "timings-bad": (0, 1), "usage-list": (0, 1), "details-bad": (5, 1),
          "logprobs-odd": (0, 1)}  # (prompt_tokens, completion_tokens) as run --json reports them


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    listing: ClassVar[Any] = {"data": [{"id": m} for m in STREAMS]}  # GET /v1/models
    props: ClassVar[Any] = {}  # GET /props (llama-server's)

    def do_GET(self) -> None:
        body = json.dumps(self.props if self.path == "/props" else self.listing).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for doc in STREAMS[body["model"]]:
            self.wfile.write(_event(doc))
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def _serve(handler: type[_Handler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def odd() -> Iterator[str]:
    yield from _serve(_Handler)


class _OddLists(_Handler):
    listing: ClassVar[Any] = {"data": 5}
    props: ClassVar[Any] = {"default_generation_settings": "big"}


@pytest.fixture(scope="module")
def odd_lists() -> Iterator[str]:
    yield from _serve(_OddLists)


def test_a_model_list_or_props_of_another_shape_is_not_listed(cli: CLI, odd_lists: str) -> None:
    """/v1/models whose data is not a list lists nothing (-m is then needed); /props of another shape says no
    window (chat, which asks it each turn, takes --ctx's or 4096)."""
    r = cli("run", "--endpoint", odd_lists, "-p", "hi", timeout=60)
    assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: {odd_lists.removeprefix('http://')} did "
                                                     "not list its models"), r.stderr
    r = cli("chat", "--endpoint", odd_lists, "-m", "usage-bad", input="hello\n", timeout=60)
    assert r.returncode == 0 and "hi" in r.stdout and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("model", list(STREAMS))
def test_odd_usage_timings_or_logprobs_leave_the_answer_and_count_nothing(cli_in_process: InProcessCLI, odd: str,
                                                                         model: str) -> None:
    r = cli_in_process("run", "--endpoint", odd, "-m", model, "-p", "hi", "--json", "--logprobs", "2")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["text"] == "hi" and doc["finish_reason"] == "stop", doc
    assert (doc["stats"]["prompt_tokens"], doc["stats"]["completion_tokens"]) == COUNTS[model], doc["stats"]
    assert doc["stats"]["prefill_tps"] is None
    if model == "logprobs-odd":  # an alternative that is not a token is left out; the token's own logprob stays
        assert [(t["token"], t["logprob"], t["top_logprobs"]) for t in doc["logprobs"]] == [
            ("hi", -0.5, []), ("there", -0.1, [])], doc["logprobs"]


def test_odd_usage_in_run_file_chat_and_bench_is_no_failure(cli: CLI, odd: str, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n")
    r = cli("run", "--file", str(prompts), "--json", "--endpoint", odd, "-m", "usage-bad", "-np", "1", timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(d["text"], d["finish_reason"]) for d in lines] == [("hi", "stop")] * 2, lines
    r = cli("chat", "--endpoint", odd, "-m", "timings-bad", input="hello\n", timeout=60)
    assert r.returncode == 0 and "hi" in r.stdout and "Traceback" not in r.stderr, r.stderr
    r = cli("bench", "--endpoint", odd, "-m", "usage-bad", "-npl", "1", "-p", "8", "-n", "4", "--num-prompts", "2",
            timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "failed" not in r.stderr, r.stderr
    assert "| usage-bad | 1 | inf | 2 | - | - |" in r.stdout, r.stdout  # both answered; the counts unknown


BAD_URLS = [
    ("http://[::1", "'http://[::1' is not a valid URL (invalid IPv6 URL)"),
    ("http://[zz]:80", "'http://[zz]:80' is not a valid URL ('zz' does not appear to be an IPv4 or IPv6 address)"),
    ("http://127.0.0.1:abc", "http://127.0.0.1:abc: the port must be 1 to 65535"),
    ("http://127.0.0.1:99999", "http://127.0.0.1:99999: the port must be 1 to 65535"),
    ("http://127.0.0.1:0/v1", "http://127.0.0.1:0/v1: the port must be 1 to 65535"),
    ("http://a b:80", "'http://a b:80' has no valid host name"),
    ("http://a..b:1", "'http://a..b:1' has a host name with an empty label or a label over 63 characters"),
    (f"http://{'a' * 64}.com", "has a host name with an empty label or a label over 63 characters"),
    ("http://user:secret@[::1", "'http://***@[::1' is not a valid URL"),  # the password never shown
    ("http://\u2603.net:1", "has a host name IDNA cannot write"),  # as httpx (IDNA 2008) refuses it: a traceback
    ("http://a\u200b.lan:1", "has a host name IDNA cannot write"),
]


def test_host_names_that_can_be_looked_up_are_taken() -> None:
    """The host check refuses no name a resolver takes: underscores, a trailing dot, addresses, IDNA names."""
    from localgen.remote.endpoints import base_url

    for host in ("my_host.lan", "example.com.", "10.0.0.5", "[::1]", "b\u00fccher.de", f"{'a' * 63}.com"):
        assert base_url(f"http://{host}:8000") == f"http://{host}:8000/v1"


@pytest.mark.parametrize(("url", "said"), BAD_URLS)
def test_an_endpoint_url_that_cannot_be_parsed_is_a_usage_error(cli_in_process: InProcessCLI, url: str,
                                                                said: str) -> None:
    r = cli_in_process("run", "--endpoint", url, "-m", "m", "-p", "hi")
    assert r.returncode == 2 and r.stderr.startswith("localgen: error: --endpoint") and said in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "secret" not in r.stderr


def _run_with_endpoints(cli: InProcessCLI, home: Path, url: str) -> tuple[Path, Any]:
    """`run -m box/m` with an endpoints.toml whose [box] has this url (removed after): its path and the result."""
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    toml = config / "endpoints.toml"
    toml.write_text(f'[box]\nurl = "{url}"\n')
    try:
        return toml, cli("run", "-m", "box/m", "-p", "hi")
    finally:
        toml.unlink()


def test_a_bad_url_from_the_variable_the_file_or_serve_is_a_usage_error(cli_in_process: InProcessCLI,
                                                                       home: Path) -> None:
    r = InProcessCLI({**cli_in_process.env, "LOCALGEN_ENDPOINT": "http://h:abc"})("run", "-m", "m", "-p", "hi")
    assert r.returncode == 2 and r.stderr == "localgen: error: LOCALGEN_ENDPOINT http://h:abc: the port must be 1 to " \
        "65535\n", r.stderr
    r = cli_in_process("serve", "--endpoint", "http://[::1")
    assert r.returncode == 2 and "'http://[::1' is not a valid URL" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    toml, r = _run_with_endpoints(cli_in_process, home, "http://127.0.0.1:99999")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{toml}: [box] url http://127.0.0.1:99999: the port must be 1 to 65535" in r.stderr, r.stderr


LONG_LABEL = f"http://{'a' * 64}.com"


@pytest.mark.parametrize("args", [("run", "-p", "hi"), ("serve", "--port", "18805"), ("bench", "-n", "4", "-p", "8")])
def test_a_host_name_that_cannot_be_looked_up_is_a_usage_error_everywhere(cli_in_process: InProcessCLI, home: Path,
                                                                          args: tuple[str, ...]) -> None:
    """An empty label or one over 63 characters: exit 2 naming where the URL came from, not the idna codec's
    traceback at the first connection (run without -m asks the server for its models first)."""
    r = cli_in_process(*args, "--endpoint", LONG_LABEL)
    assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: --endpoint: '{LONG_LABEL}' has a host name "
                                                     "with an empty label"), r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    toml, r = _run_with_endpoints(cli_in_process, home, "http://a..b:1")
    assert r.returncode == 2 and f"{toml}: [box] url: 'http://a..b:1' has a host name" in r.stderr, r.stderr
