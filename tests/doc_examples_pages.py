"""A page's home and scratch directory for tests/test_doc_examples_run.py (whose docstring says what they
hold), and the files its examples read: the page's own, another page's (SHOWN), FILES, TEXT, PROVIDED models."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from localgen.models import download
from localgen.models.catalogue import SHIPPED
from localgen.models.embedded import EMBEDDED
from tests import test_doc_examples as dx
from tests import tiny_bert, tiny_lora
from tests.conftest import CLI, ROOT
from tests.doc_examples_check import SMOLLM2, Served

if TYPE_CHECKING:
    from tests.test_doc_examples_run import Verdict

GEMMA = "gemma3:270m"

MAX_TOKENS, CTX = 4, 512
PROVIDED = {"path/to/model.gguf": "smollm2", "./model.gguf": "smollm2", "style.gguf": "lora",
            "other.gguf": "lora", "bge-reranker.gguf": "reranker"}
PRODUCERS = {"git diff": "--- a/greet.py\n+++ b/greet.py\n@@ -1 +1 @@\n-print('hi')\n+print('hello')\n"}
FILES = {  # yesno.gbnf: docs/run.md's --grammar row
    "yesno.gbnf": 'root ::= "yes" | "no"\n', "prompts.txt": "Why is the sky blue?\nName a colour.\n",
    "prompts.jsonl": '{"prompt": "Why is the sky blue?", "id": "sky", "temperature": 0.2}\n'
                     '{"prompt": "Name a colour.", "id": "colour"}\n',
    "docs.jsonl": '{"id": "cat", "text": "The cat sat on the mat."}\n{"id": "car", "text": "The car needs tyres."}\n',
    "reviews.tsv": "1\tGreat product, works well.\n2\tBroke after a day.\n",
    "report.md": "# Report\n\n## Results\n\nSales rose.\n\n## Conclusions\n\nSales rose by 5 percent.\n",
    "key.txt": "sk-local-docs\n",  # serve's --api-key-file
    # docs/tools.md's config file of MCP servers: the test server, by this interpreter (no `python` on PATH here)
    "mcp.json": json.dumps({"mcpServers": {"calc": {"command": sys.executable,
                                                    "args": [str(ROOT / "tests" / "mcp_server.py")]}}}),
}
TEXT = "The cat sat on the mat. It was a sunny day.\n"  # any other .txt or .md: notes, a question, a prompt


def page_files(page: str) -> list[tuple[int, str, str]]:
    """(line, name, content) of each file the page writes: `cat > F <<'X'` here-documents, `printf '...' > F`,
    and a Modelfile shown as a text block (one whose first instruction is FROM)."""
    out: list[tuple[int, str, str]] = []
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"cat > (\S+) <<-?'?(\w+)'?\s*$", line):
            out.append((i + 1, m[1], "\n".join(lines[i + 1:lines.index(m[2], i + 1)]) + "\n"))
        elif m := re.match(r"(?:\$ )?printf ('[^']*') > (\S+)(?:\s+#.*)?\s*$", line):  # `$ `: a console block
            out.append((i + 1, m[2], shlex.split(m[1])[0].encode().decode("unicode_escape")))
        elif line.strip() == "```text":
            block = lines[i + 1:lines.index("```", i + 1)]
            if next((b for b in block if b and not b.startswith("#")), "").startswith("FROM "):
                out.append((i + 1, "Modelfile", "\n".join(block) + "\n"))
    return out


# the files the docs show, the first page's where two show one
SHOWN = {name: text for doc in reversed(dx.DOCS) for _, name, text in page_files(str(doc.relative_to(ROOT)))}


@dataclass
class Page:
    """A page's home, scratch directory and CLI; `written`: the line up to which the page's files are written."""

    home: Path
    work: Path
    cli: CLI
    provide: Callable[[str, Path], None]
    written: int = 0
    given: str = ""  # the latest example's stdin
    server: Served | None = None  # a serve example's, left up for the ps after it (doc_examples_check.kept)
    found: str | None = None  # the conversation a `logs -q` just run found first: ID in the next example run

    def prepare(self, v: Verdict) -> None:
        """The files the example reads (and a Modelfile's ADAPTER), as the page has them at its line."""
        for line, name, text in page_files(v.page):
            if self.written < line <= v.line:
                (self.work / name).write_text(text)
        self.written = v.line
        words = [*v.argv, *shlex.split(v.producer or ""), v.infile or ""]
        words += (self.work / "Modelfile").read_text().split() if (self.work / "Modelfile").exists() else []
        for part in (p for w in words for p in re.split(r"[,=]", w)):
            self.make(re.sub(r":[\d.]+$", "", part))  # `--lora-scaled style.gguf:0.5,other.gguf:1`
        for part in (p for w in v.argv if " " in w for p in shlex.split(w)):  # `--mcp ".venv/bin/python x.py"`
            top = Path(part).parts[0] if part and not part.startswith(("/", "~")) else ""
            if top and (ROOT / part).exists() and not (self.work / top).exists():
                (self.work / top).symlink_to(ROOT / top)  # the checkout's, as a reader at its root has them

    def assemble_gemma(self) -> None:
        """Gemma assembled already in the page's home, as a machine has it after Gemma's first use: the session
        home's copy linked (`provide`), not a 250 MB copy per page (tests/test_habits.py and test_promises.py
        test the assembling)."""
        assembled = self.home / "data" / "embedded" / EMBEDDED[GEMMA].filename
        if not assembled.exists():
            self.provide("gemma", assembled)

    def make(self, name: str) -> None:
        path, top = self.work / name, Path(name).parts[0] if name else ""
        if dx.FILE_ARG.match(name) and (ROOT / name).exists() and not (self.work / top).exists():
            (self.work / top).symlink_to(ROOT / top)  # the checkout's (`tests/...`): the docs run from one
        if not dx.FILE_ARG.match(name) or name.startswith(("/", "~")) or path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if name in PROVIDED:
            self.provide(PROVIDED[name], path)
        elif name in SHOWN or name in FILES or path.suffix in (".txt", ".md"):
            path.write_text(SHOWN.get(name) or FILES.get(name) or TEXT)
        else:
            raise AssertionError(f"no content for {name}: add it to FILES")

    def stdin(self, v: Verdict) -> str:
        if v.infile:
            return (self.work / v.infile).read_text()
        if v.producer:
            return PRODUCERS.get(v.producer) or subprocess.run(
                ["bash", "-c", v.producer], cwd=self.work, capture_output=True, text=True, check=True).stdout
        return f"/set max_tokens {MAX_TOKENS}\nHi\n" if v.argv[0] == "chat" else ""

    def last_conversation(self) -> str:
        with sqlite3.connect(self.home / "data" / "logs" / "logs.db") as db:
            return str(db.execute("SELECT conversation_id FROM responses ORDER BY datetime_utc DESC, id DESC "
                                  "LIMIT 1").fetchone()[0])


def bounded_catalogue(home: Path) -> None:
    """The user catalogue: the shipped smollm2:135m entry, its sampling settings and max_tokens = MAX_TOKENS."""
    entry = re.search(rf'^\[models\."{SMOLLM2}"\]\n(?:[^\[\n].*\n)*', SHIPPED.read_text(), re.M)
    text, n = re.subn(r"(?m)^sampling = \{ (.*) \}$", rf"sampling = {{ \1, max_tokens = {MAX_TOKENS} }}", entry[0])
    assert n == 1 and tomllib.loads(text)["models"][SMOLLM2]["sampling"]["max_tokens"] == MAX_TOKENS, text
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.toml").write_text(text)


def provider(smollm2_path: Path, shared: Path) -> Callable[[str, Path], None]:
    """Puts a PROVIDED kind of model at a path (a link to it, each built once in `shared`), or Gemma: the
    session home's copy, assembled and checked there (as conftest's gemma_path has it), and remembered as
    checked by the page's home; nothing where Gemma is not installed (an example that names it then fails as
    a user's would, and is marked `gemma`)."""

    @functools.cache
    def built(kind: str) -> Path | None:
        if kind == "lora":
            return tiny_lora.build(smollm2_path, shared / "lora.gguf")
        if kind == "reranker":
            return tiny_bert.build(shared / "rerank.gguf", rank=True)
        if kind == "smollm2":
            return smollm2_path
        from localgen.errors import ModelNotFoundError
        from localgen.models.resolve import resolve

        with contextlib.suppress(ModelNotFoundError):
            return Path(resolve(GEMMA).path)
        return None

    def provide(kind: str, path: Path) -> None:
        if (target := built(kind)) is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        if kind == "gemma":
            with mock.patch.dict(os.environ, LOCALGEN_HOME=str(path.parents[2])):
                download.mark_verified(path)

    return provide
