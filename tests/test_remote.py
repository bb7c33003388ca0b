"""Remote endpoints: the protocol's edges against a fake OpenAI server, then `run`, `chat`, `bench` and
`run --file` fan-out (with a server killed mid-batch, and --resume-from) against two real `localgen serve`
processes on loopback."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLI, ROOT, SAFETY_NET_S, assert_same_greedy_text
from tests.fake_openai import FakeServer, GatheringServer, StrictServer
from tests.test_batch import FILE_LINE_ONLY, NOT_PER_LINE
from tests.test_serve import Server


def _run(cli: CLI, fake: FakeServer, model: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("run", "--endpoint", fake.url, "-m", model, "-p", "hi", *args, timeout=60)


def test_keep_alive_comments_role_chunk_and_no_usage(cli: CLI, fake: FakeServer) -> None:
    r = _run(cli, fake, "plain", "--json", "--stats")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["text"] == "Hello world" and doc["finish_reason"] == "stop"
    assert doc["stats"]["completion_tokens"] == 2, "without a usage chunk, the pieces are counted"
    assert doc["stats"]["ttft_s"] is not None and "inter-token p50" in r.stderr
    assert doc["stats"]["load_s"] == 0 and " load " not in r.stderr, r.stderr  # the server's load: not known here
    assert doc["model"]["endpoint"] == [f"{fake.url}/v1"]
    r = _run(cli, fake, "usage", "--json")
    doc = json.loads(r.stdout)
    assert doc["stats"]["prompt_tokens"] == 7 and doc["stats"]["cached_tokens"] == 3
    assert doc["server_timings"]["prompt_per_second"] == 100.0
    plain = _run(cli, fake, "plain")
    assert plain.stdout == "Hello world\n" and plain.stderr == ""


def test_a_server_that_refuses_stream_options_gets_the_request_without_them(cli: CLI, tmp_path: Path) -> None:
    """A server that refuses stream_options (a 400 naming it) is asked again without it, once per run: the answer
    comes as ever, its tokens counted from the pieces (no usage), and that request is not one of the tries a busy
    server gets."""
    strict = StrictServer()
    try:
        r = _run(cli, strict, "plain", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["text"] == "Hello world" and doc["stats"]["completion_tokens"] == 2, doc
        assert [m["body"].get("stream_options") for m in strict.requests] == [{"include_usage": True}, None]
        strict.requests.clear()
        lines = tmp_path / "in.txt"
        lines.write_text("a\nb\nc\n")
        r = cli("run", "--file", str(lines), "--json", "--endpoint", strict.url, "-m", "plain", "-np", "1", timeout=60)
        assert r.returncode == 0 and [json.loads(x)["text"] for x in r.stdout.splitlines()] == ["Hello world"] * 3
        assert [m["body"].get("stream_options") for m in strict.requests] == [{"include_usage": True}] + [None] * 3
        r = _run(cli, strict, "picky")
        assert r.returncode == 1 and "rejected the request (400): temperature must be at most 2" in r.stderr, r.stderr
        # the request sent again without stream_options is not one of a busy server's five tries (docs/remote.md)
        strict.requests.clear()
        r = _run(cli, strict, "busy")
        assert r.returncode == 1 and "busy (503) after 5 tries" in r.stderr, r.stderr
        assert [m["body"].get("stream_options") for m in strict.requests] == [{"include_usage": True}] + [None] * 5
    finally:
        strict.stop()


def test_a_file_runs_four_requests_at_once_on_an_endpoint_unless_parallel_says(cli: CLI, tmp_path: Path) -> None:
    """run --file --endpoint without --parallel keeps 4 requests in flight on the endpoint (docs/remote.md, Fan-out);
    --parallel N keeps N; the answers in input order either way."""
    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"q{i}\n" for i in range(8)))
    for flags, most in (((), 4), (("-np", "2"), 2)):
        gathering = GatheringServer(target=most)
        try:
            r = cli("run", "--file", str(lines), "--json", "--endpoint", gathering.url, "-m", "plain", *flags,
                    timeout=120)
            assert r.returncode == 0, r.stderr
            answers = [json.loads(x) for x in r.stdout.splitlines()]
            assert [a["line"] for a in answers] == list(range(1, 9)) and {a["text"] for a in answers} == {"Hello world"}
            assert gathering.most == most, (flags, gathering.most)
        finally:
            gathering.stop()


def test_request_carries_the_flags_and_schema(cli: CLI, fake: FakeServer) -> None:
    fake.requests.clear()
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    r = _run(cli, fake, "plain", "--temperature", "0.3", "--top-k", "5", "--seed", "42", "-n", "9", "--stop", "END",
             "--json-schema", schema, "--system", "Be brief.")
    assert r.returncode == 0, r.stderr
    body = fake.requests[-1]["body"]
    assert body["temperature"] == 0.3 and body["top_k"] == 5 and body["seed"] == 42 and body["max_tokens"] == 9
    assert body["stop"] == ["END"] and body["stream"] is True
    assert body["response_format"]["json_schema"]["schema"] == json.loads(schema)
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_a_setting_left_alone_is_the_servers_and_the_seed_is_always_sent(cli: CLI, fake: FakeServer,
                                                                          tmp_path: Path) -> None:
    """docs/remote.md: a setting you leave alone takes the server's default (temperature included: vLLM's and
    OpenAI's is 1.0, not localgen's 0.8), and one you set is sent, even at localgen's default (a flag, chat's
    /set, a JSON line's own); the seed is always sent, and --json reports it, to repeat the run."""
    fake.requests.clear()
    r = _run(cli, fake, "plain", "--json")
    assert r.returncode == 0, r.stderr
    body = fake.requests[-1]["body"]
    assert set(body) == {"model", "stream", "stream_options", "seed", "messages"}, body
    assert body["seed"] == json.loads(r.stdout)["seed"]
    r = _run(cli, fake, "plain", "--temperature", "0")
    assert fake.requests[-1]["body"]["temperature"] == 0
    r = _run(cli, fake, "plain", "--temperature", "0.8")
    assert fake.requests[-1]["body"]["temperature"] == 0.8, "typed at localgen's default: sent"
    r = cli("chat", "--endpoint", fake.url, "-m", "plain", input="hi\n/set temperature 0.8\nhi\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "temperature" not in fake.requests[-2]["body"] and fake.requests[-1]["body"]["temperature"] == 0.8
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"prompt": "hi", "temperature": 0.8}\n{"prompt": "hi"}\n')
    r = cli("run", "--endpoint", fake.url, "-m", "plain", "--file", str(lines), "-np", "1", timeout=60)
    assert r.returncode == 0, r.stderr
    assert [b["body"].get("temperature") for b in fake.requests[-2:]] == [0.8, None]


