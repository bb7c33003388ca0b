"""Small CLI faults, each a one-line usage error: an empty path given to a file flag, a FIFO given to --mcp, a
missing model file, a model name holding a byte that is not UTF-8."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import CLI, InProcessCLI

EMPTY_PATH_FLAGS = [
    ("run", "-f/--document", "-f"),
    ("run", "--file", "--file"),
    ("run", "--image", "--image"),
    ("run", "--video", "--video"),
    ("run", "--chat-template-file", "--chat-template-file"),
    ("run", "--mmproj", "--mmproj"),
    ("run", "-jf/--json-schema-file", "-jf"),
    ("chat", "--chat-template-file", "--chat-template-file"),
    ("embed", "--file", "--file"),
    ("quantize", "--imatrix", "--imatrix"),
    ("serve", "--api-key-file", "--api-key-file"),
    ("ps", "--api-key-file", "--api-key-file"),
    ("launch", "--api-key-file", "--api-key-file"),
]


@pytest.mark.parametrize(("command", "named", "flag"), EMPTY_PATH_FLAGS,
                         ids=[f"{c} {f}" for c, _, f in EMPTY_PATH_FLAGS])
def test_an_empty_path_to_a_file_flag_is_named_as_given(cli_in_process: InProcessCLI, command: str, named: str,
                                                        flag: str) -> None:
    """`FLAG ""` is an empty path, said so, as `--functions ""` is (it was `FLAG .: a folder, not a file`: Typer made
    the path "." before it was checked), a usage error before anything loads."""
    r = cli_in_process(command, flag, "", *(["m.gguf", "Q4_0"] if command == "quantize" else []))
    assert r.returncode == 2 and not r.stdout, r.stderr
    assert r.stderr == f'localgen: error: {named} "": an empty path, not a file\n', r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_an_mcp_config_file_that_is_a_fifo_is_refused_unopened(cli: CLI, tmp_path: Path) -> None:
    """`--mcp servers.json` where a FIFO is: refused before it is opened, one line and exit 2 (it hung, reading a
    pipe no one writes), and before the (missing) model is looked at; a folder there is said so too."""
    fifo = tmp_path / "servers.json"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    for path, kind in ((fifo, "a FIFO"), (folder, "a folder")):
        r = cli("run", "-m", str(tmp_path / "missing.gguf"), "--mcp", str(path), "--yes", "Go.", timeout=30)
        assert r.returncode == 2 and not r.stdout, r.stderr
        assert r.stderr == f"localgen: error: --mcp {path}: it is {kind}, not a file of MCP servers\n", r.stderr


MISSING_MODEL = [
    (["run", "-m", "{}", "-p", "hi"], "-m/--model {}: no such file"),
    (["bench", "-m", "{}", "-p", "8", "-n", "0"], "-m/--model {}: no such file"),
    (["fit", "-m", "{}"], "-m/--model {}: no such file"),
    (["show", "{}"], "no such model file: {}"),
    (["show", "--modelfile", "{}"], "no such model file: {}"),
    (["cp", "{}", "mybot"], "cp: no such model file: {}"),  # (it said "cp: FROM {}: ", a Modelfile's word)
    (["pull", "{}"], "no such model file: {}"),  # it said "{} is a local file; there is nothing to pull", exit 1
]


@pytest.mark.parametrize(("args", "said"), MISSING_MODEL, ids=[" ".join(a[:2]) for a, _ in MISSING_MODEL])
def test_a_model_path_to_nothing_is_a_usage_error_on_every_command(cli_in_process: InProcessCLI, tmp_path: Path,
                                                                   args: list[str], said: str) -> None:
    """A .gguf path with nothing there, typed as the model, is a usage error (exit 2) on every command, as -m's is:
    show and cp exited 1 (the resolver's `no such model file`); named as typed (`./m.gguf`, not `m.gguf`)."""
    for path in (str(tmp_path / "missing.gguf"), "./missing.gguf"):
        r = cli_in_process(*(a.format(path) for a in args))
        assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stderr)
        assert r.stderr == f"localgen: error: {said.format(path, path)}\n", r.stderr


def test_an_unknown_model_name_holding_a_byte_not_utf8_is_shown_readably(cli: CLI) -> None:
    """`run -m $'caf\\xe8'` (a Latin-1 terminal's café): the byte is U+FFFD in `unknown model 'caf�'`, as a preset
    name's is, where the line showed Python's `'caf\\udce8'`."""
    r = cli("run", "-m", "caf\udce8", "-p", "hi")
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.startswith("localgen: error: unknown model 'caf\ufffd' (") and r.stderr.count("\n") == 1, r.stderr
    assert "\\udce8" not in r.stderr, r.stderr


@pytest.mark.parametrize("typed, meant", [("models", "list"), ("ls", "list"), ("generate", "run"),
                                          ("Prompt", "run"), ("server", "serve")])
def test_a_peer_s_command_name_is_answered_with_localgen_s(cli_in_process: InProcessCLI, typed: str,
                                                           meant: str) -> None:
    """troubleshooting.md: `localgen models` (llm's, as `ollama ls`) names localgen's command for it; Click offered
    only names spelled alike (`ls`: logs or list; `models`: nothing). Under a group, a name is its own."""
    r = cli_in_process(typed)
    assert r.returncode == 2 and r.stderr == (f"localgen: error: No such command '{typed}': localgen's is '{meant}'. "
                                              "(see 'localgen --help')\n"), r.stderr
    r = cli_in_process("collections", "models")
    assert r.returncode == 2 and "localgen's is" not in r.stderr, r.stderr
    assert "A peer's name for a command is answered with localgen's" in " ".join(
        (Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md").read_text(encoding="utf-8").split())


def test_help_command_is_the_help(cli: CLI) -> None:
    """`localgen help` and `localgen help run` (as `ollama help`, `git help`) print what --help prints."""
    for args in ([], ["run"], ["help"]):
        r = cli("help", *args)
        args = [a for a in args if a != "help"]
        assert r.returncode == 0 and r.stdout == cli(*args, "--help").stdout and "Usage: localgen" in r.stdout, r.stderr


def test_an_empty_model_is_said_alike_by_launch_run_and_logs(cli_in_process: InProcessCLI) -> None:
    """launch -m '' said "empty model name" (once it had found a server); run's and logs' words, before anything."""
    for args in (["launch", "claude", "-m", ""], ["launch", "codex", "--model", " ", "--print-env"],
                 ["logs", "-m", ""], ["run", "-m", "", "hi"]):
        r = cli_in_process(*args)
        assert (r.returncode, r.stderr) == (2, "localgen: error: -m is empty: give a value, or leave it out\n"), args


def test_plain_tables_pad_by_terminal_cells_and_right_align_figures() -> None:
    """cli/output.aligned, which every plain table prints through (collections, list, ps, fit, bench's compare,
    quantize --ladder): a CJK character is two cells, a combining accent none; figures' columns padded on the left."""
    from localgen.cli.output import aligned

    assert aligned([["NAME", "N"], ["笔记", "7"], ["cafe\u0301", "12"]], right={1}) == [
        "NAME   N", "笔记   7", "cafe\u0301  12"]
    assert aligned([["a", "b", ""], ["ccc", "", ""]]) == ["a    b", "ccc"]  # no trailing spaces
