"""Bad input on the command line gets one line and exit 2, never a quiet default or a lost file: an empty
--host, a host name that does not resolve, an empty name where a name is needed, files that are not UTF-8,
flags that cannot both be honoured. In this process (cli_in_process): each is refused before a model loads."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import InProcessCLI


def one_line_usage_error(r: object, *words: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr holding each of `words`."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)  # type: ignore[attr-defined]
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr  # type: ignore[attr-defined]
    for w in words:
        assert w in r.stderr, (w, r.stderr)  # type: ignore[attr-defined]


@pytest.mark.parametrize("host", ["", "  "])
@pytest.mark.parametrize("command", ["serve", "ps"])
def test_an_empty_host_is_a_usage_error(cli_in_process: InProcessCLI, command: str, host: str) -> None:
    # uvicorn takes "" for every interface, IPv4 and IPv6: serve would listen on all of them
    one_line_usage_error(cli_in_process(command, "--host", host), "--host is empty")


def test_a_host_name_that_does_not_resolve_is_not_called_a_busy_port(cli_in_process: InProcessCLI) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    r = cli_in_process("serve", "--host", "nosuch.invalid", "--port", port)
    one_line_usage_error(r, "cannot listen on nosuch.invalid", "no such host", "--host takes")
    assert "--port" not in r.stderr


def test_the_port_check_closes_its_socket_when_an_option_cannot_be_set(cli_in_process: InProcessCLI,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket option refused (SO_REUSEADDR, SO_EXCLUSIVEADDRUSE on Windows) leaks no socket."""
    made: list[socket.socket] = []
    real = socket.socket.setsockopt

    def refused(self: socket.socket, level: int, option: int, *value: object) -> None:
        if option in (socket.SO_REUSEADDR, getattr(socket, "SO_EXCLUSIVEADDRUSE", -1)):
            made.append(self)
            raise OSError(92, "Protocol not available")
        real(self, level, option, *value)  # type: ignore[call-overload]

    monkeypatch.setattr(socket.socket, "setsockopt", refused)
    r = cli_in_process("serve", "--host", "127.0.0.1", "--port", "1")
    assert r.returncode == 1 and r.stderr.startswith("localgen: error: ") and made, (r.returncode, r.stderr)
    assert all(s.fileno() == -1 for s in made), "the probe socket was left open"


def test_serve_listens_where_the_environment_says(cli_in_process: InProcessCLI) -> None:
    """docs/configuration.md: LOCALGEN_HOST and LOCALGEN_PORT are serve's --host and --port; a flag wins."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cli_in_process.env.update(LOCALGEN_HOST="nosuch.invalid", LOCALGEN_PORT=port)
        try:
            one_line_usage_error(cli_in_process("serve"), f"cannot listen on nosuch.invalid:{port}", "no such host")
            r = cli_in_process("serve", "--host", "127.0.0.1")
            assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
            # as OLLAMA_HOST: host:port (or a URL) in LOCALGEN_HOST, whose port wins unless --port is typed
            with socket.socket() as other:  # a second busy port, for the --port typed
                other.bind(("127.0.0.1", 0))
                other.listen()
                typed = str(other.getsockname()[1])
                cli_in_process.env.update(LOCALGEN_HOST=f"http://127.0.0.1:{port}", LOCALGEN_PORT=typed)
                r = cli_in_process("serve")
                assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
                r = cli_in_process("serve", "--port", typed)
                assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{typed}" in r.stderr, r.stderr
        finally:
            for name in ("LOCALGEN_HOST", "LOCALGEN_PORT"):
                cli_in_process.env.pop(name, None)


def test_a_port_out_of_range_names_where_it_came_from(cli_in_process: InProcessCLI) -> None:
    """A port past 65535 in LOCALGEN_HOST is that variable's error, not --host's (which was not typed)."""
    cli_in_process.env.update(LOCALGEN_HOST="127.0.0.1:99999")
    try:
        r = cli_in_process("serve")
        assert r.returncode == 2 and r.stderr.strip() == (
            "localgen: error: LOCALGEN_HOST '127.0.0.1:99999' names port 99999, which is not 1 to 65535"), r.stderr
        r = cli_in_process("serve", "--host", "127.0.0.1:70000")
        assert r.returncode == 2 and "--host '127.0.0.1:70000' names port 70000" in r.stderr, r.stderr
    finally:
        cli_in_process.env.pop("LOCALGEN_HOST", None)


@pytest.mark.parametrize(("command", "value", "words"), [
    ("serve", "  ", "LOCALGEN_HOST is empty"),
    ("ps", "a b", "LOCALGEN_HOST 'a b' is not a host name or address: it has spaces"),
    ("ps", "gpu/box", "LOCALGEN_HOST 'gpu/box' is not a host name or address"),
    ("launch", "gpu/box", "LOCALGEN_HOST 'gpu/box' is not a host name or address"),
])
def test_a_bad_host_from_the_environment_is_named_as_that_variable(
        cli_in_process: InProcessCLI, command: str, value: str, words: str) -> None:
    """A host that is no host, set by LOCALGEN_HOST, is that variable's usage error: --host was not typed."""
    cli_in_process.env.update(LOCALGEN_HOST=value)
    try:
        r = cli_in_process(command, *(["claude", "--print-env"] if command == "launch" else []))
        one_line_usage_error(r, words)
        assert "--host" not in r.stderr.split(":", 2)[1], r.stderr
    finally:
        cli_in_process.env.pop("LOCALGEN_HOST", None)


