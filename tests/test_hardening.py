"""Hostile input and faults outside `serve`: text that is not UTF-8 at every CLI boundary, settings past
what llama.cpp's C ints hold, chats started in the same second, private files, credentials in URLs, the Hub
token on a downgrading redirect, multi-line SSE events, and the environment variables the README lists."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.fake_openai import FakeServer

BAD = os.fsdecode(b"caf\xe9")  # argv as Python holds a byte that is not UTF-8


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert r.returncode == code, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_text_that_is_not_utf8_is_a_one_line_error_at_every_boundary(cli: CLI, tmp_path: Path) -> None:
    _one_line_error(cli("run", "-p", BAD, "-n", "2"), 2, "the prompt is not valid UTF-8 text: byte 0xe9")
    _one_line_error(cli("run", BAD, "-n", "2"), 2, "the prompt is not valid UTF-8 text")
    _one_line_error(cli("run", "-p", "hi", "--system", BAD), 2, "--system is not valid UTF-8 text")
    _one_line_error(cli("run", "-p", "hi", "--stop", BAD), 2, "error: --stop is not valid UTF-8 text")
    r = subprocess.run(cli.argv("run", "-n", "2"), input=b"caf\xe9 au lait", capture_output=True, env=cli.env)
    assert r.returncode == 2 and b"stdin is not valid UTF-8 text" in r.stderr and r.stderr.count(b"\n") == 1
    r = subprocess.run(cli.argv("chat", "-n", "2"), input=b"caf\xe9\n", capture_output=True, env=cli.env)
    assert r.returncode == 2 and b"the message is not valid UTF-8 text" in r.stderr


def test_a_flags_bad_value_names_the_flag_typed_and_a_lines_names_its_field(cli: CLI, tmp_path: Path) -> None:
    """What the sampling table's check refuses names the spelling the value came under: the flag on the command
    line (`--stop`, not the field `stop`), the field in a JSONL line, as a client's request names its own."""
    many = [a for i in range(65) for a in ("--stop", f"s{i}")]
    for args, said in ((("--stop", BAD), "--stop is not valid UTF-8 text"),
                       (("--dry-sequence-breaker", BAD), "--dry-sequence-breaker is not valid UTF-8 text"),
                       (tuple(many), "--stop: at most 64 strings"),
                       (("--logit-bias", "99999999999+1"),  # a non-negative integer, past a C int
                        "--logit-bias: a token id must be at most 2,147,483,647, not 99999999999")):
        for command in ("run", "chat"):
            r = cli(command, "-n", "2", *args, *(("-p", "hi") if command == "run" else ()), input="hi\n")
            _one_line_error(r, 2, f"localgen: error: {said}")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "x", "logit_bias": {"99999999999": 1}}\n')
    r = cli("run", "--file", str(jsonl), "-n", "1", "--json")
    assert r.returncode == 1 and "logit_bias: a token id" in json.loads(r.stdout)["error"], (r.stdout, r.stderr)


def test_a_logit_bias_longer_than_any_vocabulary_is_refused(cli: CLI, tmp_path: Path) -> None:
    """docs/api.md: at most 262,144 entries; 1.4 million in a 14 MB request were each applied at every token."""
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"prompt": "x", "logit_bias": [[5, 0.0]] * (2**18 + 1)}) + "\n"
                     + json.dumps({"prompt": "x", "logit_bias": [[5, 0.0]] * 2**18}) + "\n")
    r = cli("run", "--file", str(jsonl), "-n", "1", "--json")
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 1 and "logit_bias: at most 262,144 entries (one a token), not 262,145" in docs[0]["error"]
    assert "error" not in docs[1], docs[1]


