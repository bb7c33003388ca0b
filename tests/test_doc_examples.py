"""Every `localgen ...` command shown in the docs' fenced code blocks parses (issue #47, "docs examples that
run"): a flag renamed or removed, a value a choice no longer takes, a subcommand that moved, each fails this
suite instead of misleading a reader. The commands are parsed in-process by the real Typer/Click command
(after `normalize_argv`, as `localgen.cli.main` does), up to the point where the command body would run:
nothing is loaded, nothing touches the network, so examples that need a GPU, a server or a model that is
not installed are checked too. Here they are only parsed; tests/test_doc_examples_run.py also runs every one
this machine can run within the suite's time (57 of 120: with the embedded models, in a home per page; those
that serve until stopped, until they answer) and gives, by rule, each other one's reason (it needs a network
host, downloads, names a model not here, is a benchmark too long, needs a terminal, costs too much, or
repeats one already run).

Which lines are commands:
- blocks fenced as `sh`, `bash` or `shell`: every line (comments dropped, `\\` continuations joined,
  here-document bodies skipped);
- blocks fenced as `console`, `text` or with no language: only lines after a `$ ` prompt (the others are
  output);
- within a line, each pipeline stage or `&&`/`;`-separated command whose program is `localgen` (or a path
  ending in `/localgen`), after any leading `NAME=value` assignments (those are set in the environment for
  the parse, since they can give an option's value);
- placeholders: the generic synopsis `[options]` is dropped, and an optional part in brackets that starts
  with a flag (`[-m MODEL]`, `[--json]`) is checked as if it were given. Values in capitals (`NAME`, `ID`)
  are just values; file names are created, empty, in a scratch directory that the parse runs in, so
  options that require an existing file accept them.

The files are README.md and every page of the docs site (docs/**/*.md; a test checks that each page in
mkdocs.yml's nav is among them), and every command and subcommand must appear in some example.

Values are checked as far as the options declare them (types, ranges, choices, files that must exist);
values a command body checks itself (`bench -o`, `embed --format`) are not.

Checked by breaking it (on a copy of the old README.md, whose examples are now in docs/, parsed with this
module's functions): `chat -l` made `chat -L`, `--grammar yesno.gbnf` made `--grammer`, `bench compare 3 5`
made `bench compare 3` and `logs path` made `logs paths` each failed on exactly its line ("No such option:
-L", "Missing argument 'b'.", "No such command 'paths'"); the unchanged README passed."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
SCRIPT_LANGS = {"sh", "bash", "shell", "zsh"}
PROMPT_LANGS = {"console", "text", "", "shell-session"}
SEPARATORS = {"|", "||", "&&", ";", "&", "|&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
FILE_ARG = re.compile(r"^[\w./~-]+\.(txt|md|gbnf|gguf|jsonl|json|png|jpg|jpeg|webp|wav|mp3|flac|mp4|mov|webm|mkv|avi|"
                      r"py|jinja|csv|tsv)$")
# at least this many: a change to the extraction that silently drops most examples fails here
AT_LEAST = 60


@dataclass(frozen=True)
class Example:
    """One `localgen` command from a doc: where it is, the environment it sets, its arguments."""

    where: str
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where} localgen {' '.join(self.argv)}"


def _unplaceholder(line: str) -> str:
    line = line.replace("[options]", "")
    return re.sub(r"\[(-[^\[\]]*)\]", r"\1", line)


def _command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command text) for each shell command in the file's fenced blocks."""
    out: list[tuple[int, str]] = []
    lang: str | None = None
    heredoc: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = fence.group(1).lower() if lang is None else None
            pending = None
            continue
        if lang is None or (lang not in SCRIPT_LANGS and lang not in PROMPT_LANGS):
            continue
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        body = line.strip()
        if pending is not None:
            start, head = pending
            body = head + " " + body
        elif lang in PROMPT_LANGS:
            if not body.startswith("$ "):
                continue
            body = body[2:]
            start = number
        else:
            start = number
        if body.endswith("\\"):
            pending = (start, body[:-1])
            continue
        pending = None
        m = HEREDOC.search(body)
        if m:
            heredoc = m.group(1)
        out.append((start, body))
    return out


