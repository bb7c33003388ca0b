"""The command examples of README.md and the docs site, run (issue #45). tests/test_doc_examples.py extracts
and parses them all (`EXAMPLES`); this file runs each one this machine can run, and says why not of the others.

They run through the `cli` fixture as the doc shows them (argv, `NAME=value` assignments), in doc order, in a
fresh LOCALGEN_HOME and scratch directory per page, so a page's examples build on each other as a reader's
would (`create terse` before `run -m terse`, `run "My name is Ada."` before `run --cid ID`, `logs off` before
`logs on`). Each exits 0 without a traceback; _check tests what is cheap (`--json` parses, an answer is
printed, a batch answers each line, `logs --json` lists the conversation, reranked scores come best first).
- Files: the page's own where it writes one (`cat > weather.py <<'PY'`, `printf ... > Modelfile`, a
  Modelfile shown as a text block), else another page's, else FILES (`yesno.gbnf` is docs/run.md's `--grammar
  'root ::= "yes" | "no"'`) or a line of text; the checkout's paths (`tests/...`) are linked in. PROVIDED:
  `path/to/model.gguf` is SmolLM2, `style.gguf` and `other.gguf` LoRA adapters for it (tests/tiny_lora.py),
  `bge-reranker.gguf` the tiny BERT reranker (tests/tiny_bert.py). ID is the page's latest logged
  conversation, MODEL smollm2:135m. stdin: what the command piped in prints (bash runs it in the scratch
  directory; `git diff` gets a sample diff), or the file after `<`; a chat given none gets "Hi".
- Generation is bounded as a user would bound it, the examples unchanged: each home's user `models.toml`
  repeats the shipped smollm2:135m entry with `max_tokens = 4` added to its sampling settings (docs/models.md,
  "The catalogue"; presets and flags still win: `terse`'s `num_predict 3`); a chat's input starts with `/set
  max_tokens 4` (for a model given as a file, which no entry names; a resumed chat keeps it); LOCALGEN_CTX=512
  (docs/configuration.md) keeps each KV cache small. The file costs ~15 s of CPU on one core: ~30 model loads
  at ~0.5 s, most of it evaluating the prompt (~170 tokens/s).

Not run, by RULES (the first that applies; a skipped test's id says which and why): it serves until stopped;
it needs a network host (`--endpoint`, `--rpc`, LOCALGEN_ENDPOINT, `curl`, `ps`'s server); it pulls from
Hugging Face; it names a model not here (but smollm2:135m, gemma3:270m, a preset made earlier on the page and
PROVIDED files); it is a benchmark or tuning too long for the suite (its size in the reason); it needs what no
earlier example on the page made (`bench compare 3 5`, `chat --resume trip-plans`); it asks at a terminal; it
costs more than this file's budget (tool loops, `--parallel 8`); or it repeats an example already run (the
same argv, environment and stdin, or the same but for the prompt's words)."""

from __future__ import annotations

import collections
import functools
import json
import re
import shlex
import sqlite3
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localgen.models.catalogue import SHIPPED
from tests import test_doc_examples as dx
from tests import tiny_bert, tiny_lora
from tests.conftest import CLI, ROOT

SMOLLM2 = "smollm2:135m"
MAX_TOKENS, CTX = 4, 512
PROVIDED = {"path/to/model.gguf": "smollm2", "./model.gguf": "smollm2", "style.gguf": "lora",
            "other.gguf": "lora", "bge-reranker.gguf": "reranker"}
PLACEHOLDERS = {"MODEL": SMOLLM2}  # and ID, the page's latest logged conversation, known once it runs
PRODUCERS = {"git diff": "--- a/greet.py\n+++ b/greet.py\n@@ -1 +1 @@\n-print('hi')\n+print('hello')\n"}
FILES = {  # yesno.gbnf: docs/run.md's --grammar row
    "yesno.gbnf": 'root ::= "yes" | "no"\n', "prompts.txt": "Why is the sky blue?\nName a colour.\n",
    "prompts.jsonl": '{"prompt": "Why is the sky blue?", "id": "sky", "temperature": 0.2}\n'
                     '{"prompt": "Name a colour.", "id": "colour"}\n',
    "docs.jsonl": '{"id": "cat", "text": "The cat sat on the mat."}\n{"id": "car", "text": "The car needs tyres."}\n',
    "reviews.tsv": "1\tGreat product, works well.\n2\tBroke after a day.\n",
    "report.md": "# Report\n\n## Results\n\nSales rose.\n\n## Conclusions\n\nSales rose by 5 percent.\n",
}
TEXT = "The cat sat on the mat. It was a sunny day.\n"  # any other .txt or .md: notes, a question, a prompt
PREFILL_TPS, DECODE_TPS = 170, 80  # SmolLM2 on one core here (`run --stats`), for a benchmark's estimate
AT_LEAST_RUN = 50


