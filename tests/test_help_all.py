"""`run --help` fits a screen or two (#45 item 8): run, chat and serve list the options most uses need, and
`--help-all` lists every one; a hidden option is hidden from the help only, never from parsing. In process,
through the entry point a subprocess runs."""

from __future__ import annotations

import itertools
import re

import pytest

from localgen.cli.helpall import COMMON
from tests.conftest import InProcessCLI


def _help(cli: InProcessCLI, *args: str) -> str:
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(("command", "common", "rare"), [
    ("run", ["--prompt", "--temperature", "--max-tokens", "--ctx", "--json", "--file"],
     ["--dry-multiplier", "--mirostat", "--lora", "--model-draft", "--cache-type-k", "--beams", "--functions"]),
    ("chat", ["--resume", "--temperature", "--system", "--endpoint"],
     ["--xtc-probability", "--numa", "--mirostat", "--tool-choice"]),
    ("serve", ["--port", "--parallel", "--api-key", "--max-memory", "--temperature"],
     ["--cache-ram", "--allow-image-urls", "--drain-timeout", "--rope-scaling"]),
])
def test_help_lists_the_common_options_and_help_all_every_one(cli_in_process: InProcessCLI, command: str,
                                                              common: list[str], rare: list[str]) -> None:
    cli_in_process.env["COLUMNS"] = "120"
    short = _help(cli_in_process, command, "--help")
    full = _help(cli_in_process, command, "--help-all")
    for flag in common:
        assert flag in short and flag in full, flag
    for flag in rare:
        assert flag not in short and flag in full, flag
    assert f"more options (sampling, loading and GPU, and the rest): localgen {command} --help-all" in short
    assert "--help-all" not in full
    assert len(short.splitlines()) <= 110 < len(full.splitlines())  # two screens, from over three