def test_json_sampling_is_what_was_sent_and_nothing_else(cli: CLI, fake: FakeServer) -> None:
    """docs/remote.md: `run --endpoint --json`'s `sampling` has the settings sent, by localgen's names, as sent,
    and nothing of the ones left to the server (its defaults, which it does not say)."""
    fake.requests.clear()
    r = _run(cli, fake, "plain", "--json", "--temperature", "0.3", "--top-k", "40", "-n", "9", "--mirostat", "2",
             "--logit-bias", "15043-1")
    assert r.returncode == 0, r.stderr
    body, doc = fake.requests[-1]["body"], json.loads(r.stdout)
    assert doc["sampling"] == {"seed": doc["seed"], "temperature": 0.3, "top_k": 40, "max_tokens": 9, "mirostat": 2,
                               "mirostat_lr": 0.1, "mirostat_ent": 5.0, "logit_bias": {"15043": -1.0}}, doc["sampling"]
    assert body["seed"] == doc["seed"] and body["logit_bias"] == {"15043": -1.0}
    r = _run(cli, fake, "plain", "--json")
    assert json.loads(r.stdout)["sampling"] == {"seed": fake.requests[-1]["body"]["seed"]}


def test_a_file_line_in_json_carries_the_fields_of_a_single_remote_run(cli: CLI, fake: FakeServer,
                                                                         tmp_path: Path) -> None:
    """docs/run.md: a --file --json line holds what one `run --json` object holds (test_batch's sets), from an
    endpoint too: the settings sent, the endpoint's stats and the server's timings."""
    r = _run(cli, fake, "usage", "--json", "--seed", "5", "--top-k", "9")
    assert r.returncode == 0, r.stderr
    alone = json.loads(r.stdout)
    lines = tmp_path / "in.txt"
    lines.write_text('hi\n{"prompt": "hi", "temperature": 0.5}\n')
    r = cli("run", "--file", str(lines), "--endpoint", fake.url, "-m", "usage", "--json", "--seed", "5", "--top-k", "9",
            timeout=60)
    assert r.returncode == 0, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    for doc in docs:
        assert set(doc) - FILE_LINE_ONLY == set(alone) - NOT_PER_LINE, doc
        assert doc["model"] == alone["model"] and doc["load"] == alone["load"] == {"remote": True}
        assert doc["server_timings"] == alone["server_timings"] and doc["stats"] == alone["stats"] | {
            k: doc["stats"][k] for k in ("ttft_s", "total_s", "itl_p50_ms", "itl_p99_ms", "decode_tps")}
    assert docs[0]["sampling"] == alone["sampling"] == {"seed": 5, "top_k": 9}
    assert docs[1]["sampling"] == {"seed": 6, "top_k": 9, "temperature": 0.5}


