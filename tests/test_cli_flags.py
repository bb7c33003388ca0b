"""Flags that must reach what they promise (issue #47): chat's -l lists, chat's grammar flags constrain every
answer, serve's sampling flags are the defaults of its requests, --ctx bounds a remote chat's window, and
serve's start-up line says what an RPC-only offload is (a real rpc-server and serve). Driven in-process
through Typer's CliRunner, but for that one. And each command's parameters are exactly the fields of the
typed value its body hands on (issue #45)."""

from __future__ import annotations

import dataclasses
import json
import socket
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from localgen import loadsettings, settings
from localgen.cli import app, params
from localgen.cli.chat.plan import ChatArgs
from localgen.cli.embed import EmbedArgs, RerankArgs, SimilarArgs
from localgen.cli.options import CommandArgs, OptionGroup
from localgen.cli.options.knobs import Knobs
from localgen.cli.run.options import RunArgs
from localgen.cli.serve.options import ServeArgs
from tests.conftest import CLI
from tests.fake_openai import FakeServer


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Any:
    """The CLI in this process, as `localgen ARGS` (stdout and stderr apart)."""
    params.install()
    return CliRunner().invoke(app.build(), list(args), input=input, env={"COLUMNS": "200", **(env or {})})


def _help_flags(command: str) -> set[str]:
    """The words of `localgen COMMAND --help` (Rich writes aliases as --a,--b)."""
    r = invoke(command, "--help")
    assert r.exit_code == 0, r.output
    return set(r.stdout.replace(",", " ").split())


def test_chat_l_lists_the_saved_conversations(home: Path, fake: FakeServer) -> None:
    r = invoke("chat", "listed-by-l", "--endpoint", fake.url, "-m", "plain", input="hello\n")
    assert r.exit_code == 0, r.output
    r = invoke("chat", "-l")
    assert r.exit_code == 0, r.output
    assert "listed-by-l" in r.stdout and r.stderr == ""
    assert invoke("chat", "--list").stdout == r.stdout


def test_chat_takes_run_s_grammar_flags(home: Path) -> None:
    listed = _help_flags("chat")
    for flag in ("--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file"):
        assert flag in listed, flag