def test_a_bad_line_fails_alone_in_a_batch(cli: CLI, tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "a \\ud800 b"}\n{"prompt": "The sky is"}\n{"prompt": "x", "top_k": 4294967296}\n')
    r = cli("run", "--file", str(jsonl), "--raw", "-n", "3", "--temperature", "0", "--json")
    assert r.returncode == 1, r.stderr
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert "lone surrogate" in docs[0]["error"] and docs[1]["text"]
    assert "top_k must be at most 2,147,483,647" in docs[2]["error"]
    r = subprocess.run(cli.argv("run", "--each-line", "--raw", "-n", "3", "--temperature", "0"),
                       input=b"caf\xe9 au lait\nThe sky is\n", capture_output=True, env=cli.env)
    lines = r.stdout.decode().split("\n")
    assert r.returncode == 1 and lines[0] == "" and lines[1], r.stdout
    assert b"line 1: the line is not valid UTF-8 text" in r.stderr
    # --file the same (its lines were once read with replacement characters and answered)
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"The sky is\ncaf\xe9 au lait\n")
    r = cli("run", "--file", str(prompts), "--raw", "-n", "3", "--temperature", "0")
    lines = r.stdout.split("\n")
    assert r.returncode == 1 and lines[0] and lines[1] == "", r.stdout
    assert r.stderr == ("localgen: error: line 2: the line is not valid UTF-8 text: byte 0xe9 at character 4 is not "
                        "UTF-8\n")