def test_a_429_is_retried_and_a_busy_server_is_reported(cli: CLI, fake: FakeServer) -> None:
    fake.busy_once_seen = 0
    r = _run(cli, fake, "busy-once")
    assert r.returncode == 0 and r.stdout == "Hello world\n" and fake.busy_once_seen == 2
    r = _run(cli, fake, "busy")
    assert r.returncode == 1 and "busy (503) after 5 tries" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize(("model", "message"), [
    ("error-mid", "reported an error mid-answer: the GPU fell over"),
    ("broken", "the answer is partial"),
    ("garbage-after", "sent something that is not JSON: 'this is not json'"),
    ("number-after", "sent non-text content: 42"),
])
def test_a_stream_that_fails_mid_answer_is_reported_as_partial(cli: CLI, fake: FakeServer, model: str,
                                                               message: str) -> None:
    r = _run(cli, fake, model)
    assert r.returncode == 1 and r.stdout == "Hel\n", "what arrived stays on stdout"
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "1 piece" in r.stderr and "the answer is partial" in r.stderr, "docs/remote.md: the error says so"
    r = _run(cli, fake, model, "--json")
    assert r.returncode == 1 and json.loads(r.stdout) == {"text": "Hel", "partial": True,
                                                          "error": r.stderr.split("error: ", 1)[1].strip()}


def test_n_caps_the_answer_of_a_server_that_ignores_max_tokens(cli: CLI, fake: FakeServer) -> None:
    """A server that streams without end whatever max_tokens says: -n stops the answer here, as in a local run,
    with finish_reason "length" (a piece of the stream taken for a token), and bench -n finishes."""
    r = _run(cli, fake, "endless", "-n", "16")
    assert r.returncode == 0 and r.stdout == "tok " * 16 + "\n" and r.stderr == "", r.stderr
    r = _run(cli, fake, "endless", "-n", "16", "--json")
    doc = json.loads(r.stdout)
    assert doc["text"] == "tok " * 16 and doc["finish_reason"] == "length" and doc["stats"]["completion_tokens"] == 16
    r = cli("bench", "--endpoint", fake.url, "-m", "endless", "-n", "4", "-p", "8", "-npl", "1", "--num-prompts", "2",
            timeout=60)
    assert r.returncode == 0 and "| endless | 1 | inf | 2 |" in r.stdout, r.stderr


def test_a_key_the_server_repeats_in_its_answer_is_scrubbed(cli_env: dict[str, str], fake: FakeServer) -> None:
    """The key, cut in two between pieces, is *** on stdout and in --json, as serve --endpoint passes it on."""
    key = "supersecretkey1234567890"
    for json_out in ((), ("--json",)):
        r = CLI({**cli_env, "LOCALGEN_TEST_KEY": key})("run", "--endpoint", fake.url, "-m", "echo-key", "-p", "hi",
                                                      "--api-key-env", "LOCALGEN_TEST_KEY", *json_out, timeout=60)
        assert r.returncode == 0 and key[:5] not in r.stdout and key[5:] not in r.stdout, r.stdout
        text = json.loads(r.stdout)["text"] if json_out else r.stdout
        assert text.rstrip("\n") == "your key is *** ok"


