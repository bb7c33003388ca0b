"""docs/remote.md's promises at the edges, against the fake OpenAI server (tests/fake_openai.py): a named endpoint
without `models`, an endpoints.toml that is not TOML at its end or not UTF-8, a bench whose every request fails,
a fan-out whose every endpoint is gone, --resume-from over blank input lines, and a server that never answers."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from localgen.errors import RemoteError
from localgen.remote.client import RemoteClient
from localgen.remote.endpoints import Endpoint
from localgen.types import GenerationRequest, SamplingParams
from tests.conftest import CLI
from tests.fake_openai import FakeServer


def test_a_named_endpoint_without_models_takes_the_servers_only_model(cli: CLI, fake: FakeServer,
                                                                       endpoints_toml: Path) -> None:
    """`-m NAME` of an entry with no `models`: the server's only model (from /v1/models), as --endpoint without -m."""
    endpoints_toml.write_text(f'[box]\nurl = "{fake.url}"\n')
    fake.requests.clear()
    r = cli("run", "-m", "box", "-p", "hi")
    assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr
    assert fake.requests[-1]["body"]["model"] == "plain"


def test_an_endpoints_file_broken_at_its_end_or_not_utf8_is_one_line_with_line_and_column(
        cli: CLI, fake: FakeServer, endpoints_toml: Path) -> None:
    endpoints_toml.write_text(f'[box]\nurl = "{fake.url}"\nmodels = ["plain"\n')
    r = cli("run", "-m", "box/plain", "-p", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{endpoints_toml}: Unclosed array (at end of document, line 4, column 1)" in r.stderr, r.stderr
    endpoints_toml.write_bytes(b'[box]\nurl = "http://h\xfft"\n')
    r = cli("run", "-m", "box/plain", "-p", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{endpoints_toml}: not UTF-8 text: byte 0xff (at line 2, column 16)" in r.stderr, r.stderr


def test_an_endpoints_file_an_editor_wrote_with_a_byte_order_mark_is_read(cli: CLI, fake: FakeServer,
                                                                          endpoints_toml: Path) -> None:
    """remote.md: endpoints.toml as Notepad saves it (a byte order mark, CRLF) names its endpoints; the mark was
    `Invalid statement (at line 1, column 1)`."""
    endpoints_toml.write_bytes(b"\xef\xbb\xbf" + f'[box]\r\nurl = "{fake.url}"\r\n'.encode())
    r = cli("run", "-m", "box", "-p", "hi")
    assert (r.returncode, r.stdout) == (0, "Hello world\n"), r.stderr


def test_a_bench_whose_every_request_fails_exits_1(cli: CLI, fake: FakeServer) -> None:
    """A busy server is not a usage error: one line, exit status 1 (docs/remote.md, Errors)."""
    r = cli("bench", "--endpoint", fake.url, "-m", "busy", "-npl", "1", "-p", "8", "-n", "4", "--num-prompts", "1",
            timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "localgen: error: every request failed: " in r.stderr and "busy (503)" in r.stderr, r.stderr


def test_when_every_endpoint_is_gone_no_line_is_said_to_be_moved_or_partial(cli: CLI, fake: FakeServer,
                                                                            tmp_path: Path) -> None:
    prompts = tmp_path / "in.txt"
    prompts.write_text("a\nb\nc\n")
    r = cli("run", "--file", str(prompts), "--endpoint", fake.url, "-m", "broken", "--json", "--stats")
    assert r.returncode == 1, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3] and all("text" not in d for d in docs)
    for d in docs:
        assert d["error"].startswith("every endpoint is gone (last: the stream from ") and "partial" not in d["error"]
    assert "moved" not in r.stderr and "3 failed" in r.stderr, r.stderr


def test_when_two_endpoints_are_gone_each_says_why_and_no_line_counts_as_moved(cli: CLI, tmp_path: Path) -> None:
    """A line taken back off one dead endpoint and failed on the other was counted as moved ("1 line moved off a
    failed one · 3 failed"), and `last:` named whichever died last by a race: each endpoint's reason is said, in
    the order they were given, and only a line another endpoint answered counts as moved."""
    ports = []
    for _ in range(2):  # two ports nothing listens on (bound, then closed): refused
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    prompts = tmp_path / "in.txt"
    prompts.write_text("a\nb\nc\n")
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    r = cli("run", "--file", str(prompts), "--endpoint", urls[0], "--endpoint", urls[1], "-m", "plain", "--json",
            "--stats", timeout=120)
    assert r.returncode == 1, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3], r.stdout
    for d in docs:
        error = d["error"]
        assert error.startswith("every endpoint is gone (") and "last:" not in error, error
        assert error.index(f"127.0.0.1:{ports[0]}") < error.index(f"127.0.0.1:{ports[1]}"), error
    assert "moved" not in r.stderr and "3 failed" in r.stderr, r.stderr


def _dead_url() -> str:
    """A loopback URL nothing listens on (a port bound, then closed): its connections are refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("spelling", ["flags", "comma", "env"])
def test_a_single_prompt_passes_a_dead_endpoint_over_for_the_next(cli: CLI, fake: FakeServer, spelling: str) -> None:
    """remote.md: a single prompt goes to the first endpoint that answers, the one passed over named on stderr; with
    -m and without (the model from the next endpoint's list). It went to the first alone: `cannot reach`, exit 1."""
    dead = _dead_url()
    where = {"flags": ["--endpoint", dead, "--endpoint", fake.url], "comma": ["--endpoint", f"{dead},{fake.url}"],
             "env": []}[spelling]
    run = CLI({**cli.env, "LOCALGEN_ENDPOINT": f"{dead} {fake.url}"}) if spelling == "env" else cli
    for model in (["-m", "plain"], []):
        r = run("run", *where, *model, "-p", "hi")
        assert (r.returncode, r.stdout) == (0, "Hello world\n"), r.stderr
        host = dead.removeprefix("http://")
        assert f"warning: cannot reach {host}" in r.stderr, r.stderr
        assert f"asking {fake.url.removeprefix('http://').split('/')[0]} instead" in r.stderr, r.stderr


def test_a_chats_turns_go_on_at_the_endpoint_that_answered(cli: CLI, fake: FakeServer) -> None:
    """The endpoint passed over is named once: the second turn starts at the one that answered the first."""
    dead = _dead_url()
    r = cli("chat", "--endpoint", dead, "--endpoint", fake.url, "-m", "plain", input="hi\nagain\n")
    assert (r.returncode, r.stdout) == (0, "Hello world\nHello world\n"), r.stderr
    assert r.stderr.count(f"cannot reach {dead.removeprefix('http://')}") == 1, r.stderr


def test_a_single_prompt_whose_every_endpoint_is_dead_says_the_last_ones_error(cli: CLI) -> None:
    first, second = _dead_url(), _dead_url()
    r = cli("run", "--endpoint", first, "--endpoint", second, "-m", "plain", "-p", "hi")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"warning: cannot reach {first.removeprefix('http://')}"), r.stderr
    assert lines[-1].startswith(f"localgen: error: cannot reach {second.removeprefix('http://')}"), r.stderr


def test_resume_from_appends_a_blank_lines_record_once(cli: CLI, fake: FakeServer, tmp_path: Path) -> None:
    """A blank input line's `{"line": N}` counts as answered: resuming twice with `>>` adds nothing."""
    prompts = tmp_path / "in.txt"
    prompts.write_text("a\n\nb\n")
    out = tmp_path / "out.jsonl"
    args = ("run", "--file", str(prompts), "--endpoint", fake.url, "-m", "plain", "--json", "--resume-from", str(out))
    for _ in range(3):
        with open(out, "a") as sink:
            p = cli.popen(*args, stdout=sink, stderr=subprocess.PIPE, text=True)
            _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert [json.loads(x)["line"] for x in out.read_text().splitlines()] == [1, 2, 3]
    fresh = cli(*args)
    assert fresh.returncode == 0 and fresh.stdout == out.read_text(), "`>` a new file copies the same lines"


def test_a_server_that_never_answers_is_an_endpoint_gone() -> None:
    """A server that takes the connection and sends nothing: after the read timeout (10 minutes, here less) the
    endpoint is down, so run --file moves its lines (docs/remote.md)."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        port = hung.getsockname()[1]
        assert RemoteClient(Endpoint(f"http://127.0.0.1:{port}/v1"), "m").http.timeout.read == 600.0
        client = RemoteClient(Endpoint(f"http://127.0.0.1:{port}/v1"), "m", timeout=0.5)
        request = GenerationRequest(messages=({"role": "user", "content": "hi"},), sampling=SamplingParams())
        try:
            with pytest.raises(RemoteError) as e:
                client.open(request, 1)
        finally:
            client.close()
    assert e.value.down and "did not answer in time" in e.value.message


def test_a_fan_out_whose_reader_goes_away_ends_quietly(cli: CLI, fake: FakeServer, tmp_path: Path) -> None:
    """`run --file ... --endpoint ... | head -1`: the workers that print the answers stop, with no traceback."""
    prompts = tmp_path / "in.txt"
    prompts.write_text("hi\n" * 300)
    argv = " ".join(cli.argv("run", "--file", str(prompts), "--endpoint", fake.url, "-m", "plain", "-np", "4"))
    r = subprocess.run(["bash", "-c", f"{argv} | head -1; exit ${{PIPESTATUS[0]}}"], env=cli.env, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout == "Hello world\n", r.stdout
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr


def _silent_endpoint(begins: bool) -> tuple[socket.socket, str]:
    """A server that, with `begins`, streams three pieces of an answer and then sends nothing more (gone silent
    mid-answer); without, takes the request and never answers it. The listening socket and its URL."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []  # the connections, open until the listener closes

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                break
            held.append(conn)
            conn.recv(65536)  # the request (small enough to come whole)
            if begins:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(
                    b'data: {"choices": [{"index": 0, "delta": {"content": "tok%d "}}]}\n\n' % i for i in range(3)))

    threading.Thread(target=answer, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@pytest.mark.parametrize("begins", [True, False], ids=["silent-mid-answer", "never-answers"])
def test_one_ctrl_c_stops_a_chat_answer_whose_endpoint_went_silent(cli: CLI, begins: bool) -> None:
    """chat.md: Ctrl-C during an answer stops it at once. On a terminal, a remote chat's answer whose server went
    silent mid-stream (or never began) waited for the next piece: the first press did nothing (until the 10-minute
    silence limit), only a second stopped it. One press now keeps what came (or takes the message back), and the
    chat goes on."""
    import signal
    import sys
    import time

    import pexpect

    from tests.test_user_processes import cooked

    listener, url = _silent_endpoint(begins)
    child = pexpect.spawn(str(Path(sys.executable).parent / "localgen"), ["chat", "--endpoint", url, "-m", "m"],
                          env=cli.env, encoding="utf-8", timeout=60, dimensions=(40, 120))
    try:
        child.expect_exact(">>>")
        child.sendline("hello")
        cooked(child)  # Enter taken: Ctrl-C is a signal now
        if begins:
            child.expect_exact("tok2")
        else:  # a SIGTERM too (chat.md: as Ctrl-C, then the chat ends by it): it waited out the 10 minutes
            term = pexpect.spawn(str(Path(sys.executable).parent / "localgen"), ["chat", "--endpoint", url, "-m",
                                 "m"], env=cli.env, encoding="utf-8", timeout=60, dimensions=(40, 120))
            try:
                term.expect_exact(">>>")
                term.sendline("hello")
                cooked(term)
                time.sleep(1)  # the request sent, no answer begun
                term.kill(signal.SIGTERM)
                term.expect(pexpect.EOF, timeout=20)
            finally:
                term.close(force=True)
            assert term.signalstatus == signal.SIGTERM or term.exitstatus == 143, (term.signalstatus, term.exitstatus)
        child.sendcontrol("c")
        child.expect_exact("(stopped; the partial answer is kept)" if begins else
                           "(stopped before the answer began; the message was taken back)", timeout=20)
        child.expect_exact(">>>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close()
        listener.close()
    assert child.exitstatus == 0, child.before
