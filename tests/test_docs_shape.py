"""The docs site keeps the Diátaxis shape (issue #61, item 5): mkdocs.yml's nav has exactly four sections (a
tutorial, how-to guides, reference, explanation), the home page links each how-to guide, benchmarks.md holds
tables that each carry their date, machine and command and reads as no lab diary, no page sends a reader
to a file outside the repository, and every option of every command is on its page or a page it links."""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.conftest import ROOT

DOCS = ROOT / "docs"
SECTIONS = ["Tutorial", "How-to guides", "Reference", "Explanation"]
HOWTOS = {"agents.md", "team.md", "quantize-choose.md", "ci.md", "bigger-engine.md"}  # issue #61's five tasks
EXPLANATIONS = {"ARCHITECTURE.md", "exactness.md", "caches.md"}
BENCHMARKS = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"2 CPU cores|2-core|H100|CPU only")
COMMAND = re.compile(r"`(?:time )?(?:\.venv/bin/python )?(?:scripts/|localgen |llama-\w+ )[^`]*`|```sh")
# what a lab diary says: times of day, sessions, trees by commit, what was tried and dropped, plans
DIARY = re.compile(r"\b(?:morning|afternoon|evening|session|sessions|not adopted|tried and left out|not yet|"
                   r"for later|we will|will be|TODO|next step)\b|^\| [0-9a-f]{7}\b|\btree [0-9a-f]{7}\b",
                   re.I | re.M)
INTERNALS = re.compile(r"OpenMP|ubatch|llama_decode|KV cells|sampler chain|thread team", re.I)  # for Explanation
OUTSIDE = re.compile(r"\.\./shared|/work/|/tmp/[\w-]*build")


def _nav() -> list[dict[str, Any]]:
    nav: list[dict[str, Any]] = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return nav