def test_ctrl_c_closes_the_stream_with_130(cli: CLI, fake: FakeServer) -> None:
    p = cli.popen("run", "--endpoint", fake.url, "-m", "slow", "-p", "hi", stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(10)  # streaming now
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 130
    err = p.stderr.read().decode()
    assert "interrupted" in err and "Traceback" not in err


def test_chat_keeps_a_partial_answer_and_takes_back_a_refused_turn(cli: CLI, fake: FakeServer, home: Path) -> None:
    r = cli("chat", "remote-partial", "--endpoint", fake.url, "-m", "error-mid", input="hello\n")
    assert r.returncode == 1 and "the partial answer is kept" in r.stderr and r.stderr.count("\n") == 1
    saved = json.loads(next(home.rglob("remote-partial.json")).read_text())
    assert [(m["role"], m["content"]) for m in saved["messages"]] == [("user", "hello"), ("assistant", "Hel")]
    r = cli("chat", "--resume", "remote-partial", "--endpoint", fake.url, "-m", "busy", input="again\n")
    assert r.returncode == 1 and "busy (503)" in r.stderr
    saved = json.loads(next(home.rglob("remote-partial.json")).read_text())
    assert len(saved["messages"]) == 2, "the refused turn was taken back"


def test_bad_answers_and_addresses_are_one_line_errors(cli: CLI, fake: FakeServer) -> None:
    cases = [
        (_run(cli, fake, "garbage"), "not JSON"),
        (_run(cli, fake, "html"), "not an OpenAI stream"),
        (cli("run", "--endpoint", "http://127.0.0.1:1", "-m", "x", "-p", "hi"),  # in words, not [Errno 111] ...
         "cannot reach 127.0.0.1:1: connection refused\n"),
        (cli("run", "--endpoint", fake.url.replace("http:", "https:"), "-m", "x", "-p", "hi"), "TLS failed"),
        # a 404's hint names the endpoint's list (it said `curl URL/models`, the word URL itself)
        (cli("run", "--endpoint", f"{fake.url}/nowhere", "-m", "x", "-p", "hi"),
         f"(see its models with: curl {fake.url}/nowhere/models)"),
    ]
    for r, message in cases:
        assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    for args, message in [
        (("--draft", "x"), "--draft cannot be used with a remote endpoint"),
        (("--beams", "2"), "--beams cannot be used"),
        (("-t", "2"), "--threads cannot be used"),
        (("-ngl", "0"), "--gpu-layers cannot be used"),  # 0, equal to False, was dropped unsaid
        (("-mg", "0"), "--main-gpu cannot be used"),
        (("--n-cpu-moe", "0"), "--n-cpu-moe cannot be used"),
        (("--no-repack",), "--no-repack cannot be used"),  # False, as 0: dropped unsaid
        (("--api-key-env", "LOCALGEN_TEST_UNSET"), "LOCALGEN_TEST_UNSET is not set"),
    ]:
        r = _run(cli, fake, "plain", *args)
        assert r.returncode == 2 and message in r.stderr, r.stderr
    r = cli("run", "--endpoint", "ftp://x", "-p", "hi")
    assert r.returncode == 2 and "http:// or https://" in r.stderr


def test_the_key_goes_only_where_the_user_said(cli: CLI, cli_env: dict[str, str], fake: FakeServer) -> None:
    other = FakeServer()
    try:
        env = {**cli_env, "OPENAI_API_KEY": "sk-implicit", "MY_KEY": "sk-mine"}
        fake.requests.clear()
        subprocess.run(CLI(env).argv("run", "--endpoint", fake.url, "-m", "plain", "-p", "hi"), env=env,
                       capture_output=True, timeout=60)
        assert "authorization" not in fake.requests[-1]["headers"], "no implicit OPENAI_API_KEY"
        subprocess.run(CLI(env).argv("run", "--endpoint", fake.url, "-m", "plain", "-p", "hi", "--api-key-env",
                                     "MY_KEY"), env=env, capture_output=True, timeout=60)
        assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-mine"
        fake.redirect_to = other.url
        r = subprocess.run(CLI(env).argv("run", "--endpoint", fake.url, "-m", "redirect", "-p", "hi",
                                         "--api-key-env", "MY_KEY"), env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "does not follow redirects" in r.stderr and not other.requests
    finally:
        other.stop()


def test_named_endpoints_from_the_config(cli: CLI, fake: FakeServer, home: Path) -> None:
    config = home / "config"  # LOCALGEN_HOME/config (paths.config_dir)
    config.mkdir(parents=True, exist_ok=True)
    (config / "endpoints.toml").write_text(f'[box]\nurl = "{fake.url}"\nmodels = ["plain", "usage"]\n')
    try:
        r = cli("run", "-m", "box/usage", "-p", "hi")
        assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr
        r = cli("run", "-m", "box", "-p", "hi")
        assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr
        r = cli("run", "-m", "box/other", "-p", "hi")
        assert r.returncode == 2 and "box serves plain, usage" in r.stderr
    finally:
        (config / "endpoints.toml").unlink()


def test_only_the_endpoint_chosen_is_read_from_the_config(cli: CLI, cli_env: dict[str, str], fake: FakeServer,
                                                          home: Path) -> None:
    """An entry of endpoints.toml whose key variable is unset stops only a run that names that entry (and says
    which entry names it); a local model runs whatever the file holds, with a warning where it is not TOML."""
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    toml = config / "endpoints.toml"
    toml.write_text(f'[box]\nurl = "{fake.url}"\napi_key_env = "LOCALGEN_TEST_BOX_KEY"\n'
                    f'[keyless]\nurl = "{fake.url}"\n[junk]\nurl = 3\n')
    env = dict(cli_env)  # LOCALGEN_* variables are not passed on: the key is unset
    try:
        r = cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2", "--temp", "0")
        assert r.returncode == 0 and r.stdout.strip() and r.stderr == "", r.stderr
        fake.requests.clear()
        r = cli("run", "-m", "keyless/plain", "-p", "hi")
        assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr
        assert "authorization" not in fake.requests[-1]["headers"]
        r = subprocess.run(CLI(env).argv("run", "-m", "box/plain", "-p", "hi"), env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--api-key-env" not in r.stderr, r.stderr
        assert f'{toml}: [box] api_key_env = "LOCALGEN_TEST_BOX_KEY", and the variable' in r.stderr, r.stderr
        env["LOCALGEN_TEST_BOX_KEY"] = "sk-box"
        r = subprocess.run(CLI(env).argv("run", "-m", "box/plain", "-p", "hi"), env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and fake.requests[-1]["headers"]["authorization"] == "Bearer sk-box", r.stderr
        toml.write_text(f'[box\nurl = "{fake.url}"\n')
        r = cli("run", "-m", "smollm2:135m", "-p", "hi", "-n", "2", "--temp", "0")
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
        assert r.stderr.startswith(f"warning: {toml} is not valid TOML (") and "line 1" in r.stderr, r.stderr
        r = cli("bench", "-m", "smollm2:135m", "-p", "0", "-n", "1", "-r", "1", "-o", "json")  # local bench too
        assert r.returncode == 0 and r.stderr.startswith(f"warning: {toml} is not valid TOML ("), r.stderr
        r = cli("run", "-m", "box/plain", "-p", "hi")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"{toml}: " in r.stderr, r.stderr
        assert "(at line 1, column 5)" in r.stderr, r.stderr
    finally:
        toml.unlink()


def test_a_line_on_an_endpoint_that_dies_goes_to_one_still_up(cli: CLI, fake: FakeServer, tmp_path: Path) -> None:
    """docs/remote.md: a failed endpoint's in-flight lines go to the others, even when the others have run out of
    lines to take meanwhile; only when every endpoint is gone does a line fail. And --stats counts in English."""
    dying = socket.socket()
    dying.bind(("127.0.0.1", 0))
    dying.listen()
    fake_asked: list[int | None] = [len(fake.requests)]  # before the run beside it; None: the dead one alone

    def hang_up() -> None:  # takes each request, then drops the connection without an answer
        while True:
            try:
                conn, _ = dying.accept()
            except OSError:
                return
            deadline = time.monotonic() + 30
            while fake_asked[0] is not None and len(fake.requests) == fake_asked[0] and time.monotonic() < deadline:
                time.sleep(0.01)  # the other endpoint has its line: it answers it and finds none left...
            time.sleep(0.5)  # ...by then (a two-chunk answer from a loopback fake)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    dead = f"http://127.0.0.1:{dying.getsockname()[1]}"
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "hi"}\n')
    try:
        r = cli("run", "--file", str(prompts), "--endpoint", dead, "--endpoint", fake.url, "-m", "plain", "-np", "1",
                "--stats", timeout=60)
        assert r.returncode == 0 and r.stdout == "Hello world\n" * 2, r.stderr
        assert "2 endpoints, 1 line moved off a failed one" in r.stderr, r.stderr
        fake_asked[0] = None
        r = cli("run", "--file", str(prompts), "--endpoint", dead, "-m", "plain", "--json", timeout=60)
        docs = [json.loads(x) for x in r.stdout.splitlines()]
        assert r.returncode == 1 and [d["line"] for d in docs] == [1, 2], r.stderr
        assert all(d["error"].startswith("every endpoint is gone (last: ") for d in docs), docs
        prompts.write_text('{"prompt": "hi"}\n')
        r = cli("run", "--file", str(prompts), "--endpoint", fake.url, "-m", "plain", "--stats", timeout=60)
        assert r.stderr.startswith("1 prompt · 2 tokens generated"), r.stderr
    finally:
        dying.close()


def test_a_malformed_chunk_fails_its_line_and_the_others_go_on(cli: CLI, fake: FakeServer, tmp_path: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "hi"}\n{"prompt": "hi"}\n')
    r = cli("run", "--file", str(prompts), "--endpoint", fake.url, "-m", "bad-delta-once", "-np", "2", "--json",
            timeout=60)
    docs = sorted((json.loads(x) for x in r.stdout.splitlines()), key=lambda d: "error" not in d)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "sent a malformed delta" in docs[0]["error"] and docs[1]["text"] == "Hello world", docs


# ---- two real servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two(cli_env: dict[str, str]) -> Iterator[tuple[Server, Server]]:
    # --exact: a line's greedy answer must not depend on which endpoint, or which neighbours, it gets
    a = Server(cli_env, "-np", "2", "-t", "1", "--ctx", "1024", "--exact")
    b = Server(cli_env, "-np", "2", "-t", "1", "--ctx", "1024", "--exact")
    yield a, b
    for s in (a, b):
        if s.proc.poll() is None:
            s.stop()


def _lines(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"Say something about the number {i}.", "max_tokens": 12,
                                        "temperature": 0}) + "\n" for i in range(1, n + 1)))