def test_a_file_read_whole_that_is_not_utf8_names_the_file_and_line(cli: CLI, tmp_path: Path) -> None:
    """-f, -jf, --grammar, --chat-template-file and embed's --file: exit 2 before anything loads, one line with
    the file, the line and the byte (a schema or grammar was once read with replacement characters)."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b'{"type": "object"}\n\n"caf\xe9"\n')
    for args, what in ((["run", "-f", str(bad), "-p", "hi"], str(bad)),
                       (["run", "-jf", str(bad), "-p", "hi"], f"the JSON schema file {bad}"),
                       (["run", "-j", str(bad), "-p", "hi"], f"the JSON schema file {bad}"),
                       (["run", "--grammar", str(bad), "-p", "hi"], f"the grammar file {bad}"),
                       (["run", "--chat-template-file", str(bad), "-p", "hi"], f"the chat template {bad}"),
                       (["embed", "--file", str(bad)], str(bad))):
        _one_line_error(cli(*args, "-n", "1") if args[0] == "run" else cli(*args), 2,
                        f"localgen: error: {what} is not UTF-8 text: byte 0xe9 on line 3 is not UTF-8")
    r = subprocess.run(cli.argv("embed"), input=b"fine\ncaf\xe9\n", capture_output=True, env=cli.env)
    assert r.returncode == 2 and r.stderr == b"localgen: error: line 2 is not valid UTF-8 text: byte 0xe9 at " \
                                             b"character 4 is not UTF-8\n", r.stderr


def test_integer_settings_stop_at_what_a_c_int_holds(cli: CLI) -> None:
    _one_line_error(cli("run", "-p", "hi", "--top-k", str(2**32)), 2, "--top-k")
    _one_line_error(cli("run", "-p", "hi", "--logit-bias", f"{2**40}+1"), 2, "--logit-bias: ")
    from localgen import settings
    from localgen.errors import UsageError

    for name in ("top_k", "repeat_last_n", "max_tokens", "dry_allowed_length", "dry_penalty_last_n"):
        with pytest.raises(UsageError, match=r"must be at most 2,147,483,647 \(llama.cpp takes it as a C int\)"):
            settings.check(name, 2**31)
        assert settings.check(name, 2**31 - 1) == 2**31 - 1


def test_the_per_line_seed_of_a_batch_stays_in_range(cli: CLI, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text('One\nTwo\n{"prompt": "Three", "seed": 5}\n')
    r = cli("run", "--file", str(prompts), "--raw", "-n", "2", "--seed", str(2**32 - 1), "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["seed"] for x in r.stdout.splitlines()] == [2**32 - 1, 0, 5], "--seed + line - 1"


def test_chats_started_in_the_same_second_never_overwrite_each_other(home: Path) -> None:
    from localgen.chat import saved
    from localgen.chat import session as sessions
    from localgen.errors import LocalgenError

    name = sessions.new_name()
    a = sessions.ChatSession(name=name, model="m", fresh=True, auto_named=True)
    b = sessions.ChatSession(name=name, model="m", fresh=True, auto_named=True)
    a.add("user", "first chat")
    b.add("user", "second chat")
    pa, pb = a.save(), b.save()
    assert pa != pb and b.name == f"{name}-2"
    assert json.loads(pa.read_text())["messages"][0]["content"] == "first chat"
    assert json.loads(pb.read_text())["messages"][0]["content"] == "second chat"
    b.add("user", "more")
    assert b.save() == pb, "later saves stay in the file it claimed"
    mine = sessions.ChatSession(name="chosen-name", model="m", fresh=True)
    theirs = sessions.ChatSession(name="chosen-name", model="m", fresh=True)
    theirs.add("user", "theirs")
    theirs.save()
    with pytest.raises(LocalgenError, match="saved by another chat meanwhile"):
        mine.save()
    assert "theirs" in (saved.chats_dir() / "chosen-name.json").read_text()


def test_saved_chats_and_prompt_states_are_private(cli: CLI, home: Path, smollm2_engine: object) -> None:
    r = cli("chat", "private-one", "-n", "2", "--temperature", "0", input="hello\n")
    assert r.returncode == 0, r.stderr
    from localgen.chat.saved import chats_dir

    saved = chats_dir() / "private-one.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(chats_dir().stat().st_mode) == 0o700
    from localgen.engine import promptcache
    from localgen.native.prompt import Prompt

    state = promptcache.cache_root() / "private-test.state"
    smollm2_engine.kv.evaluate(Prompt.text(smollm2_engine.raw_tokens("Some document text")))  # type: ignore[attr-defined]
    smollm2_engine.kv.save_state(state)  # type: ignore[attr-defined]
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    state.unlink()


def _no_umask() -> None:
    os.umask(0)


def test_the_folders_localgen_makes_in_its_home_are_private_under_any_umask(cli_env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """Under `umask 000` the home and each folder above a private one were 0777 (mkdir's 0700 held for the last
    folder only): another user could rename a 0700 folder of chats away. Every folder localgen makes is 0700,
    parents included; one that was there (the user's, above LOCALGEN_HOME) is left as it is."""
    given = tmp_path / "given"
    given.mkdir()
    given.chmod(0o755)
    home = given / "lg"
    env = {**cli_env, "LOCALGEN_HOME": str(home)}
    for args in (("bench", "history"), ("create", "mine", "-f", "-")):  # the home made by the first, then presets
        r = subprocess.run(CLI(env).argv(*args), input="FROM smollm2:135m\n", capture_output=True, text=True,
                           env=env, preexec_fn=_no_umask, timeout=300)
        assert r.returncode == 0, r.stderr
    modes = {str(p.relative_to(given)): stat.S_IMODE(p.stat().st_mode) for p in (home, home / "data",
                                                                              home / "data" / "presets")}
    assert modes == {"lg": 0o700, "lg/data": 0o700, "lg/data/presets": 0o700}
    assert stat.S_IMODE((home / "data" / "presets" / "mine.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(given.stat().st_mode) == 0o755


def test_tuning_records_their_lock_and_the_chat_history_are_0600_under_any_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tuning.json was replaced by a temporary file of the umask's mode (0666 under `umask 000`), its lock file and
    the collections' too; chat's input history (what was typed) was made by prompt_toolkit with the umask's mode."""
    from prompt_toolkit.history import FileHistory

    from localgen import paths, tuning
    from localgen.cli.chat.repl import _history
    from localgen.embeddings import storedb

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    old = os.umask(0)
    try:
        with tuning._locked():
            tuning._write({"records": []})
        history = tmp_path / "home" / "state" / "chat_history"
        _history(FileHistory, history).store_string("what I typed")
        db = tmp_path / "home" / "data" / "embeddings" / "embeddings.db"
        paths.private_file(db)
        storedb.make_schema(db)
    finally:
        os.umask(old)
    state = tmp_path / "home" / "state"
    made = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (*state.iterdir(), *db.parent.iterdir())}
    assert made == {"tuning.json": 0o600, "tuning.json.lock": 0o600, "chat_history": 0o600,
                    "embeddings.db": 0o600, "embeddings.db.lock": 0o600}, made
    assert "what I typed" in history.read_text()
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "home", state, db.parent)} == {0o700}