def _pages(entry: Any) -> list[str]:
    """The page files under a nav entry, at any depth."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [p for e in entry for p in _pages(e)]
    return [p for v in entry.values() for p in _pages(v)]


def test_the_nav_has_exactly_the_four_sections() -> None:
    nav = _nav()
    assert [next(iter(e)) for e in nav] == SECTIONS
    by = {name: set(_pages(pages)) for e in nav for name, pages in e.items()}
    assert {"index.md", "tutorial.md"} <= by["Tutorial"]
    assert by["How-to guides"] >= HOWTOS
    assert by["Explanation"] == EXPLANATIONS
    assert {"run.md", "serve.md", "api.md", "configuration.md", "models.md"} <= by["Reference"]
    assert "ARCHITECTURE.md" not in by["Reference"] | by["How-to guides"]


def test_the_home_page_links_each_how_to_guide() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    guides = {p for e in _nav() for name, pages in e.items() if name == "How-to guides" for p in _pages(pages)}
    assert guides >= HOWTOS
    for page in guides:
        assert f"]({page})" in index, f"index.md does not link {page}"


def test_the_how_to_guides_and_the_tutorial_keep_internals_out() -> None:
    guides = {p for e in _nav() for name, pages in e.items() if name in ("How-to guides", "Tutorial")
              for p in _pages(pages)}
    for page in guides:
        found = INTERNALS.findall((DOCS / page).read_text(encoding="utf-8"))
        assert not found, (page, found)
    assert INTERNALS.search("the CPU backend's OpenMP keeps a team of threads per calling thread")


def _tables() -> list[tuple[str, str, str]]:
    """(heading, the section's text, the table) for each table of benchmarks.md."""
    out = []
    sections = re.split(r"(?m)^(#{1,3} .*)$", BENCHMARKS)
    for heading, body in zip(sections[1::2], sections[2::2], strict=True):
        for m in re.finditer(r"(?m)(?:^\|.*\n)+", body):
            if re.search(r"(?m)^\| ?-{3}", m[0]):
                out.append((heading, body, m[0]))
    return out


def test_benchmarks_has_tables() -> None:
    assert len(_tables()) >= 15


@pytest.mark.parametrize(("heading", "section", "table"), _tables(), ids=[f"{h} {i}" for i, (h, _, _) in
                                                                        enumerate(_tables())])
def test_each_benchmark_table_says_its_date_machine_and_command(heading: str, section: str, table: str) -> None:
    """The section of each table says when (a date), where (a machine) and how (a command: a script of
    scripts/, a localgen or llama.cpp command, or a shell block). The one table without commands, figures
    that code comments quoted, says that how each was timed was not recorded."""
    assert DATE.search(section), f"{heading}: no date"
    assert MACHINE.search(section), f"{heading}: no machine"
    if heading == "## Costs noted in the code":
        assert "how each was timed (the command) was not recorded" in section
        assert all(DATE.search(row) for row in table.splitlines()[2:]), "each cost has its date"
    else:
        assert COMMAND.search(section), f"{heading}: no command"


def test_every_section_the_code_points_at_is_there() -> None:
    """Code comments say why and point at the section of benchmarks.md that holds the figure
    (`docs/benchmarks.md, Costs inside a step`): each such section is there."""
    headings = [h.lstrip("# ") for h in re.findall(r"(?m)^#{2,3} .*$", BENCHMARKS)]
    named = {m[1].rstrip(".`").strip() for path in [*(ROOT / "localgen").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
             for m in re.finditer(r'docs/benchmarks\.md,? "?([A-Z`][^";)\n]*)', path.read_text(encoding="utf-8"))}
    assert len(named) >= 8, named
    missing = [n for n in named if not any(h.startswith(n) for h in headings)]
    assert not missing, missing


def test_the_architecture_page_names_every_module() -> None:
    """docs/ARCHITECTURE.md is the map of the code: each module of localgen/ is named there, by its file name
    (`fit.py`) or its path (`models/fit`), so a module added without a word on the page is caught (the packages
    table alone is abridged)."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    modules = [p for p in (ROOT / "localgen").rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 100, len(modules)

    shared = {name for name, count in collections.Counter(p.name for p in modules).items() if count > 1}
    rows = {line.split(" | ")[0].strip("| `").split("/")[1] or "top": line for line in page.splitlines()
            if line.startswith("| `localgen/")}  # the packages table: `localgen/cli/`, ..., `localgen/` top

    def named(module: Path) -> bool:
        """By its path (`models/fit`, `cli/run/plan.py`, or below its package: `run/plan.py`); by its bare file
        name where no other module has that name, or in its package's row of the table (`command.py`, one of
        many, names none elsewhere)."""
        parts = module.relative_to(ROOT / "localgen").with_suffix("").parts
        spellings = ["/".join(parts[k:]) for k in range(len(parts) - 1)]
        spellings += [s + ".py" for s in spellings] + ([module.name] if module.name not in shared else [])
        if re.search(rf"(?<![\w./])({'|'.join(map(re.escape, spellings))})\b", page):
            return True
        return f"`{module.name}`" in rows[parts[0] if len(parts) > 1 else "top"]

    unnamed = sorted(str(p.relative_to(ROOT)) for p in modules if not named(p))
    assert not unnamed, unnamed


def test_benchmarks_is_no_diary() -> None:
    found = [m[0] for m in DIARY.finditer(BENCHMARKS)]
    assert not found, found


def test_the_diary_check_has_teeth() -> None:
    """Lines of the page as it read before (issue #61): each is caught."""
    for line in ("| 7c8a59c (evening): cheaper tests again | 991 |", "Again 2026-11-26, evening (the same command",
                 "A GPU is lent to a session for 15 minutes", "Neither was adopted. Not adopted then.",
                 "Before this (tree de7281c), every run evaluated the tools again."):
        assert DIARY.search(line), line
    assert not DIARY.search("commit 0c1e570 of llama.cpp; later ones reuse the prefix")


@pytest.mark.parametrize("page", sorted([ROOT / "README.md", *DOCS.glob("*.md")]), ids=lambda p: p.name)
def test_no_step_points_outside_the_repository(page: Any) -> None:
    text = page.read_text(encoding="utf-8")
    assert not OUTSIDE.search(text), OUTSIDE.findall(text)


# each command's page (where a reader looks first); an option not named there must be on a page it links
COMMAND_PAGES = {"run": "run.md", "chat": "chat.md", "serve": "serve.md", "ps": "serve.md", "pull": "models.md",
                 "list": "models.md", "show": "models.md", "rm": "models.md", "create": "models.md", "cp": "models.md",
                 "quantize": "quantize.md", "perplexity": "perplexity.md", "bench": "bench.md", "fit": "fit.md",
                 "doctor": "doctor.md", "tune": "tune.md", "logs": "logs.md", "embed": "embed.md",
                 "similar": "embed.md", "rerank": "embed.md", "collections": "embed.md", "rpc-server": "rpc.md",
                 "launch": "agents.md", "stop": "serve.md"}


def _options(cmd: Any, path: str) -> list[tuple[str, list[str]]]:
    """(the command's words, each shown option's flags), its subcommands' too."""
    found = [(path, [*p.opts, *p.secondary_opts]) for p in cmd.params
             if p.param_type_name == "option" and not p.hidden and "--help" not in p.opts]
    for name, sub in getattr(cmd, "commands", {}).items():
        found += _options(sub, f"{path} {name}")
    return found


def _undocumented(docs: Path) -> list[str]:
    """Each option of `localgen COMMAND --help` that neither the command's page nor a page it links names in its
    code (fenced blocks and inline code spans)."""
    import typer

    from localgen.cli import app, params

    def code(page: str) -> str:
        return " ".join(re.findall(r"```.*?```|`[^`\n]+`", (docs / page).read_text(encoding="utf-8"), re.S))

    params.install()
    root = typer.main.get_command(app.build())
    missing = []
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        page = COMMAND_PAGES[name]
        linked = {page, *re.findall(r"\]\(([\w-]+\.md)(?:#[^)]*)?\)", (docs / page).read_text(encoding="utf-8"))}
        texts = [code(p) for p in linked]
        for words, flags in _options(cmd, name):
            if not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", t) for f in flags for t in texts):
                missing.append(f"{words} {flags[0]} (on {page} or a page it links)")
    return missing


def test_every_option_is_on_its_commands_page_or_one_it_links() -> None:
    """`localgen COMMAND --help`'s options each appear (in code) on the command's page, or on a page that page
    links (run.md's options for chat and serve, media.md for serve's image flags, ...)."""
    from localgen.cli.app import COMMANDS

    assert set(COMMAND_PAGES) == set(COMMANDS)
    assert _undocumented(DOCS) == []


def _table_flags(page: str) -> list[str]:
    """Each spelling of an option (`-sys`, `--system-prompt`, `--no-think`) in the first column of a page's
    `| option | default | meaning |` table."""
    text = (DOCS / page).read_text(encoding="utf-8")
    table = text.split("| option | default | meaning |\n| --- | --- | --- |\n")[1].split("\n\n")[0]
    firsts = [re.split(r"(?<!\\)\|", row)[1] for row in table.splitlines()]
    return [flag for cell in firsts for span in re.findall(r"`([^`]+)`", cell)
            for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", span)]


@pytest.mark.parametrize(("command", "page"), [("run", "run.md"), ("fit", "fit.md")])
def test_every_option_in_a_pages_option_table_is_an_option_of_its_command(command: str, page: str) -> None:
    """docs → CLI: each spelling an option table shows (run.md's `--system, --system-prompt, -sys TEXT`, say) is
    one `localgen COMMAND` takes, an alias or an off-spelling included (the check above goes CLI → docs)."""
    import typer

    from localgen.cli import app, params

    params.install()
    cmd = typer.main.get_command(app.build()).commands[command]  # type: ignore[attr-defined]
    taken = {f for p in cmd.params for f in (*p.opts, *p.secondary_opts)}
    shown = _table_flags(page)
    assert len(shown) > 20 if command == "run" else len(shown) > 3, shown
    assert [f for f in shown if f not in taken] == []
    if command == "run":
        assert {"--system", "--system-prompt", "-sys", "--no-think", "--no-prompt-cache"} <= set(shown)


def test_the_documented_options_check_has_teeth(tmp_path: Path) -> None:
    """A page that stops naming an option, or stops linking the page that does, fails the check."""
    for page in DOCS.glob("*.md"):
        (tmp_path / page.name).write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    serve = (tmp_path / "serve.md").read_text(encoding="utf-8")
    media = serve[serve.index("- **Images and audio**"):serve.index("(media.md).") + len("(media.md).")]
    (tmp_path / "serve.md").write_text(serve.replace(media, ""), encoding="utf-8")
    chat = (tmp_path / "chat.md").read_text(encoding="utf-8")
    (tmp_path / "chat.md").write_text(chat.replace("](run.md#options)", "]"), encoding="utf-8")
    missing = _undocumented(tmp_path)
    assert "serve --fetch-timeout (on serve.md or a page it links)" in missing
    assert "chat --top-p (on chat.md or a page it links)" in missing
    assert not [m for m in missing if not m.startswith(("serve ", "chat "))]