@dataclass(frozen=True)
class Verdict:
    """One example, where its stdin comes from, and why it is not run (rule None: it runs)."""

    example: dx.Example
    producer: str | None
    infile: str | None
    rule: str | None = None
    detail: str = ""

    page = property(lambda self: self.example.where.split(":")[0])
    line = property(lambda self: int(self.example.where.split(":")[1]))
    argv = property(lambda self: tuple(PLACEHOLDERS.get(a, a) for a in self.example.argv))

    def key(self, words: bool = True) -> tuple[object, ...]:
        """The same run; without `words`, but for the prompt's words (a `-p` value, a text with a space, PROMPT)."""
        a = self.example.argv
        argv = a if words else tuple("..." if " " in x or x == "PROMPT" or a[i - 1] in ("-p", "--prompt") else x
                                     for i, x in enumerate(a))
        return self.example.env, argv, self.producer, self.infile

    def __str__(self) -> str:
        env = "".join(f"{k}={v} " for k, v in self.example.env)
        text = f"{self.example.where} {f'{self.producer} | ' if self.producer else ''}{env}localgen " + shlex.join(
            self.example.argv) + (f" < {self.infile}" if self.infile else "")
        return f"{text} [not run: {self.rule}: {self.detail}]" if self.rule else text


@dataclass
class PageState:  # what a page's examples that run have made so far
    models: set[str] = field(default_factory=lambda: {SMOLLM2, "gemma3:270m", *PROVIDED})
    chats: int = 0
    logged: int = 0


_lines = functools.cache(lambda page: dict(dx._command_lines((ROOT / page).read_text(encoding="utf-8"))))


def _stdin_source(example: dx.Example, nth: int) -> tuple[str | None, str | None]:
    """The command piped into the `nth` localgen command of the example's line, and the file after `<`."""
    page, number = example.where.split(":")
    lex = shlex.shlex(dx._unplaceholder(_lines(page)[int(number)]), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    stages: list[tuple[str | None, list[str]]] = [(None, [])]
    for tok in lex:
        if tok in dx.SEPARATORS:
            stages.append((tok, []))
        else:
            stages[-1][1].append(tok)
    ours = [i for i, (_, words) in enumerate(stages)
            if next((w for w in words if not dx.ASSIGNMENT.match(w)), "").rsplit("/", 1)[-1] == "localgen"]
    sep, words = stages[ours[nth]]
    producer = shlex.join(stages[ours[nth] - 1][1]) if sep == "|" else None
    infile = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "<"), None)
    if producer and re.fullmatch(r"cat \S+", producer):  # `cat F | localgen ...` reads what `< F` reads
        return None, producer[4:]
    return producer, infile


def _values(argv: tuple[str, ...], *flags: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in flags]


def _named_models(argv: tuple[str, ...]) -> list[str]:
    names = [n for v in _values(argv, "-m", "--model", "--draft", "--mmproj") for n in v.split(",")]
    return names + ([argv[1]] if argv[0] in ("show", "rm", "cp") and not argv[1].startswith("-") else [])


def _too_long(v: Verdict, _: PageState) -> str | None:
    argv = v.argv
    if argv[0] == "tune" and not {"--show", "--reset"} & set(argv):
        p, a = (_values(argv, "--prompt", "-p") or ["512"])[0], (_values(argv, "--answer", "-n") or ["256"])[0]
        return (f"tune measures one load setting after another on a {p}+{a}-token exchange at two depths: about "
                "a minute on 2 cores (docs/tune.md)")
    if argv[0] != "bench" or argv[1:2] in (("history",), ("compare",)):
        return None
    p, n = int((_values(argv, "-p") or ["512"])[0]), int((_values(argv, "-n") or ["128"])[0])
    models, reps = (_values(argv, "-m") or [SMOLLM2])[0].split(","), int((_values(argv, "-r") or ["5"])[0])
    sweeps = [f"{f} {x}" for f in ("-t", "-b", "-fa", "-ctk", "-d") for x in _values(argv, f) if re.search("[-,]", x)]
    return (f"{reps} repetitions of pp{p}+tg{n} on {len(models)} model(s): over "
            f"{len(models) * reps * (p / PREFILL_TPS + n / DECODE_TPS):.0f} s on one core at SmolLM2's speed"
            + "".join(f", times the settings of {x}" for x in sweeps))