def test_credentials_in_an_endpoint_url_are_refused_and_never_shown(cli: CLI, fake: FakeServer, home: Path) -> None:
    url = fake.url.replace("http://", "http://bob:hunter2@")
    for args in (["run", "--endpoint", url, "-p", "hi"], ["bench", "--endpoint", url]):
        r = cli(*args)
        _one_line_error(r, 2, "may not carry credentials")
        assert "hunter2" not in r.stderr and "bob" not in r.stderr and "--api-key-env" in r.stderr
    config = home / "config"
    config.mkdir(exist_ok=True)
    (config / "endpoints.toml").write_text(f'[box]\nurl = "{url}"\n')
    try:
        r = cli("run", "-m", "box/plain", "-p", "hi")
        _one_line_error(r, 2, "[box] url may not carry credentials")  # it said --endpoint, which was not given
        assert "hunter2" not in r.stderr and 'api_key_env = "NAME" in its entry' in r.stderr, r.stderr
        assert "--api-key-env" not in r.stderr and "--endpoint" not in r.stderr, r.stderr
    finally:
        (config / "endpoints.toml").unlink()


def test_the_hub_token_never_follows_a_redirect_down_to_http() -> None:
    from localgen.models.hub import keeps_token

    assert keeps_token("https://hub.example/a", "https://hub.example/b")
    assert keeps_token("http://127.0.0.1:8/a", "http://127.0.0.1:8/b")
    assert not keeps_token("https://hub.example/a", "http://hub.example/b"), "https → http on the same host"
    assert not keeps_token("https://hub.example/a", "https://cdn.example/b")


def test_a_multi_line_sse_event_is_one_event(cli: CLI, fake: FakeServer) -> None:
    r = cli("run", "--endpoint", fake.url, "-m", "multiline", "-p", "hi", timeout=60)
    assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr


def test_the_environment_variables_the_readme_lists(cli: CLI, fake: FakeServer) -> None:
    r = subprocess.run(cli.argv("run", "-m", "plain", "-p", "hi"), capture_output=True, text=True,
                       env={**cli.env, "LOCALGEN_ENDPOINT": fake.url}, timeout=60)
    assert r.returncode == 0 and r.stdout == "Hello world\n", r.stderr
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(cli.argv("run", "-p", "hi"), capture_output=True, text=True,
                       env={**cli.env, "LLAMA_ARG_RPC": f"127.0.0.1:{port}"}, timeout=60)
    assert r.returncode == 1 and f"cannot reach the RPC server 127.0.0.1:{port}" in r.stderr
    from tests.test_serve import Server

    server = Server({**cli.env, "LOCALGEN_API_KEY": "sk-from-env"})
    try:
        import httpx

        body = {"model": "smollm2:135m", "prompt": "hi", "max_tokens": 1}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 401
        ok = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30,
                        headers={"Authorization": "Bearer sk-from-env"})
        assert ok.status_code == 200
    finally:
        assert server.stop() == 0


def test_a_line_nested_too_deeply_a_surrogate_id_or_an_empty_prompt_or_stop_fails_alone(cli: CLI,
                                                                                        tmp_path: Path) -> None:
    # a line nesting 5,000 deep was a RecursionError that ended the job; a lone surrogate in "id" (written back
    # with the answer) crashed the --json output after the answer was made: each now fails its own line
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "x", "id": ' + "[" * 5000 + "]" * 5000 + '}\n'
                     '{"prompt": "hi", "id": "\\ud800"}\n{"prompt": "hi", "id": ["a", {"b": "\\udfff"}]}\n'
                     '{"prompt": "The sky is", "id": "ok"}\n'
                     '{"prompt": ""}\n{"prompt": " \\n "}\n{"prompt": "hi", "stop": ""}\n'
                     '{"prompt": "hi", "stop": ["x", ""]}\n')
    r = cli("run", "--file", str(jsonl), "--raw", "-n", "2", "--temperature", "0", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in docs] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert docs[0]["error"] == "bad JSON line: it nests too deeply"
    assert docs[1]["error"] == '"id" is not valid UTF-8 text: a lone surrogate (\\ud800) at character 2'
    assert "lone surrogate (\\udfff)" in docs[2]["error"]
    assert docs[3]["id"] == "ok" and docs[3]["text"]
    # checked as the flags are: -p "" and -p "  " are no prompt, --stop '' is refused (these were answered)
    assert [d.get("error") for d in docs[4:]] == [
        '"prompt" is empty: there is no prompt', '"prompt" is only whitespace: there is no prompt',
        '"stop" holds an empty string: give the text, or leave it out',
        '"stop" holds an empty string: give the text, or leave it out']