def test_a_hidden_option_still_parses(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run", "-p", "hi", "--dry-multiplier", "lots")
    assert r.returncode == 2 and "--dry-multiplier" in r.stderr and "No such option" not in r.stderr


def test_the_common_sets_name_real_options() -> None:
    import typer

    from localgen.cli import app

    for command, names in COMMON.items():
        params = {p.name for p in typer.main.get_command(app.build(command)).commands[command].params}  # type: ignore[attr-defined]
        assert names <= params, names - params


def _commands() -> list[tuple[list[str], object]]:
    """Every command and subcommand (bench run, logs show, ...) as its argv and click command."""
    import typer

    from localgen.cli import app

    out: list[tuple[list[str], object]] = []

    def walk(path: list[str], command: object) -> None:
        out.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk([*path, name], sub)

    walk([], typer.main.get_command(app.build()))
    return out


PYTHON_TYPES = re.compile(r"<(str|int|float|bool|list|Path|path|text|file|int range|float range)\b[^>]*>|\bx\s*[<>]=|"
                          r"[<>]=\s*x\b")


def test_help_reads_as_a_user_writes_the_command_at_80_columns(cli_in_process: InProcessCLI) -> None:
    """No Python types (`<bool>`, `<list[Path]>`, `<int range> [0<=x<=2147483647]`) but a word for a value (N,
    TEXT, FILE); no option name cut short; no line past 80 columns; and every option's description at least
    28 characters wide (Typer's layout left 22 for some)."""
    cli_in_process.env["COLUMNS"] = "80"
    narrowest: list[tuple[int, str, str]] = []
    for path, command in _commands():
        every = path[:1] in (["run"], ["chat"], ["serve"])
        out = _help(cli_in_process, *path, "--help-all" if every else "--help")
        where = " ".join(["localgen", *path])
        assert not PYTHON_TYPES.search(out), (where, PYTHON_TYPES.search(out))
        assert "…" not in out and all(len(line) <= 80 for line in out.splitlines()), where
        lines = out.splitlines()
        prose = [ln.rstrip() for ln in lines[:next(i for i, ln in enumerate(lines) if ln.startswith("╭"))]]
        for a, b in itertools.pairwise(prose):  # a paragraph wrapped, not broken where its source was
            assert not (a.strip() and b.strip() and len(a) + 1 + len(b.split()[0]) <= 79), (where, a, b)
        for p in getattr(command, "params", []):
            if p.param_type_name != "option" or p.hidden or not p.help:
                continue
            name = next(o for o in p.opts if o.startswith("--")) if any(o.startswith("--") for o in p.opts) \
                else p.opts[0]
            row = next((ln for ln in lines if re.match(rf"│ (\*)? *{re.escape(name)}( |$)", ln)), None)
            assert row is not None, (where, name, "its name whole at the start of a row")
            start = row.find(" " + p.help.split()[0], len(name) + 2)
            assert start > 0, (where, name, row)
            narrowest.append((79 - start, where, name))
    assert min(narrowest)[0] >= 28, sorted(narrowest)[:5]
    words = " ".join(re.sub(r"[│╭╰─╮╯]", " ", _help(cli_in_process, "run", "--help-all")).split())
    assert "Also --temp." in words and "On by default; --no-prompt-cache turns it off." in words, \
        "an alias and a negative flag are named in the option's help"


def test_every_argument_is_a_word_in_capitals_in_the_usage_line_and_its_error(cli_in_process: InProcessCLI) -> None:
    """`Usage: localgen show [OPTIONS] {NAME}`, as the pages write the command, and `Missing argument 'NAME'.`:
    an argument without a metavar was shown and named by its Python name (`{name}`, `'src'`, `'run_id'`)."""
    arguments = [(path, p) for path, command in _commands() for p in getattr(command, "params", [])
                 if p.param_type_name == "argument"]
    assert len(arguments) >= 20, len(arguments)
    lower = [(" ".join(path), p.name, p.metavar) for path, p in arguments
             if not p.metavar or not re.fullmatch(r"(-- )?[A-Z][A-Z_-]*", p.metavar)]
    assert not lower, lower
    usage = _help(cli_in_process, "cp", "--help")
    assert "localgen cp [OPTIONS] {SOURCE} {NAME}" in usage, usage
    r = cli_in_process("similar")
    assert r.returncode == 2 and "Missing argument 'COLLECTION'." in r.stderr, r.stderr


def test_serve_help_names_every_api_it_answers(cli_in_process: InProcessCLI) -> None:
    cli_in_process.env["COLUMNS"] = "200"
    words = " ".join(_help(cli_in_process, "serve", "--help").split())
    assert "OpenAI's API (chat completions, Responses) under /v1, Anthropic's Messages API at /v1/messages and " \
           "Ollama's API under /api" in words, words[:600]


def test_an_alias_left_out_of_the_help_still_parses_before_it(cli_in_process: InProcessCLI) -> None:
    r = cli_in_process("run", "--ctx-size", "512", "--no-prompt-cache", "--temp", "0", "--help-all")
    assert r.returncode == 0 and "Usage: localgen run" in r.stdout and r.stderr == "", r.stderr


@pytest.mark.parametrize("command", ["run", "serve"])
def test_an_off_switch_its_help_explains_is_not_said_again(cli_in_process: InProcessCLI, command: str) -> None:
    """--exact's default is chosen at run time and its help says what --no-exact does: `--help-all` adds no
    "--no-exact turns it off." after it (which, after serve's "a request may ask with "exact": true", read as if
    --no-exact refused exact requests)."""
    cli_in_process.env["COLUMNS"] = "120"
    words = " ".join(_help(cli_in_process, command, "--help-all").replace("│", " ").split())
    assert "--no-exact: " in words
    assert "--no-exact turns it off" not in words
    assert "--no-kv-unified, -no-kvu turns it off" in words  # a None default whose help does not name it keeps it


def test_serve_help_all_puts_every_server_option_in_a_panel(cli_in_process: InProcessCLI) -> None:
    """`serve --help-all`: --drain-timeout and the image-URL options sat alone beside --help in the catch-all
    "Options" panel; they are the server's."""
    cli_in_process.env["COLUMNS"] = "120"
    full = _help(cli_in_process, "serve", "--help-all")
    catch_all = full[full.index("─ Options ─"):]
    catch_all = catch_all[:catch_all.index("╰")]
    assert re.findall(r"--[a-z-]+", catch_all) == ["--help"], catch_all
    server = full[full.index("─ Server ─"):]
    server = server[:server.index("╰")]
    for flag in ("--drain-timeout", "--allow-image-urls", "--allow-private-urls", "--fetch-timeout"):
        assert flag in server, flag


def test_a_group_lists_each_command_on_one_row_its_first_sentence(cli_in_process: InProcessCLI) -> None:
    """A command's row in `localgen --help` (and bench's, logs', collections') is the first sentence of its help,
    on one line, its own --help having the rest: Typer kept the docstring's line breaks there, so `launch`'s row
    broke after "or start one" even on a wide terminal, and the list ran long with detail."""
    from localgen.cli.app import first_sentence

    cli_in_process.env["COLUMNS"] = "1000"
    for path, command in _commands():
        subs = getattr(command, "commands", {})
        if not subs:
            continue
        out = _help(cli_in_process, *path, "--help")
        panel = out[out.index("─ Commands ─"):]
        rows = [ln.strip("│ ") for ln in panel[:panel.index("╰")].splitlines()[1:]]
        assert [row.split()[0] for row in rows] == list(subs), (path, rows)
        for row, (name, sub) in zip(rows, subs.items(), strict=True):
            assert row[len(name):].strip() == first_sentence(sub.help), (path, name)
    assert first_sentence("Plan for 24 GB cards (e.g. 24GB). Then the rest.\n\nMore.") == \
        "Plan for 24 GB cards (e.g. 24GB)."
    assert first_sentence("One line\n    broken.  `x` next.") == "One line broken."