def _needs_earlier(v: Verdict, state: PageState) -> str | None:
    argv = v.argv
    if argv[:2] == ("bench", "compare"):
        return f"compares benchmark runs {argv[2]} and {argv[3]}, and no example on this page made any"
    name = (_values(argv, "--resume") or [""])[0] if argv[0] == "chat" and "--resume" in argv else None
    if name == "ID" or ("--continue" in argv and name is None):
        return None if state.logged else "goes on with a logged conversation, and none is logged on this page"
    if name and not name.startswith("-"):
        return f"resumes the conversation {name!r}, and no example on this page saves one by that name"
    return None if name is None or state.chats else "resumes the last chat, and no example before it chats"


def _network(v: Verdict, _: PageState) -> str | None:
    hosts = [*_values(v.argv, "--endpoint", "--rpc"),
             *(val for k, val in v.example.env if k in ("LOCALGEN_ENDPOINT", "LLAMA_ARG_RPC"))]
    hosts += [v.producer] if v.producer and v.producer.startswith(("curl", "wget")) else []
    hosts += ["a `localgen serve` running at 127.0.0.1:11435"] if v.argv[0] == "ps" else []
    return ", ".join(hosts) or None


def _too_costly(v: Verdict, _: PageState) -> str | None:
    if {"--functions", "--mcp"} & set(v.argv):
        return ("a tool loop: a ~200-token prompt (the tools' schemas) evaluated each round, and ~30 tokens a call: "
                "~3.4 s of CPU (docs/tools.md's two, measured), past this file's budget (tests/test_tools.py runs "
                "tool loops)")
    if int((_values(v.argv, "--parallel", "-np") or ["1"])[0]) > 1:
        return ("--parallel: the costliest batch (~0.8 s of CPU, 8 sequences' KV caches), past this file's budget"
                " (tests/test_batch.py runs --parallel; docs/run.md's --file examples without it run here)")
    return None


RULES: dict[str, Callable[[Verdict, PageState], str | None]] = {
    "serves until stopped": lambda v, _: f"`{v.argv[0]}` runs until stopped (tests/test_serve.py, test_rpc.py "
                                         "stop it)" if v.argv[0] in ("serve", "rpc-server") else None,
    "needs a network host": _network,
    "pulls from Hugging Face": lambda v, _: f"pulls {v.argv[1]}" if v.argv[0] == "pull" else None,
    "a model not here": lambda v, s: ", ".join(m for m in _named_models(v.argv) if m not in s.models) or None,
    "too long for the suite": _too_long,
    "needs what no earlier example made": _needs_earlier,
    "asks at a terminal": lambda v, _: "a chat with tools asks before each call, and scripted it refuses "
                                       "without --yes (tests/test_tools.py drives it at a terminal)"
    if v.argv[0] == "chat" and {"--functions", "--mcp"} & set(v.argv) and "--yes" not in v.argv else None,
    "costs too much": _too_costly,
}
REPEATS = "repeats an example already run"


def _plan() -> list[Verdict]:
    """Every example with its verdict, in doc order; a page's state follows the examples that run."""
    plan: list[Verdict] = []
    seen: dict[tuple[object, ...], str] = {}
    states: dict[str, PageState] = collections.defaultdict(PageState)
    nth: collections.Counter[str] = collections.Counter()
    for ex in dx.EXAMPLES:
        v, state = Verdict(ex, *_stdin_source(ex, nth[ex.where])), states[ex.where.split(":")[0]]
        nth[ex.where] += 1
        rule, detail = next(((name, d) for name, check in RULES.items() if (d := check(v, state))), (None, ""))
        if rule is None and v.key() in seen:
            rule, detail = REPEATS, f"the same as {seen[v.key()]}, run there"
        elif rule is None and v.key(words=False) in seen:
            rule, detail = REPEATS, f"the same as {seen[v.key(words=False)]}, run there, but for the prompt's words"
        plan.append(Verdict(ex, v.producer, v.infile, rule, detail))
        if rule is None:
            seen[v.key()] = seen[v.key(words=False)] = ex.where
            argv = v.argv
            if argv[0] in ("create", "cp", "rm"):
                getattr(state.models, "discard" if argv[0] == "rm" else "add")(argv[1 + (argv[0] == "cp")])
            state.chats += argv[0] == "chat"
            state.logged += argv[0] in ("run", "chat") and "--no-log" not in argv
    return plan


