"""README promises that no test held yet (issue #47, second pass): `serve --rpc` when its RPC server dies,
serve's `--stop` as the default that a request's `stop` replaces (`null`) or drops (`[]`), a remote chat
trimmed to the window its server reports (`/v1/models`' `max_model_len`, llama-server's `/props`), `/detach`
and `/bye`/`/quit` in a scripted chat, the platform folders used without LOCALGEN_HOME, and in the chat REPL
Tab completion of file paths, saved conversations and model names, and Ctrl-C at the prompt.

Each test was checked by breaking the behaviour it names without touching localgen/: a `sitecustomize.py` on
PYTHONPATH (so every `localgen` child loads it) that replaced the piece, then the suite run with it, then
without. What each one broke is in the test's comment."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests import terminal
from tests.conftest import CLI
from tests.fake_openai import FakeServer
from tests.test_rpc import _start
from tests.test_serve import Server

# ---- serve --rpc when the RPC server dies --------------------------------------------------------------------


def test_serve_with_rpc_exits_1_with_one_line_when_its_rpc_server_dies(cli: CLI, cli_env: dict[str, str]) -> None:
    """README (llama.cpp RPC): A server that disappears mid-generation makes ggml abort the client process
    ... you get one line — `localgen: error: llama.cpp stopped: Remote RPC server crashed or returned
    malformed response` — and exit status 1 ... a `serve` with `--rpc` exits too, and a supervisor has to
    restart it.
    Broken once (sitecustomize making `localgen.native.lib._install_abort_handler` a no-op): serve died of
    SIGABRT (status -6), and this test failed on the exit status."""
    rpc, endpoint = _start(cli)
    server: Server | None = None
    try:
        server = Server(cli_env, "--rpc", endpoint, "-np", "1", "--ctx", "2048", "-t", "1")
        body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 1500, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while len(events) < 4:  # generating across the RPC server now
                line = next(lines)
                if line.startswith("data: "):
                    events.append(line)
            rpc.kill()
            rpc.wait()
            with contextlib.suppress(httpx.HTTPError):  # the connection may go with the process
                for line in lines:
                    if line.startswith("data: "):
                        events.append(line)
        assert "data: [DONE]" not in events, "the stream is cut, not finished"
        assert server.proc.wait(timeout=120) == 1
        assert server.proc.stderr is not None
        err = server.proc.stderr.read().decode()
        assert err.count("localgen: error: llama.cpp stopped:") == 1 and "RPC" in err, err
        assert "Traceback" not in err, err
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/health", timeout=5)
    finally:
        rpc.kill()
        rpc.wait()
        if server is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


# ---- serve's --stop is the default of requests that set none ------------------------------------------------


def test_serve_stop_is_the_default_a_request_can_replace_or_drop(cli_env: dict[str, str]) -> None:
    """README (localgen serve, Settings): all of `run`'s sampling flags ... become the defaults that each
    request's fields override: a request that sets no `stop` (or `null`) gets the server's `--stop`; one that
    sends `stop: []` has none.
    Broken once (sitecustomize making `localgen.serve.common.sampling`, now serve/pipeline.py's, drop empty
    values from the request, as it drops nulls): the `stop: []` request stopped at the server's "5." and this
    test failed."""
    server = Server(cli_env, "-np", "1", "--ctx", "512", "--stop", "5.")
    try:
        def ask(**extra: Any) -> tuple[str, str]:
            body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Count from 1 to 20."}],
                    "max_tokens": 40, "temperature": 0, **extra}
            r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            return str(choice["message"]["content"]), str(choice["finish_reason"])

        unset, null, empty, own = ask(), ask(stop=None), ask(stop=[]), ask(stop=["3."])
        assert "5." in empty[0] and empty[0].startswith(unset[0].rstrip()), "with stop: [] the text goes on"
        assert unset[1] == "stop" and "5." not in unset[0] and "4" in unset[0], unset
        assert null == unset, "stop: null is no stop field: the server's --stop"
        assert own[1] == "stop" and "3." not in own[0] and "4" not in own[0], "a request's own stop replaces it"
    finally:
        assert server.stop() == 0


# ---- a remote chat's window comes from the server --------------------------------------------------------------

WINDOW = 300
LONG = "word " * 120  # about 200 tokens by the remote estimate (3 characters a token): two do not fit in 300


class WindowServer(FakeServer):
    """The fake OpenAI server (tests/fake_openai.py), reporting a context window as vLLM does
    (`max_model_len` in /v1/models) or as llama-server does (`/props`)."""

    def __init__(self, how: str) -> None:
        self.how = how
        super().__init__()
        app: Any = self.server.config.app
        app.router.routes.append(Route("/props", self.props))

    async def models(self, request: Request) -> Response:
        model: dict[str, Any] = {"id": "plain", "object": "model"}
        if self.how == "models":
            model["max_model_len"] = WINDOW
        return JSONResponse({"object": "list", "data": [model]})

    async def props(self, request: Request) -> Response:
        if self.how != "props":
            return JSONResponse({"error": "not found"}, status_code=404)
        return JSONResponse({"default_generation_settings": {"n_ctx": WINDOW}})


@pytest.mark.parametrize("how", ["models", "props"])
def test_a_remote_chat_is_trimmed_to_the_window_the_server_reports(cli: CLI, home: Path, how: str) -> None:
    """README (Remote endpoints): `--ctx` says the window to assume when the server does not report one
    (vLLM's `max_model_len`, llama-server's `/props`). Chat: trimming to the window uses an estimate (3
    characters a token) ... (chat, Long conversations): the oldest turns are left out, the system prompt
    never; you are told once ... The saved conversation always keeps every turn.
    Broken once (sitecustomize making `RemoteBackend._server_ctx` return None): `/context` said "of 4,096"
    (the default window), and this test failed for both ways of reporting."""
    import json

    server = WindowServer(how)
    try:
        name = f"window-{how}"
        r = cli("chat", name, "--endpoint", server.url, "--system", "Be brief.",
                input=f"/context\nfirst {LONG}\nsecond {LONG}\nthird {LONG}\n")
        assert r.returncode == 0, r.stderr
        assert f"of {WINDOW} tokens used" in r.stderr, r.stderr
        sent = [[(m["role"], m["content"][:6]) for m in q["body"]["messages"]] for q in server.requests]
        assert sent == [
            [("system", "Be bri"), ("user", "first ")],
            [("system", "Be bri"), ("user", "second")],
            [("system", "Be bri"), ("user", "third ")],
        ], "each earlier exchange falls out of the 300-token window; the system prompt stays"
        assert r.stderr.count("the oldest turns are no longer sent") == 1, r.stderr
        saved = json.loads((home / "data" / "chats" / f"{name}.json").read_text())
        assert [m["content"][:6] for m in saved["messages"] if m["role"] == "user"] == ["first ", "second",
                                                                                        "third "]
    finally:
        server.stop()


@pytest.mark.parametrize(("how", "args", "env"), [
    ("models", ("--ctx", "8192"), {}),
    ("props", (), {"LOCALGEN_CTX": "2048"}),
    ("none", ("--ctx", str(WINDOW)), {}),
], ids=["ctx-flag-vs-models", "ctx-env-vs-props", "ctx-flag-when-the-server-says-nothing"])
def test_a_servers_window_wins_over_ctx(cli_env: dict[str, str], how: str, args: tuple[str, ...],
                                        env: dict[str, str]) -> None:
    """README (Remote endpoints): `--ctx` says the window to assume when the server does not report one
    (issue #47: with `--ctx` or LOCALGEN_CTX given, the server was never asked, and chat sent more history
    than its window holds). A server that reports nothing still gets the `--ctx` window.
    Broken once (the code before the fix: `RemoteBackend.n_ctx` returning the `--ctx` value without asking):
    `/context` said "of 8,192" and "of 2,048", and the earlier turns were sent, for the first two cases."""
    server = WindowServer(how)
    try:
        lg = CLI({**cli_env, **env})
        r = lg("chat", f"window-wins-{how}", "--endpoint", server.url, *args, "--system", "Be brief.",
               input=f"/context\nfirst {LONG}\nsecond {LONG}\n")
        assert r.returncode == 0, r.stderr
        assert f"of {WINDOW} tokens used" in r.stderr, r.stderr
        sent = [[(m["role"], m["content"][:6]) for m in q["body"]["messages"]] for q in server.requests]
        assert sent == [[("system", "Be bri"), ("user", "first ")], [("system", "Be bri"), ("user", "second")]], \
            "the first exchange falls out of the server's 300-token window"
    finally:
        server.stop()


# ---- /detach, /bye and /quit in a scripted chat ---------------------------------------------------------------


@pytest.mark.parametrize("leave", ["/bye", "/quit"])
def test_detach_drops_the_attachment_and_bye_or_quit_leave(cli: CLI, home: Path, tmp_path: Path, leave: str) -> None:
    """README (chat, commands): `/detach` | drop what is attached to the next message; `/exit` | leave (also
    `/bye`, `/quit`, Ctrl-D). (Scripted: lines starting with `/` are commands.)
    Broken once (sitecustomize making `/detach` report the count but keep the attachments): the second
    `/detach` still found one and this test failed; with `/bye` taken out of the command table the script
    ended with "localgen: error: unknown command /bye" and a non-zero status, and it failed too."""
    import json

    notes = tmp_path / "notes.txt"
    notes.write_text("The secret word is PELICAN-47.\n")
    name = f"detach-{leave[1:]}"
    r = cli("chat", name, "-n", "2", "--temp", "0",
            input=f"/read {notes}\n/detach\n/detach\nHello\n{leave}\nnever sent\n")
    assert r.returncode == 0, r.stderr
    assert "dropped 1 attachment" in r.stderr and "nothing is attached" in r.stderr, r.stderr
    saved = json.loads((home / "data" / "chats" / f"{name}.json").read_text())
    users = [m["content"] for m in saved["messages"] if m["role"] == "user"]
    assert users == ["Hello"], f"the file was dropped and {leave} left before the last line: {users}"


# ---- where files go without LOCALGEN_HOME -----------------------------------------------------------------------


def test_without_localgen_home_files_go_to_the_platform_dirs(cli_env: dict[str, str], tmp_path: Path) -> None:
    """README (Files and environment): saved chats (`chats/`) | the platform data dir
    (`~/.local/share/localgen` on Linux); the log | `<data dir>/logs/logs.db`; user catalogue | `<config
    dir>/models.toml` (Models: `~/.config/localgen/models.toml` on Linux). Every other test sets
    LOCALGEN_HOME, so none would notice these moving.
    Broken once (sitecustomize making `localgen.paths.data_dir` return a folder under /tmp): the saved chat
    and the log were not under ~/.local/share/localgen and this test failed."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the README names the Linux locations")
    env = {k: v for k, v in cli_env.items() if k != "LOCALGEN_HOME" and not k.startswith("XDG_")}
    env["HOME"] = str(tmp_path)
    config = tmp_path / ".config" / "localgen"
    config.mkdir(parents=True)
    (config / "models.toml").write_text('[models."mine:8b"]\nrepo = "someone/Mine-8B-GGUF"\ncontext = 32768\n')
    lg = CLI(env)
    r = lg("chat", "where-it-goes", "-n", "2", "--temp", "0", input="Hello\n")
    assert r.returncode == 0, r.stderr
    data = tmp_path / ".local" / "share" / "localgen"
    assert (data / "chats" / "where-it-goes.json").is_file()
    logs = lg("logs", "path")
    assert logs.stdout.strip() == str(data / "logs" / "logs.db") and (data / "logs" / "logs.db").is_file()
    listed = lg("list", "--catalogue")
    assert any(line.split()[:2] == ["mine:8b", "someone/Mine-8B-GGUF"] for line in listed.stdout.splitlines())