def test_run_chat_and_bench_against_a_server(cli: CLI, two: tuple[Server, Server]) -> None:
    a, _ = two
    local = cli("run", "-p", "The capital of Italy is", "--raw", "-n", "12", "--temperature", "0", "--ctx", "1024")
    remote = cli("run", "--endpoint", a.url, "-p", "The capital of Italy is", "--raw", "-n", "12",
                 "--temperature", "0", "--stats")
    assert remote.returncode == 0 and remote.stdout == local.stdout, "greedy over HTTP is the local answer"
    assert "first token" in remote.stderr and "inter-token" in remote.stderr
    r = cli("chat", "remote-chat", "--endpoint", a.url, "--temperature", "0", "-n", "8",
            input="My name is Ann.\nWhat is my name?\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = cli("chat", "--resume", "remote-chat", "--endpoint", a.url, "-n", "8", input="Thanks.\n")
    assert r.returncode == 0
    saved = json.loads(next((Path(cli.env["LOCALGEN_HOME"])).rglob("remote-chat.json")).read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 3
    r = cli("bench", "--endpoint", a.url, "-npl", "1,2", "--request-rate", "50,inf", "--num-prompts", "2", "-p", "16",
            "-n", "8", "-o", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [(x["n_parallel"], x["request_rate"]) for x in recs] == [(1, "50"), (1, "inf"), (2, "50"), (2, "inf")]
    assert all(x["client_side"] and x["requests"] == 2 and x["backends"] == "remote" for x in recs)
    assert all(x["avg_ts"] > 0 and x["ttft_ms"] > 0 and x["e2e_p99_ms"] >= x["e2e_p50_ms"] for x in recs)
    hist = cli("bench", "history")
    run_id = hist.stdout.splitlines()[1].split()[0]
    assert "client-side figures" in cli("bench", "history", run_id).stdout


def test_chat_model_switch_to_a_name_the_server_does_not_serve_is_refused(cli: CLI,
                                                                          two: tuple[Server, Server]) -> None:
    """`/model TYPO` in a chat --endpoint was taken unchecked and saved: the next turn was a 404, and so was every
    turn of `chat --resume` after. It is refused now, naming what the server serves, and the chat keeps its model;
    a name it serves still switches."""
    a, _ = two
    r = cli("chat", "remote-switch", "--endpoint", a.url, "-n", "4", input="Hi.\n/model nosuch\nAgain.\n")
    assert r.returncode == 1, r.stderr
    assert "does not serve 'nosuch' (it serves smollm2:135m, gemma3:270m" in r.stderr, r.stderr  # (+ presets)
    saved = json.loads(next((Path(cli.env["LOCALGEN_HOME"])).rglob("remote-switch.json")).read_text())
    assert saved["model"] == "smollm2:135m" and [m["role"] for m in saved["messages"]] == ["user", "assistant"]
    r = cli("chat", "--resume", "remote-switch", "--endpoint", a.url, "-n", "4", input="/model gemma3:270m\n")
    assert r.returncode == 0, r.stderr
    saved = json.loads(next((Path(cli.env["LOCALGEN_HOME"])).rglob("remote-switch.json")).read_text())
    assert saved["model"] == "gemma3:270m" and len(saved["messages"]) == 2


def test_fan_out_keeps_order_and_survives_a_dead_server(cli: CLI, two: tuple[Server, Server],
                                                        tmp_path: Path) -> None:
    a, b = two
    prompts = tmp_path / "in.jsonl"
    _lines(prompts, 12)
    before = [s.health()["rows"] for s in (a, b)]
    first = cli("run", "--file", str(prompts), "--endpoint", a.url, "--endpoint", b.url, "-np", "2", "--json")
    assert first.returncode == 0, first.stderr
    docs = [json.loads(x) for x in first.stdout.splitlines()]
    assert [d["line"] for d in docs] == list(range(1, 13)) and all("error" not in d for d in docs)
    assert all(s.health()["rows"] > n for s, n in zip((a, b), before, strict=True)), "both endpoints took lines"

    # kill one server while lines are in flight: nothing is lost, the same answers come back
    _lines(prompts, 12)
    proc = cli.popen("run", "--file", str(prompts), "--endpoint", a.url, "--endpoint", b.url, "-np", "2", "--json",
                     "--stats", stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)  # no read-ahead:
    # communicate() reads the pipe itself, so lines buffered by readline() would be missed
    assert proc.stdout is not None
    got = [proc.stdout.readline()]
    # b dies with both its slots busy: even if one line ends in the moment before the kill, one is in flight
    deadline = time.monotonic() + 600  # a safety net; the wait is for b to be generating
    while (busy := b.health()["running"]) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert busy == 2, "b has lines in flight when it dies"
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(60)
    out, err = proc.communicate(timeout=900)
    got += out.decode().splitlines(keepends=True)
    assert proc.returncode == 0, err.decode()
    moved = re.search(r"(\d+) lines moved off a failed one", err.decode())
    assert moved and int(moved.group(1)) >= 1, f"the lines b had were retried on a: {err.decode()}"
    again = [json.loads(x) for x in got]
    assert [d["line"] for d in again] == list(range(1, 13)) and all("error" not in d for d in again)
    assert_same_greedy_text([d["text"] for d in again], [d["text"] for d in docs],
                            "greedy answers do not depend on the endpoint")

    # with every endpoint gone, the lines fail one by one and the exit status is 1
    dead = cli("run", "--file", str(prompts), "--endpoint", b.url, "--json", timeout=60)
    assert dead.returncode == 1 and all("every endpoint is gone" in json.loads(x)["error"]
                                        for x in dead.stdout.splitlines())


@pytest.mark.parametrize("gpu", [False, True])
def test_greedy_texts_from_two_paths_must_agree_or_on_a_gpu_begin_alike(monkeypatch: pytest.MonkeyPatch,
                                                                       gpu: bool) -> None:
    from localgen.native import devices

    monkeypatch.setattr(devices, "has_gpu", lambda: gpu)
    same = "The number 3 is a prime number, the second"
    late = "The number 3 is a prime number, and odd"  # a near tie some tokens in
    soon = "The answer is three"  # a near tie at the second word (SmolLM2 on an H200 gave such)
    assert_same_greedy_text([same], [same], "same")
    for early in ("A prime, 3 is the second", "", " The number 3"):
        with pytest.raises(AssertionError):
            assert_same_greedy_text([early], [same], "an answer that differs from its first word")
    if gpu:
        assert_same_greedy_text([late], [same], "a near tie after the first tokens")
        assert_same_greedy_text([soon], [same], "a near tie after the first word")
        assert_same_greedy_text([soon, late, same], [same] * 3, "one of three parting early")
        with pytest.raises(AssertionError):  # most must begin alike: two of three parting that early is no tie
            assert_same_greedy_text([soon, soon, same], [same] * 3, "two of three parting early")
        assert_same_greedy_text(["Yes"], ["Yes"], "a short answer must be whole")
        with pytest.raises(AssertionError):
            assert_same_greedy_text(["Ye"], ["Yes"], "a short answer must be whole")
    else:
        for near in (late, soon):
            with pytest.raises(AssertionError):
                assert_same_greedy_text([near], [same], "on a CPU the paths are bit-identical")


def test_resume_from_a_crash_that_cut_a_character_in_two(cli: CLI, tmp_path: Path) -> None:
    """A crash can end the output mid-character (answers are written as UTF-8, not \\u escapes): the torn line
    runs again, and with `>>` it stays in the file as it was, ended, with the rest after it (docs/remote.md)."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "max_tokens": 3}\n{"prompt": "Say yes.", "max_tokens": 3}\n')
    full = cli("run", "--file", str(prompts), "--json", "--seed", "3", "--temperature", "0")
    assert full.returncode == 0, full.stderr
    out = tmp_path / "out.jsonl"
    torn = b'{"line": 2, "text": "caf' + "é".encode()[:1]
    out.write_bytes(full.stdout.splitlines(keepends=True)[0].encode() + torn)
    with open(out, "a") as sink:
        r = cli.popen("run", "--file", str(prompts), "--json", "--seed", "3", "--temperature", "0", "--resume-from",
                      str(out), "--stats", stdout=sink, stderr=subprocess.PIPE, text=True)
        _, err = r.communicate(timeout=600)
    assert r.returncode == 0 and "1 already answered" in err, err
    lines = out.read_bytes().splitlines()
    assert lines[1] == torn and len(lines) == 3, "the torn line is left as it was, and ended"
    again, first = json.loads(lines[2]), json.loads(full.stdout.splitlines()[1])
    assert (again["line"], again["text"], again["seed"]) == (2, first["text"], first["seed"])


def test_resume_from_appends_where_there_is_no_fcntl(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Windows has no fcntl to ask whether stdout appends: `--resume-from out.jsonl >> out.jsonl` appends the
    rest there too (it was an ImportError traceback), and `>` cannot be told from it (docs/remote.md)."""
    prompts, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "max_tokens": 2}\n{"prompt": "Say yes.", "max_tokens": 2}\n')
    out.write_text('{"line": 1, "text": "hi"}\n')
    windows = "import sys; sys.modules['fcntl'] = None; from localgen.cli.main import main; main()"
    with open(out, "a") as sink:
        r = subprocess.run([sys.executable, "-c", windows, "run", "--file", str(prompts), "--json", "--resume-from",
                            str(out), "--stats"], stdout=sink, stderr=subprocess.PIPE, text=True, env=cli_env,
                           cwd=ROOT, timeout=SAFETY_NET_S)
    assert r.returncode == 0 and "1 already answered" in r.stderr and "Traceback" not in r.stderr, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["line"] for x in lines] == [1, 2] and lines[0]["text"] == "hi", lines


def test_resume_from_skips_answered_lines(cli: CLI, two: tuple[Server, Server], tmp_path: Path) -> None:
    a, _ = two
    prompts = tmp_path / "in.jsonl"
    _lines(prompts, 6)
    full = cli("run", "--file", str(prompts), "--endpoint", a.url, "--json", "--seed", "7")
    assert full.returncode == 0
    out = tmp_path / "out.jsonl"
    out.write_text("".join(full.stdout.splitlines(keepends=True)[:4]) + '{"line": 5, "te')  # a crash mid-line
    rows = a.health()["rows"]
    with open(out, "a") as sink:
        r = cli.popen("run", "--file", str(prompts), "--endpoint", a.url, "--json", "--seed", "7",
                      "--resume-from", str(out), "--stats", stdout=sink, stderr=subprocess.PIPE, text=True)
        _, err = r.communicate(timeout=600)
    assert r.returncode == 0 and "4 already answered" in err, err
    assert out.read_text().splitlines()[4] == '{"line": 5, "te', "the torn line is left as it was"
    new = [json.loads(x) for x in out.read_text().splitlines()[5:]]
    assert [d["line"] for d in new] == [5, 6]
    assert [d["text"] for d in new] == [json.loads(x)["text"] for x in full.stdout.splitlines()[4:]]
    assert a.health()["rows"] > rows
    copy = cli("run", "--file", str(prompts), "--endpoint", a.url, "--json", "--seed", "7", "--resume-from", str(out))
    assert copy.returncode == 0 and [json.loads(x)["line"] for x in copy.stdout.splitlines()] == [1, 2, 3, 4, 5, 6]
    with open(out, "w") as sink:  # `>` onto the file it reads: refused (the shell has already emptied it)
        r = cli.popen("run", "--file", str(prompts), "--json", "--resume-from", str(out), stdout=sink,
                      stderr=subprocess.PIPE, text=True)
        _, err = r.communicate(timeout=600)
    assert r.returncode == 2 and "append with" in err, err
    assert httpx.get(f"{a.url}/health").status_code == 200


def test_without_m_the_servers_default_is_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server listing several models: the one it marks default (localgen serve's), else a usage error."""
    from localgen.errors import UsageError
    from localgen.remote import backend
    from localgen.remote.endpoints import Endpoint

    ep = Endpoint(url="http://127.0.0.1:1/v1")
    listed = [{"id": "a"}, {"id": "b", "default": True}]
    monkeypatch.setattr(backend, "_listed", lambda e, needed=False: listed)
    assert backend.pick_model([ep]) == "b"
    listed[1].pop("default")
    with pytest.raises(UsageError, match="serves 2 models"):
        backend.pick_model([ep])


def test_a_banned_token_is_sent_as_json_can_carry_it_and_the_server_bans_it(cli: CLI, two: tuple[Server, Server],
                                                                             smollm2_path: Path,
                                                                             tmp_path: Path) -> None:
    """docs/remote.md: `--logit-bias 15043-inf` (JSON has no infinity) is sent as -1e30, which bans the token on
    localgen serve as -inf does here: the remote answer is the local one with the same ban, never a traceback;
    so from chat's /set and a --file line's own -1e400."""
    from tests.model_shapes import _tokenizer

    a, _ = two
    args = ("-p", "The capital of Italy is", "--raw", "-n", "4", "--temperature", "0")
    first = json.loads(cli("run", *args, "--ctx", "1024", "--logprobs", "0", "--json").stdout)["logprobs"][0]
    vocab = next(v for n, v, _, _ in _tokenizer(str(smollm2_path)) if n == "tokenizer.ggml.tokens")
    ban = f"{list(vocab).index(first['token'].replace(' ', 'Ġ'))}-inf"  # GPT-2's byte-level spelling of a space
    local = json.loads(cli("run", *args, "--ctx", "1024", "--logit-bias", ban, "--json").stdout)["text"]
    remote = cli("run", "--endpoint", a.url, *args, "--logit-bias", ban, "--json")
    assert remote.returncode == 0, remote.stderr
    doc = json.loads(remote.stdout)
    assert doc["text"] == local and not local.startswith(first["token"]), (doc["text"], local, first)
    assert doc["sampling"]["logit_bias"] == {ban[:-4]: -1e30}
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"prompt": "hi", "max_tokens": 2, "logit_bias": {"504": -1e400}}\n')
    r = cli("run", "--endpoint", a.url, "--file", str(lines), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["text"], r.stderr
    r = cli("chat", "--endpoint", a.url, "-n", "2", input="/set logit_bias 504-inf\nhi\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