PLAN = _plan()


def test_every_example_is_run_or_says_why_not() -> None:
    """Each example has one verdict, to run or one rule's reason not to; at least AT_LEAST_RUN run."""
    assert [v.example for v in PLAN] == dx.EXAMPLES
    assert all(v.rule is None or ((v.rule in RULES or v.rule == REPEATS) and v.detail) for v in PLAN)
    counts = collections.Counter(v.rule or "run" for v in PLAN)
    assert counts["run"] >= AT_LEAST_RUN, counts


def _page_files(page: str) -> list[tuple[int, str, str]]:
    """(line, name, content) of each file the page writes: `cat > F <<'X'` here-documents, `printf '...' > F`,
    and a Modelfile shown as a text block (one whose first instruction is FROM)."""
    out: list[tuple[int, str, str]] = []
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"cat > (\S+) <<-?'?(\w+)'?\s*$", line):
            out.append((i + 1, m[1], "\n".join(lines[i + 1:lines.index(m[2], i + 1)]) + "\n"))
        elif m := re.match(r"printf ('[^']*') > (\S+)\s*$", line):
            out.append((i + 1, m[2], shlex.split(m[1])[0].encode().decode("unicode_escape")))
        elif line.strip() == "```text":
            block = lines[i + 1:lines.index("```", i + 1)]
            if next((b for b in block if b and not b.startswith("#")), "").startswith("FROM "):
                out.append((i + 1, "Modelfile", "\n".join(block) + "\n"))
    return out


# the files the docs show, the first page's where two show one
SHOWN = {name: text for doc in reversed(dx.DOCS) for _, name, text in _page_files(str(doc.relative_to(ROOT)))}


@dataclass
class Page:
    """A page's home, scratch directory and CLI; `written`: the line up to which the page's files are written."""

    home: Path
    work: Path
    cli: CLI
    provide: Callable[[str, Path], None]
    written: int = 0
    given: str = ""  # the latest example's stdin

    def prepare(self, v: Verdict) -> None:
        """The files the example reads (and a Modelfile's ADAPTER), as the page has them at its line."""
        for line, name, text in _page_files(v.page):
            if self.written < line <= v.line:
                (self.work / name).write_text(text)
        self.written = v.line
        words = [*v.argv, *shlex.split(v.producer or ""), v.infile or ""]
        words += (self.work / "Modelfile").read_text().split() if (self.work / "Modelfile").exists() else []
        for part in (p for w in words for p in re.split(r"[,=]", w)):
            self.make(re.sub(r":[\d.]+$", "", part))  # `--lora-scaled style.gguf:0.5,other.gguf:1`

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


def _bounded_catalogue(home: Path) -> None:
    """The user catalogue: the shipped smollm2:135m entry, its sampling settings and max_tokens = MAX_TOKENS."""
    entry = re.search(rf'^\[models\."{SMOLLM2}"\]\n(?:[^\[\n].*\n)*', SHIPPED.read_text(), re.M)
    text, n = re.subn(r"(?m)^sampling = \{ (.*) \}$", rf"sampling = {{ \1, max_tokens = {MAX_TOKENS} }}", entry[0])
    assert n == 1 and tomllib.loads(text)["models"][SMOLLM2]["sampling"]["max_tokens"] == MAX_TOKENS, text
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.toml").write_text(text)


