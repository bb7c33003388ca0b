"""The docs site keeps the Diátaxis shape (issue #61, item 5): mkdocs.yml's nav has exactly four sections (a
tutorial, how-to guides, reference, explanation), the home page links each how-to guide, benchmarks.md holds
tables that each carry their date, machine and command and reads as no lab diary, and no page sends a reader
to a file outside the repository."""

from __future__ import annotations

import re
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