# ---- Tab completion in the chat REPL ---------------------------------------------------------------------------

PROMPT = ">>>"


def test_tab_completes_paths_saved_conversations_and_model_names(cli: CLI, cli_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """README (chat, Keys): Tab completes slash commands and their arguments (settings, file paths, saved
    conversations, model names). (Commands and settings: tests/test_promises_cli.py.) And (Ctrl-C): Ctrl-C at
    the prompt says how to leave; Ctrl-D ... leaves with exit status 0.
    Broken once (sitecustomize wrapping `localgen.cli.chat.repl.make_completer` with empty lists of saved
    conversations and models): Tab after `/load tabcompletion-s` added nothing and the test timed out there.
    Model names are what `localgen list` shows (a GGUF in the Hugging Face cache, named repo:QUANT) and the
    catalogue's (issue #47: only the embedded models completed, and the test timed out at `/model qwen2.5-c`)."""
    saved = cli("chat", "tabcompletion-saved", "-n", "2", "--temp", "0", input="Hi\n")
    assert saved.returncode == 0, saved.stderr
    files = tmp_path / "files"
    files.mkdir()
    (files / "tabcompletion-notes.txt").write_text("some notes\n")
    env = {k: v for k, v in cli_env.items() if k not in ("NO_COLOR", "VISUAL", "EDITOR")}
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    # a pulled model, as huggingface_hub lays it out (a cache of this test's own: the session's stays as it is)
    snapshot = tmp_path / "hub" / "models--someone--Tabcompletion-GGUF" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tabcompletion-Q4_K_M.gguf").write_bytes(b"GGUF")
    env["HF_HUB_CACHE"] = str(tmp_path / "hub")
    child: Any = terminal.spawn(env, ["chat", "tabcompletion-live", "-n", "2"], timeout=120, dimensions=(40, 200))
    try:
        child.expect("ready in")
        child.expect_exact(PROMPT)

        def complete(typed: str, rest: str) -> None:
            child.send(typed + "\t")
            child.expect_exact(rest)  # prompt_toolkit draws only what Tab added to what was typed
            time.sleep(0.2)

        complete(f"/read {files}/tabcompletion-n", "otes.txt")
        child.send("\r")
        child.expect_exact("tabcompletion-notes.txt will be sent with your next message")
        child.expect_exact(PROMPT)
        complete("/load tabcompletion-s", "aved")
        child.send("\r")
        child.expect_exact("continuing tabcompletion-saved: 2 messages")
        child.expect_exact(PROMPT)
        complete("/model gemma3:2", "70m")
        child.sendcontrol("u")
        complete("/model smollm", "2:135m")
        child.sendcontrol("u")
        complete("/model qwen2.5-c", "oder:7b")  # in the catalogue, not embedded
        child.sendcontrol("u")
        complete("/model someone/Tab", "completion-GGUF:Q4_K_M")  # pulled
        child.sendcontrol("u")
        child.sendintr()  # README (chat): Ctrl-C at the prompt says how to leave
        child.expect_exact("to leave, press Ctrl-D or type /exit")
        child.expect_exact(PROMPT)
        time.sleep(0.3)
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