def _examples(path: Path) -> list[Example]:
    found: list[Example] = []
    for number, line in _command_lines(path.read_text(encoding="utf-8")):
        lex = shlex.shlex(_unplaceholder(line), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
        stages: list[list[str]] = [[]]
        for tok in tokens:
            if tok in SEPARATORS:
                stages.append([])
            else:
                stages[-1].append(tok)
        for stage in stages:
            words: list[str] = []
            skip = False
            for tok in stage:  # redirections and their targets are the shell's, not the command's
                if skip:
                    skip = False
                elif set(tok) <= set("<>&"):
                    skip = True
                else:
                    words.append(tok)
            env = []
            while words and ASSIGNMENT.match(words[0]):
                name, _, value = words.pop(0).partition("=")
                env.append((name, value))
            if words and (words[0] == "localgen" or words[0].endswith("/localgen")):
                where = f"{path.relative_to(ROOT)}:{number}"
                found.append(Example(where, tuple(env), tuple(words[1:])))
    return found


EXAMPLES = [e for doc in DOCS for e in _examples(doc)]


def test_the_docs_have_as_many_examples_as_expected() -> None:
    assert len(EXAMPLES) >= AT_LEAST, [str(e) for e in EXAMPLES]
    where = {e.where.split(":")[0] for e in EXAMPLES}
    assert "README.md" in where


def _site_pages() -> list[Path]:
    """The pages in mkdocs.yml's nav, in order (lines `- Title: page.md`, at any depth)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return [ROOT / "docs" / m.group(1) for m in re.finditer(r"^\s*-\s[^:\n]*:\s*(\S+\.md)\s*$", nav, re.M)]


def test_every_site_page_is_checked() -> None:
    """Each page of the docs site is among the files whose examples are parsed, and each docs/*.md is a page
    of the site (mkdocs build --strict also refuses a page left out of the nav)."""
    pages = _site_pages()
    assert len(pages) >= 15, pages
    assert set(pages) <= set(DOCS), sorted(set(pages) - set(DOCS))
    assert {p for p in DOCS if p.parent == ROOT / "docs"} == set(pages)


def test_every_command_has_an_example() -> None:
    """Every command and subcommand of the CLI (`localgen --help`'s list, `bench history`, `logs path`, ...)
    appears in at least one example, so a page per command cannot silently lose its examples."""
    import typer

    from localgen.cli import app

    root: Any = typer.main.get_command(app.build())
    wanted: set[tuple[str, ...]] = set()
    for name, cmd in root.commands.items():
        wanted.add((name,))
        for sub in getattr(cmd, "commands", {}):
            wanted.add((name, sub))
    shown: set[tuple[str, ...]] = {e.argv[:1] for e in EXAMPLES} | {e.argv[:2] for e in EXAMPLES}
    assert not wanted - shown, sorted(wanted - shown)


def test_every_catalogue_name_an_example_runs_is_in_the_catalogue() -> None:
    """A name shaped as the catalogue's (`family:SIZE`, `qwen2.5:7b`) that an example loads (-m, --draft) is one the
    catalogue has: README's and rpc.md's `-m qwen2.5:32b` was `unknown model` before any RPC step, on any machine.
    A model behind --endpoint is the other server's name, and `ollama:` names Ollama's."""
    from localgen.models import catalogue

    known = catalogue.shipped_names()
    unknown = [(e.where, m) for e in EXAMPLES if "--endpoint" not in e.argv
               for flag in ("-m", "--model", "--draft") for i, w in enumerate(e.argv[:-1]) if w == flag
               for m in e.argv[i + 1].split(",") if re.fullmatch(r"[a-z0-9.-]+:\d+(\.\d+)?[bm](-[a-z0-9]+)*", m)
               and m not in known]
    assert not unknown, unknown


def _parse(argv: list[str]) -> list[str]:
    """Parse `localgen ARGV` as main() would, down to the command that would run; its path comes back.
    A usage error (unknown option, missing value, bad choice, extra argument, unknown command) raises."""
    import typer

    from localgen.cli import app, params
    from localgen.cli.main import normalize_argv

    params.install()
    args = normalize_argv(list(argv))
    command: Any = typer.main.get_command(app.build())
    ctx = command.make_context("localgen", args, resilient_parsing=False)
    path = ["localgen"]
    while hasattr(command, "resolve_command") and (ctx._protected_args or ctx.args):
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
    if hasattr(command, "resolve_command") and not getattr(command, "invoke_without_command", False):
        raise AssertionError(f"{' '.join(path)} needs a subcommand")
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_every_doc_command_parses(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer import Exit
    from typer._click.exceptions import UsageError

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    for name, value in example.env:
        monkeypatch.setenv(name, value)
    work = tmp_path / "work"
    work.mkdir()
    for arg in example.argv:  # files the example names exist, so "the file does not exist" is no failure
        if FILE_ARG.match(arg) and not arg.startswith(("/", "~")):
            (work / arg).parent.mkdir(parents=True, exist_ok=True)
            (work / arg).touch()
    monkeypatch.chdir(work)
    try:
        path = _parse(list(example.argv))
    except UsageError as e:
        pytest.fail(f"{example}: {e.format_message()}")
    except Exit:
        return  # an eager option (--version) ends the parse: it parsed
    assert len(path) >= 2, f"{example}: names no command"


def test_a_renamed_flag_would_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: an option that does not exist, a missing value, a bad choice and an unknown
    command are each a usage error, and a good command is not."""
    from typer._click.exceptions import UsageError

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    assert _parse(["run", "-p", "hi", "--temperature", "0.2"]) == ["localgen", "run"]
    assert _parse(["bench", "compare", "3", "5"]) == ["localgen", "bench", "compare"]
    for bad in (["run", "-p", "hi", "--temprature", "0.2"], ["run", "-p"], ["serve", "--ctx", "many"],
                ["frobnicate"], ["bench", "histroy"], ["chat", "a", "b"]):
        with pytest.raises(UsageError):
            _parse(bad)