def test_chat_json_schema_goes_with_every_request_to_a_remote_server(home: Path, fake: FakeServer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fake.requests.clear()
    r = invoke("chat", "schema-remote", "--endpoint", fake.url, "-m", "plain", "-j", json.dumps(schema),
               input="one\ntwo\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "Hello world\nHello world\n"
    assert [q["body"]["response_format"]["json_schema"]["schema"] for q in fake.requests] == [schema, schema]


@pytest.mark.slow  # chats with SmolLM2 in this process
def test_chat_grammar_constrains_every_answer_of_a_local_model(home: Path, tmp_path: Path,
                                                               fake: FakeServer) -> None:
    assert invoke("chat", "grammar-loaded", "--endpoint", fake.url, "-m", "plain", input="hello\n").exit_code == 0
    gbnf = tmp_path / "yesno.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    r = invoke("chat", "grammar-local", "-m", "smollm2:135m", "--grammar", str(gbnf), "--temperature", "0", "-n", "8",
               "--ctx", "512", input="Is the sky blue?\n/load grammar-loaded\nWhat is the capital of France?\n")
    assert r.exit_code == 0, r.output
    answers = r.stdout.split()
    assert len(answers) == 2 and set(answers) <= {"yes", "no"}, "also after /load: " + r.stdout


def test_chat_refuses_a_gbnf_grammar_for_a_remote_server(home: Path, fake: FakeServer, tmp_path: Path) -> None:
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "a"\n')
    r = invoke("chat", "--endpoint", fake.url, "-m", "plain", "--grammar", str(gbnf), input="hi\n")
    assert r.exit_code != 0 and "--grammar (GBNF; --json-schema works)" in str(r.exception)
    r = invoke("chat", "--endpoint", fake.url, "-m", "plain", "--prompt-cache", input="hi\n")
    assert r.exit_code != 0 and "--prompt-cache cannot be used with a remote endpoint" in str(r.exception)
    assert invoke("chat", "--endpoint", fake.url, "-m", "plain", "--no-prompt-cache", input="hi\n").exit_code == 0
    # the server renders with its own template and reads images with its own projector: each file was dropped
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    projector = tmp_path / "p.gguf"
    projector.write_bytes(b"GGUF")
    for command in ("run", "chat"):
        for flag, path in (("--chat-template-file", template), ("--mmproj", projector)):
            r = invoke(command, "--endpoint", fake.url, "-m", "plain", flag, str(path),
                       *(["-p", "hi"] if command == "run" else []), input="hi\n")
            assert r.exit_code != 0 and f"{flag} cannot be used with a remote endpoint" in str(r.exception), \
                (command, flag, r.output)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_chat_ctx_bounds_the_window_of_a_server_that_reports_none(home: Path, fake: FakeServer, how: str) -> None:
    long = "word " * 120  # about 200 tokens by the remote estimate: two of them do not fit in 300
    args, env = (["--ctx", "300"], {}) if how == "flag" else ([], {"LOCALGEN_CTX": "300"})
    fake.requests.clear()
    r = invoke("chat", f"ctx-{how}", "--endpoint", fake.url, "-m", "plain", *args, env=env,
               input=f"/context\nfirst {long}\nsecond {long}\n")
    assert r.exit_code == 0, r.output
    assert "of 300 tokens used" in r.stderr
    sent = [[m["content"][:6] for m in q["body"]["messages"]] for q in fake.requests]
    assert sent == [["first "], ["second"]], "the first exchange no longer fits the 300-token window"


@pytest.fixture()
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`serve` up to the point where it would load models and listen: what it built is kept here."""
    from localgen.cli.serve import command as serve_cli
    from localgen.engine import batchmode
    from localgen.native import devices
    from localgen.serve import app as serve_app

    got: dict[str, Any] = {}
    # an engine with layers offloaded (which mode it gets does not matter to what the tests here read)
    engine = SimpleNamespace(offloaded=True, exact_rows=0, flash_attn=False)
    mode = batchmode.batching_mode(engine, None)  # type: ignore[arg-type]
    worker = SimpleNamespace(name="m", residence=SimpleNamespace(mode=mode, pc=None, settings=lambda: None),
                             stop=lambda timeout: None,
                             ref=SimpleNamespace(summary=SimpleNamespace(context_length=8192)))
    build = serve_app.build

    def keep(state: Any, policy: Any, **options: Any) -> Any:
        got["state"] = state
        return build(state, policy, **options)

    monkeypatch.setattr(serve_cli, "_workers", lambda *a: [worker])
    monkeypatch.setattr(serve_cli, "_Server", lambda config: SimpleNamespace(run=lambda: None, handle_exit=None))
    monkeypatch.setattr(serve_cli, "_sigterm", lambda handler: None)  # this process's SIGTERM is pytest's
    monkeypatch.setattr(serve_app, "build", keep)
    monkeypatch.setattr(devices, "has_gpu", lambda: False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        got["port"] = str(s.getsockname()[1])
    return got


def test_serve_sampling_flags_are_the_defaults_of_requests(started: dict[str, Any]) -> None:
    from localgen.serve.pipeline import sampling

    r = invoke("serve", "--port", started["port"], "--stop", "END", "--stop", "STOP", "--top-n-sigma", "2",
               "--dry-sequence-breaker", "none", "--logit-bias", "15+1.5", "--ignore-eos")
    assert r.exit_code == 0, r.output
    state = started["state"]
    worker = SimpleNamespace(ref=SimpleNamespace(sampling_defaults={"top_n_sigma": 1.0, "top_k": 20}))
    s = sampling(state, worker, {"temperature": 0.2})  # type: ignore[arg-type]
    assert s.stop == ("END", "STOP") and s.top_n_sigma == 2.0 and s.dry_sequence_breaker == ()
    assert s.logit_bias == ((15, 1.5),) and s.ignore_eos and s.temperature == 0.2 and s.top_k == 20
    s = sampling(state, worker, {"stop": ["OWN"], "top_n_sigma": None})  # type: ignore[arg-type]
    assert s.stop == ("OWN",) and s.top_n_sigma == 2.0, "a request's own field wins; a null one does not"


def test_serve_help_lists_every_sampling_flag() -> None:
    listed = _help_flags("serve")
    missing = [k for k in settings.KNOBS if f"--{k.replace('_', '-')}" not in listed]
    assert not missing


def test_serve_with_rpc_servers_alone_says_no_gpu(cli: CLI, cli_env: dict[str, str]) -> None:
    """A real `rpc-server` takes SmolLM2's layers from a real `serve --rpc`: its start-up line says the
    offload is an RPC server's, not a GPU's, and why that makes it batch every request."""
    from localgen.native import devices

    if devices.has_gpu():
        pytest.skip("with a GPU here the layers go to it, not only to the RPC server")
    from tests.test_rpc import _start
    from tests.test_serve import Server

    rpc, endpoint = _start(cli)
    try:
        server = Server(cli_env, "--rpc", endpoint, "-np", "1", "--ctx", "512")
        loaded = httpx.get(f"{server.url}/api/ps", timeout=10).json()["models"]
        assert server.stop() == 0
        assert server.proc.stderr is not None
        log = server.proc.stderr.read().decode()
    finally:
        rpc.kill()
        rpc.wait()
    assert loaded[0]["size_vram"] > 1 << 20, "the weights went to the RPC server's device"
    line = next(ln for ln in log.splitlines() if "batching:" in ln)
    assert "on a GPU" not in line and "RPC server" in line, line
    assert line.strip().endswith("--exact forces it")


# each command's args dataclass: exactly its parameters ------------------------------------------------------------

ARGS: dict[str, type[CommandArgs]] = {"run": RunArgs, "chat": ChatArgs, "serve": ServeArgs, "embed": EmbedArgs,
                                      "similar": SimilarArgs, "rerank": RerankArgs}


def _parameters(command: str) -> list[str]:
    """The parameters Typer gives the command (with_knobs' groups and settings each as its options)."""
    built = typer.main.get_command(app.build(command)).commands[command]  # type: ignore[attr-defined]
    return sorted(p.name for p in built.params)


def _held(cls: type[CommandArgs]) -> list[str]:
    """The parameters the dataclass holds: its fields, each group's fields for the group, the table's
    settings for `knobs` (with_knobs() gives run, chat and serve every one); not the Typer context."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if kind is typer.Context:
            continue
        if kind is Knobs:
            out += [*settings.KNOBS, *loadsettings.LOAD_KNOBS]
        elif isinstance(kind, type) and issubclass(kind, OptionGroup):
            out += [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]
        else:
            out.append(field.name)
    return sorted(out)


@pytest.mark.parametrize("command", sorted(ARGS))
def test_each_command_s_args_hold_exactly_its_parameters(command: str) -> None:
    """An option added to a signature but not to its dataclass (or left in the dataclass when it leaves the
    signature) fails here; mypy then holds the command's body to every field (none has a default)."""
    cls = ARGS[command]
    held, taken = _held(cls), _parameters(command)
    assert held == taken, (f"{cls.__name__} lacks {sorted(set(taken) - set(held))}, has besides "
                           f"{sorted(set(held) - set(taken))}")
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(cls)), "every field is given by the command's body"


def test_counts_the_cli_prints_are_singular_for_one() -> None:
    """"1 exchange", "1 message", "1 core": a count of one takes the singular (it printed "1 exchanges")."""
    from localgen.cli.output import plural

    assert [plural(n, "exchange") for n in (0, 1, 2, 1000)] == ["0 exchanges", "1 exchange", "2 exchanges",
                                                               "1,000 exchanges"]