@pytest.fixture(scope="module")
def pages(cli: CLI, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Page]:
    """Each page's Page, made by its first example: a fresh home (with the bounded catalogue) and directory."""
    made: dict[str, Page] = {}
    shared = tmp_path_factory.mktemp("provided")
    built = functools.cache(lambda kind: smollm2_path if kind == "smollm2" else tiny_lora.build(
        smollm2_path, shared / "lora.gguf") if kind == "lora" else tiny_bert.build(shared / "rerank.gguf", rank=True))

    def page(name: str) -> Page:
        if name not in made:
            root = tmp_path_factory.mktemp(re.sub(r"\W", "-", name))
            _bounded_catalogue(root / "home")
            (root / "work").mkdir()
            env = {**cli.env, "LOCALGEN_HOME": str(root / "home"), "LOCALGEN_CTX": str(CTX)}
            made[name] = Page(root / "home", root / "work", CLI(env), lambda k, p: p.symlink_to(built(k)))
        return made[name]

    return page


@pytest.mark.parametrize("verdict", [v for v in PLAN if v.rule], ids=str)
def test_doc_example_not_run(verdict: Verdict) -> None:  # a test apart: no fixture, so not marked slow
    pytest.skip(f"{verdict.rule}: {verdict.detail}")


@pytest.mark.parametrize("verdict", [v for v in PLAN if not v.rule], ids=str)
def test_doc_example(verdict: Verdict, pages: Callable[[str], Page]) -> None:
    """The example runs as written in its page's home and directory: exit 0, no traceback, and _check."""
    page = pages(verdict.page)
    page.prepare(verdict)
    argv = tuple(page.last_conversation() if a == "ID" else a for a in verdict.argv)
    page.given = page.stdin(verdict)
    r = CLI({**page.cli.env, **dict(verdict.example.env)})(*argv, input=page.given, cwd=page.work)
    assert r.returncode == 0 and "Traceback" not in r.stderr, f"exit {r.returncode}: {r.stderr[-3000:]}"
    _check(r.stdout, page, argv)


def _json(out: str) -> list[Any]:  # one JSON document, or one a line
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def _check(out: str, page: Page, a: tuple[str, ...]) -> None:
    """What is cheap to check of each kind of example."""
    flags = set(a)
    if a[0] in ("run", "chat") and not {"--json", "--file", "--each-line", "-l"} & flags:
        assert out.strip(), "no answer on stdout"
    if a[0] == "run" and {"--file", "--each-line"} & flags:  # a batch: one answer per line, none an error
        given = (page.work / _values(a, "--file")[0]).read_text() if "--file" in flags else page.given
        got = _json(out) if "--json" in flags else out.splitlines()
        assert len(got) == len(given.splitlines()), out
        assert all(not isinstance(g, dict) or (g.get("text") and "error" not in g) for g in got), out
    elif a[0] == "run" and "--json" in flags:
        [got] = _json(out)
        assert got["text"].strip() and ("yesno.gbnf" not in flags or got["text"].strip() in ("yes", "no")), out
    if "--no-log" in flags:
        with sqlite3.connect(page.home / "data" / "logs" / "logs.db") as db:
            assert not db.execute("SELECT count(*) FROM responses WHERE prompt = ?", (a[-1],)).fetchone()[0]
    if a[0] == "logs" and "--json" in flags:
        [entries] = _json(out)
        assert entries and all(e["conversation_id"] == _values(a, "--cid")[0] for e in entries), out
    if a[:2] == ("logs", "path"):
        assert out.strip().endswith("logs.db"), out
    if a[:2] in (("logs", "off"), ("logs", "on")):
        assert (page.home / "config" / "logs-off").exists() == (a[1] == "off")
    if a[0] == "embed" and "--store" not in flags:  # with --store, `similar` finds them
        vectors = _json(out)[0]["data"] if "--json" in flags else _json(out)
        assert vectors and all(len(g["embedding"]) > 0 for g in vectors), out
    if a[0] in ("similar", "rerank"):
        scores = [g["score"] for g in _json(out)]
        assert scores and scores == sorted(scores, reverse=True), out
    if a[0] == "list":
        assert ("qwen2.5:7b" if "--catalogue" in flags else SMOLLM2) in out, out
    if a[0] == "show":
        assert "FROM " in out if "--modelfile" in flags else out.strip(), out
    if a[0] in ("create", "cp"):
        assert (page.home / "data" / "presets" / f"{a[-1] if a[0] == 'cp' else a[1]}.json".replace(":", "@")).exists()
    if a[:2] == ("chat", "-l"):
        assert out.strip(), "no saved chat listed"