def test_localgen_host_takes_host_port_and_v6_forms_as_ollama_host_does(cli_in_process: InProcessCLI) -> None:
    """docs/configuration.md: LOCALGEN_HOST in OLLAMA_HOST's forms, `HOST:PORT` and `[V6]:PORT` too (the `HOST`
    and `http://HOST:PORT` forms: the test above); the port there wins over LOCALGEN_PORT."""
    with socket.socket() as busy, socket.socket(socket.AF_INET6) as busy6:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        busy6.bind(("::1", 0))
        busy6.listen()
        port, port6 = busy.getsockname()[1], busy6.getsockname()[1]
        try:
            for value, said in ((f"127.0.0.1:{port}", f"127.0.0.1:{port}"), (f"[::1]:{port6}", f"[::1]:{port6}")):
                cli_in_process.env.update(LOCALGEN_HOST=value, LOCALGEN_PORT="1")
                r = cli_in_process("serve")
                assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: cannot listen on {said}: "), (
                    value, r.stderr)
        finally:
            for name in ("LOCALGEN_HOST", "LOCALGEN_PORT"):
                cli_in_process.env.pop(name, None)


@pytest.mark.parametrize(("command", "flag", "what"), [
    ("run", "--grammar", "the grammar file"), ("run", "-jf", "the JSON schema file"),
    ("run", "-j", "the JSON schema file"), ("run", "--chat-template-file", "the chat template"),
    ("chat", "--grammar", "the grammar file"), ("chat", "-jf", "the JSON schema file"),
])
def test_a_file_a_flag_names_that_is_not_utf8_is_named(cli_in_process: InProcessCLI, tmp_path: Path, command: str,
                                                       flag: str, what: str) -> None:
    # read with errors="replace", its é was U+FFFD: the model constrained to what the user never wrote
    bad = tmp_path / "caf.txt"
    bad.write_bytes(b'{"const": "caf\xe9"}\n' if "JSON" in what else
                    b'root ::= "caf\xe9"\n' if "grammar" in what else b"{% for m in messages %}\xe9{% endfor %}")
    r = cli_in_process(command, flag, str(bad), "-p", "hi", "-n", "1") if command == "run" else \
        cli_in_process(command, flag, str(bad), input="hi\n")
    one_line_usage_error(r, f"{what} {bad} is not UTF-8 text: byte 0xe9 on line")


def test_a_modelfile_that_is_not_utf8_is_named(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    bad = tmp_path / "Modelfile"
    bad.write_bytes(b"FROM smollm2:135m\nSYSTEM caf\xe9\n")
    one_line_usage_error(cli_in_process("create", "bad-bytes", "-f", str(bad)),
                         f"the Modelfile {bad} is not UTF-8 text: byte 0xe9 on line")


@pytest.mark.parametrize("flags", [["--template", "--json"], ["--json", "--modelfile"], ["--template", "--modelfile"],
                                   ["--template", "--sha256"], ["--modelfile", "--sha256"],
                                   ["--template", "--mmproj", "/dev/null"]])
def test_show_refuses_flags_it_cannot_both_honour(cli_in_process: InProcessCLI, flags: list[str]) -> None:
    # each of these printed one view and dropped the other flag without a word
    one_line_usage_error(cli_in_process("show", "smollm2:135m", *flags), flags[0], flags[1])


def test_show_template_prints_the_template_alone(cli_in_process: InProcessCLI) -> None:
    """models.md: `show NAME` is the header; `--template` the chat template alone (--json holds it too)."""
    doc = json.loads(cli_in_process("show", "smollm2:135m", "--json").stdout)
    r = cli_in_process("show", "smollm2:135m", "--template")
    assert r.returncode == 0 and r.stdout == doc["chat_template"] + "\n" and "architecture" not in r.stdout
    page = (Path(__file__).parent.parent / "docs" / "models.md").read_text(encoding="utf-8")
    assert "localgen show smollm2:135m --template      # the chat template alone, whole" in page


@pytest.mark.parametrize(("args", "said"), [
    (["run", "-m", "", "-p", "hi"], "-m is empty"),
    (["run", "-m", "  ", "-p", "hi"], "-m is empty"),
    (["chat", "-m", ""], "-m is empty"),
    (["embed", "-m", "", "hi"], "empty model name"),
    (["show", ""], "empty model name"),
    (["pull", ""], "empty model name"),
    (["rm", "", "--yes"], "empty model name"),
    (["bench", "-m", "", "-p", "8", "-n", "1", "-r", "1"], "--model is empty"),
    (["bench", "--cache-type-k", "", "-p", "8", "-n", "1", "-r", "1"], "--cache-type-k is empty"),
    (["embed", "--store", "", "hi"], "--store is empty"),
    (["embed", "--replace", "--store", "", "hi"], "--store is empty"),
    (["logs", "-q", ""], "-q is empty"),
    (["logs", "--cid", ""], "--cid is empty"),
    (["logs", "-m", ""], "-m is empty"),
    (["run", "--stop", "", "-p", "hi"], "--stop is empty"),
    (["run", "--stop", "x", "--stop", "", "-p", "hi"], "--stop is empty"),
    (["run", "--cid", "", "-p", "hi"], "--cid is empty"),
    (["run", "--api-key-env", "", "-p", "hi"], "--api-key-env is empty"),
    (["run", "--mcp", "", "--yes", "-p", "hi"], "--mcp is empty"),
    (["run", "-j", "", "-p", "hi"], "-j/--json-schema is empty"),  # free text, as if no schema had been asked
    (["chat", "-j", " ", "-n", "1"], "-j/--json-schema is empty"),
    (["run", "--lora", "", "-p", "hi"], "--lora is empty"),
    (["run", "--lora-scaled", "", "-p", "hi"], "--lora-scaled is empty"),
    (["run", "--draft", "", "-p", "hi"], "--draft is empty"),
    (["chat", ""], "the conversation name is empty"),
    (["chat", "--resume", ""], "the conversation name is empty"),
    (["serve", "--cors", ""], "--cors is empty"),
    (["rerank", "", "a document"], "the query is empty"),
    (["similar", "notes", " "], "the query is empty"),
    (["bench", "--chunks", "4", "-p", "8", "-n", "1", "-r", "1"], "--chunks is for --quality"),
    (["bench", "--kld-bound", "0.1", "-p", "8", "-n", "1", "-r", "1"], "--kld-bound is for --quality"),
])
def test_an_empty_value_is_not_taken_for_none_given(cli_in_process: InProcessCLI, args: list[str], said: str) -> None:
    # each was taken as if the flag were left out: the default model, no filter, nothing stored, no stop string
    one_line_usage_error(cli_in_process(*args, input="hi\n"), said)


def test_an_empty_environment_variable_is_still_none_given(cli_in_process: InProcessCLI) -> None:
    """LOCALGEN_MODEL= (set, empty) names no model, as Click reads an empty variable: the default, no error."""
    r = InProcessCLI({**cli_in_process.env, "LOCALGEN_MODEL": ""})("fit", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["model"]["name"] == "smollm2:135m", r.stderr


def test_an_unknown_flag_is_offered_only_flags_close_to_it(cli_in_process: InProcessCLI) -> None:
    """A typo gets the flag it meant; a word like none of them gets no guess (Click offered --verbose for --bogus
    and --lora, --prompt, -ot for --port: its likeness counted their dashes)."""
    r = cli_in_process("run", "--temprature", "1", "hi")
    one_line_usage_error(r, "No such option: --temprature (Possible options: --temperature)")
    for typed in ("--bogus", "--port"):
        r = cli_in_process("run", typed, "1", "hi")
        assert r.stderr == f"localgen: error: No such option: {typed} (see 'localgen run --help')\n", r.stderr


def test_bench_compare_names_its_arguments(cli_in_process: InProcessCLI) -> None:
    one_line_usage_error(cli_in_process("bench", "compare", "abc", "1"), "RUN_A: 'abc' is not a valid integer")
    one_line_usage_error(cli_in_process("bench", "compare", "1"), "Missing argument 'RUN_B'")


@pytest.mark.parametrize(("base", "hint"), [
    ("nosuch", "(see `localgen list --catalogue`; or give owner/repo or a .gguf path)"),  # no pull could fetch it
    ("nosuch.gguf", None),  # a file that is not there: nothing to pull
    ("someone/nosuch-GGUF", "(pull it first: localgen pull someone/nosuch-GGUF)"),  # a Hub repo pull can fetch
])
def test_cp_suggests_pull_only_for_what_pull_can_fetch(cli_in_process: InProcessCLI, base: str,
                                                       hint: str | None) -> None:
    r = cli_in_process("cp", base, "copied")
    code = 2 if base.endswith(".gguf") else 1  # a path to nothing: a usage error, as -m's (tests/test_cli_nits.py)
    assert r.returncode == code and r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error: cp: "), \
        r.stderr
    assert base in r.stderr and "FROM" not in r.stderr, r.stderr  # (cp has no FROM line: it said "cp: FROM nosuch")
    assert (hint in r.stderr) if hint else ("(" not in r.stderr), r.stderr
    assert ("localgen pull" in r.stderr) == (hint is not None and "pull it first" in hint), r.stderr


def test_a_model_given_where_ollama_puts_it_gets_a_hint_to_name_it_with_m(cli_in_process: InProcessCLI) -> None:
    """`localgen run MODEL PROMPT` and `localgen chat MODEL`, as `ollama run` is typed: a usage error whose hint
    names -m; a prompt of two words with no model-like first one gets none."""
    r = cli_in_process("run", "smollm2:135m", "Why is the sky blue?", "-n", "4")
    assert r.returncode == 2 and r.stderr.endswith(
        "(the model is named with -m: localgen run -m smollm2:135m \"PROMPT\")\n"), r.stderr
    r = cli_in_process("chat", "smollm2:135m", input="hi\n")
    assert r.returncode == 2 and r.stderr.endswith(
        "names a model, not a conversation: the model is named with -m (localgen chat -m smollm2:135m; with -m, "
        "NAME names the conversation)\n"), r.stderr
    r = cli_in_process("run", "hello", "world")
    assert r.returncode == 2 and "-m" not in r.stderr, r.stderr
    r = cli_in_process("run", "llama3.2", "Why is the sky blue?")  # a family's name: its models, in the hint
    assert r.returncode == 2 and r.stderr.endswith(
        "(the model is named with -m: localgen run -m llama3.2:1b \"PROMPT\" or -m llama3.2:3b)\n"), r.stderr
    # `ollama run MODEL` with no prompt: the name is refused as a prompt (it went to the model), before any load
    for word, hint in (("smollm2:135m", 'localgen run -m smollm2:135m "PROMPT"; localgen chat -m smollm2:135m'),
                       ("smollm2", 'localgen run -m smollm2:135m "PROMPT" or -m smollm2:1.7b;')):
        r = cli_in_process("run", word, "-n", "2")
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"localgen: error: {word} names a model, not a prompt: ") and hint in r.stderr
    r = cli_in_process("run", "-m", "smollm2:135m", "smollm2", "-n", "2")  # with -m, the word is the prompt
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = cli_in_process("run", "gemma3", "-n", "2")  # a family's models smallest first; -p sends the word
    assert r.returncode == 2 and '-m gemma3:270m "PROMPT" or -m gemma3:1b or -m gemma3:4b or -m gemma3:12b;' in \
        r.stderr and r.stderr.endswith("; -p gemma3 sends the word as the prompt)\n"), r.stderr
    r = cli_in_process("run", "-p", "smollm2", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    # `chat llama3.2` (a family, a catalogue name with no colon, a preset): it chatted with the default model in a
    # conversation of that name, as troubleshooting.md says it does not; with -m, the name is the conversation's
    r = cli_in_process("chat", "llama3.2", "-n", "2", input="hi\n")
    assert r.returncode == 2 and r.stdout == "" and r.stderr == (
        "localgen: error: llama3.2 names a model, not a conversation: the model is named with -m (localgen chat -m "
        "llama3.2:1b or -m llama3.2:3b; with -m, NAME names the conversation)\n"), r.stderr
    r = cli_in_process("chat", "-m", "smollm2:135m", "smollm2", "-n", "2", input="hi\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = cli_in_process("chat", "smollm2", "-n", "2", input="more\n")  # that conversation, saved: the way to go on
    assert r.returncode == 2 and r.stderr == ("localgen: error: a conversation named 'smollm2' exists (continue it "
                                              "with --resume smollm2)\n"), r.stderr


@pytest.mark.parametrize(("args", "stdin", "what"), [
    (["-p", "   "], "", "the prompt is"),
    (["\n\t "], "", "the prompt is"),
    ([], "  \n\n", "stdin is"),
    (["-p", " "], " \n", "the prompt and stdin are"),
])
def test_a_prompt_of_only_whitespace_is_a_usage_error(cli_in_process: InProcessCLI, args: list[str], stdin: str,
                                                      what: str) -> None:
    """A blank prompt was sent to the model as it was; `-p ""` says "no prompt", so a blank one says so too."""
    r = cli_in_process("run", "-m", "/nonexistent.gguf", *args, input=stdin)
    one_line_usage_error(r, f"{what} only whitespace: there is no prompt")


def test_a_lone_document_of_only_whitespace_is_a_usage_error(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    r = cli_in_process("run", "-m", "/nonexistent.gguf", "-f", str(blank))
    one_line_usage_error(r, f"-f {blank} is only whitespace")
    # a blank question after text piped in, or after a document, is not refused: they are the prompt
    (tmp_path / "notes.txt").write_text("The cat sat on the mat.\n")
    # nor with a picture: it is the prompt, and the text may be blank or empty (it was "no prompt" with -p "")
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    red = tmp_path / "red.png"
    red.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00\xff\x00\x00" * 2)) + chunk(b"IEND", b""))
    for args, stdin in ((["-p", " "], "Name a color.\n"), (["-f", str(tmp_path / "notes.txt"), "-p", " "], ""),
                        (["--image", str(red), "-p", ""], ""), (["--image", str(red), "-p", "  "], ""),
                        (["--image", str(red)], ""), (["--image", str(red), "-f", str(blank)], "")):
        r = cli_in_process("run", "-m", "/nonexistent.gguf", *args, input=stdin)
        assert r.returncode == 2 and "-m/--model /nonexistent.gguf: no such file" in r.stderr, r.stderr


@pytest.mark.parametrize(("args", "env", "said"), [
    (("run", "-p", "hi", "--logprobs", "30"), {}, "--logprobs must be within 0 to 20, not 30"),
    (("run", "-p", "hi", "--logprobs=-3"), {}, "--logprobs must be within 0 to 20, not -3"),  # as typed
    (("run", "-p", "hi", "--tool-timeout", "0"), {}, "--tool-timeout must be within 0.1 to 86400, not 0"),
    (("logs", "-n", "-1"), {}, "-n must be at least 0, not -1"),  # the name the user typed
    (("fit", "-m", "smollm2:135m", "--ctx-size", "-5"), {}, "--ctx-size must be at least 0, not -5"),
    (("fit", "-m", "smollm2:135m"), {"LOCALGEN_CTX": "-1"}, "LOCALGEN_CTX must be at least 0, not -1"),
    (("ps",), {"LOCALGEN_PORT": "0"}, "LOCALGEN_PORT must be within 1 to 65535, not 0"),  # no --port typed
    (("ps", "--port", "70000"), {"LOCALGEN_PORT": "0"}, "--port must be within 1 to 65535, not 70000"),
    (("fit", "-m", "smollm2:135m", "-c-1"), {"LOCALGEN_CTX": "100"}, "-c must be at least 0, not -1"),  # joined
    (("serve", "--port", "abc"), {}, "--port: 'abc' is not a valid integer"),  # Click's other "Invalid value"s too
    (("run", "--ctx", "100", "-c", "abc", "hi"), {}, "-c: 'abc' is not a valid integer"),  # the spelling whose value
    # Click kept: the last given
    (("run", "--temp", "x", "hi"), {}, "--temp: 'x' is not a valid number"),
    (("ps",), {"LOCALGEN_PORT": "x"}, "LOCALGEN_PORT: 'x' is not a valid integer"),
])
def test_a_value_past_a_flags_range_is_said_as_localgen_says_it(cli_in_process: InProcessCLI, args: tuple[str, ...],
                                                                  env: dict[str, str], said: str) -> None:
    """A flag's value out of its range: "--logprobs must be within 0 to 20, not 30", as a setting's is said, naming
    the flag as typed or the environment variable it came from (it was Click's "Invalid value for '--ctx' /
    '--ctx-size' / '-c' (env var: 'LOCALGEN_CTX'): -1 is not in the range 0<=x.")."""
    cli_in_process.env.update(env)
    try:
        r = cli_in_process(*args)
    finally:
        for name in env:
            cli_in_process.env[name] = None
    one_line_usage_error(r, f"localgen: error: {said} (see 'localgen {args[0]} --help')")
    assert "Invalid value" not in r.stderr and "<=" not in r.stderr


def test_a_flag_of_other_commands_is_named_not_read_as_a_letter_and_a_value(cli_in_process: InProcessCLI) -> None:
    """llama.cpp's flags of several letters after one dash: Click reads `tune -ngl 99` as `-n gl` (tune's --answer)
    and said "'gl' is not a valid integer". The error names the flag and the commands that have it, in the command
    Click was parsing (a group's too); a command that has it keeps Click's own message about its value."""
    one_line_usage_error(cli_in_process("tune", "-m", "smollm2:135m", "-ngl", "99"),
                         "localgen tune has no -ngl option: run, chat, serve, launch, quantize and 6 more have it (see "
                         "'localgen tune --help')")  # as run.md shows it, its count of the rest too
    one_line_usage_error(cli_in_process("list", "-np", "2"), "localgen list has no -np option: run, serve, fit and "
                                                              "tune have it")
    one_line_usage_error(cli_in_process("logs", "-ngl", "9", "on"), "localgen logs has no -ngl option: ")
    one_line_usage_error(cli_in_process("run", "-p", "hi", "-ngl", "x"), "error: -ngl: 'x' is not a valid integer")
    # an error about something else is Click's: a word read right, a group's own flag before its subcommand, an
    # option's value that looks like a flag
    one_line_usage_error(cli_in_process("tune", "-n", "x"), "'x' is not a valid integer")
    one_line_usage_error(cli_in_process("bench", "-ngl", "99", "history", "--bogus"), "No such option: --bogus")
    one_line_usage_error(cli_in_process("run", "-p", "-npl", "--temperature", "9"), "--temperature",
                         "--temperature must be within 0 to 5, not 9 (see 'localgen run --help')")
    one_line_usage_error(cli_in_process("run", "--stop", "-pg", "-p", "hi", "-n", "x"), "'x' is not a valid integer")


def test_a_flag_of_other_commands_that_click_took_is_the_hint_of_the_error_it_led_to(
        cli_in_process: InProcessCLI) -> None:
    """Where Click parsed such a word without complaint (`embed -mg 0 hi`: -m g, a model called "g"), the command's
    own error says what went wrong, and its hint names the word."""
    r = cli_in_process("embed", "-mg", "0", "hi")
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: unknown model 'g' (localgen embed has no -mg option: run, chat, "
                               "serve and bench have it)"), r.stderr
