"""The command examples of README.md and the docs site, run (issue #45). tests/test_doc_examples.py extracts
and parses them all (`EXAMPLES`); this file runs each one this machine can run, and says why not of the others.

They run through the `cli` fixture as the doc shows them (argv, `NAME=value` assignments), in doc order, in a
fresh LOCALGEN_HOME and scratch directory per page, so a page's examples build on each other as a reader's
would (`create terse` before `run -m terse`, `run "My name is Ada."` before `run --cid ID`, `logs off` before
`logs on`). Each exits 0 without a traceback; `check` tests what is cheap (`--json` parses, an answer is
printed, a batch answers each line, `logs --json` lists the conversation, reranked scores come best first).
An example that serves until stopped (`serve`, `rpc-server`) starts on the port it names or its default, once
that port is free, answers one request, and stops as its page says (tests/doc_examples_check.py: how, and why
its port is safe to use); a `localgen ps` right after a serve on its page asks that server, kept up for it.
- Files (tests/doc_examples_pages.py): the page's own where it writes one (`cat > weather.py <<'PY'`,
  `printf ... > Modelfile`, a Modelfile shown as a text block), else another page's, else FILES (`yesno.gbnf`
  is docs/run.md's `--grammar 'root ::= "yes" | "no"'`) or a line of text; the checkout's paths (`tests/...`)
  are linked in. PROVIDED: `path/to/model.gguf` is SmolLM2, `style.gguf` and `other.gguf` LoRA adapters for it
  (tests/tiny_lora.py), `bge-reranker.gguf` the tiny BERT reranker (tests/tiny_bert.py); a home where a serve
  lists or loads Gemma gets the session home's assembled copy (not a 250 MB copy per page). ID is the
  conversation the example run just before found, where that is a `logs -q` that found one (its best match's;
  an example going on with a conversation then must go on with that one), else the page's latest logged
  conversation; MODEL is smollm2:135m. stdin: what the command piped in prints (bash runs it in the
  scratch directory; `git diff` gets a sample diff), or the file after `<`; a chat given none gets "Hi".
- Generation is bounded as a user would bound it, the examples unchanged: each home's user `models.toml`
  repeats the shipped smollm2:135m entry with `max_tokens = 4` added to its sampling settings (docs/models.md,
  "The catalogue"; presets and flags still win: `terse`'s `num_predict 3`); a chat's input starts with `/set
  max_tokens 4` (for a model given as a file, which no entry names; a resumed chat keeps it); LOCALGEN_CTX=512
  (docs/configuration.md) keeps each KV cache small. The file costs ~20 s of CPU on one core: ~30 model loads
  at ~0.5 s, most of it evaluating the prompt (~170 tokens/s), and ~4 s the servers (two of them load Gemma).

Not run, by RULES (the first that applies; the end of pytest's report counts them, and with -v lists each
with its reason): it needs a network host
(`--endpoint`, `--rpc`, LOCALGEN_ENDPOINT, `curl`, `ps` with no serve just before it); it pulls from Hugging
Face; it names a model not here (but smollm2:135m, gemma3:270m, a preset made earlier on the page and PROVIDED
files); it is a benchmark or tuning too long for the suite (its size in the reason); it needs what no earlier
example on the page made (`bench compare 3 5`, `chat --resume trip-plans`); it asks at a terminal; it costs
more than this file's budget (a batch's `--parallel 8`); it runs `.venv/bin/python` and the checkout's venv is
elsewhere; or it repeats an example already run (the
same argv, environment and stdin, or the same but for the prompt's words), but for one going on with a logged
conversation (`--continue`, `--cid ID`, `--resume ID`): which one is its page's."""

from __future__ import annotations

import collections
import functools
import itertools
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import test_doc_examples as dx
from tests.conftest import CLI, ROOT
from tests.doc_examples_check import SERVES, SMOLLM2, address, check, kept, start, values
from tests.doc_examples_pages import CTX, GEMMA, PROVIDED, Page, bounded_catalogue, provider

PLACEHOLDERS = {"MODEL": SMOLLM2}  # and ID, the page's latest logged conversation, known once it runs
PREFILL_TPS, DECODE_TPS = 170, 80  # SmolLM2 on one core here (`run --stats`), for a benchmark's estimate
AT_LEAST_RUN = 57
ASKS_SERVER = ("ps", "stop")  # they ask the server of the serve example before them on their page


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
    models: set[str] = field(default_factory=lambda: {SMOLLM2, GEMMA, *PROVIDED})
    chats: int = 0
    logged: int = 0
    serving: bool = False  # the latest example run is a serve at `ps`'s default address, with no key (or a ps)


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


def _named_models(argv: tuple[str, ...]) -> list[str]:
    names = [n for v in values(argv, "-m", "--model", "--draft", "--mmproj") for n in v.split(",")]
    return names + ([argv[1]] if argv[0] in ("show", "rm", "cp") and not argv[1].startswith("-") else [])


def _needs_gemma(v: Verdict) -> bool:  # marked `gemma`, as conftest marks a test that loads it
    return GEMMA in _named_models(v.argv)


def _too_long(v: Verdict, _: PageState) -> str | None:
    argv = v.argv
    if argv[0] in ("quantize", "perplexity") or (argv[0] == "create" and {"-q", "--quantize"} & set(argv)):
        return ("quantizes a 16-bit model or measures thousands of tokens (the shipped text is ~75,000): "
                "tests/test_quantize.py runs these on an F16 made from SmolLM2")
    if argv[0] == "tune" and not {"--show", "--reset"} & set(argv):
        p, a = (values(argv, "--prompt", "-p") or ["512"])[0], (values(argv, "--answer", "-n") or ["256"])[0]
        return (f"tune measures one load setting after another on a {p}+{a}-token exchange at two depths: about "
                "a minute on 2 cores (docs/tune.md)")
    if argv[0] != "bench" or argv[1:2] in (("history",), ("compare",)):
        return None
    p, n = int((values(argv, "-p") or ["512"])[0]), int((values(argv, "-n") or ["128"])[0])
    models, reps = (values(argv, "-m") or [SMOLLM2])[0].split(","), int((values(argv, "-r") or ["5"])[0])
    sweeps = [f"{f} {x}" for f in ("-t", "-b", "-fa", "-ctk", "-d") for x in values(argv, f) if re.search("[-,]", x)]
    return (f"{reps} repetitions of pp{p}+tg{n} on {len(models)} model(s): over "
            f"{len(models) * reps * (p / PREFILL_TPS + n / DECODE_TPS):.0f} s on one core at SmolLM2's speed"
            + "".join(f", times the settings of {x}" for x in sweeps))


def _needs_earlier(v: Verdict, state: PageState) -> str | None:
    argv = v.argv
    if argv[:2] == ("bench", "compare"):
        return f"compares benchmark runs {argv[2]} and {argv[3]}, and no example on this page made any"
    name = (values(argv, "--resume") or [""])[0] if argv[0] == "chat" and "--resume" in argv else None
    if name == "ID" or ("--continue" in argv and name is None):
        return None if state.logged else "goes on with a logged conversation, and none is logged on this page"
    if name and not name.startswith("-"):
        return f"resumes the conversation {name!r}, and no example on this page saves one by that name"
    return None if name is None or state.chats else "resumes the last chat, and no example before it chats"


def _goes_on(v: Verdict) -> bool:
    """It goes on with a logged conversation: `--continue` (`-C`), or `--cid ID` / `--resume ID`."""
    return bool({"--continue", "-C", "ID"} & set(v.example.argv))


def _network(v: Verdict, state: PageState) -> str | None:
    hosts = [*values(v.argv, "--endpoint", "--rpc"),
             *(val for k, val in v.example.env if k in ("LOCALGEN_ENDPOINT", "LLAMA_ARG_RPC"))]
    hosts += [v.producer] if v.producer and v.producer.startswith(("curl", "wget")) else []
    hosts += ["a `localgen serve` running at 127.0.0.1:11435, and the example before it starts none there"
              ] if v.argv[0] in ASKS_SERVER and not state.serving else []
    return ", ".join(hosts) or None


def _serves_ps(v: Verdict) -> bool:
    """A serve that `ps`, as the docs show it (no --host, --port or key), asks: loopback, 11435, no key."""
    keyed = bool({"--api-key", "--api-key-file"} & set(v.argv)) or "LOCALGEN_API_KEY" in dict(v.example.env)
    return v.argv[0] == "serve" and address(v.argv) == ("127.0.0.1", SERVES["serve"]) and not keyed


def _too_costly(v: Verdict, _: PageState) -> str | None:
    if v.argv[0] != "serve" and int((values(v.argv, "--parallel", "-np") or ["1"])[0]) > 1:  # serve: slots
        return ("--parallel: the costliest batch (~0.8 s of CPU, 8 sequences' KV caches), past this file's budget"
                " (tests/test_batch.py runs --parallel; docs/run.md's --file examples without it run here)")
    return None


RULES: dict[str, Callable[[Verdict, PageState], str | None]] = {
    "needs a network host": _network,
    "pulls from Hugging Face": lambda v, _: f"pulls {v.argv[1]}" if v.argv[0] == "pull" else None,
    "a model not here": lambda v, s: ", ".join(m for m in _named_models(v.argv) if m not in s.models) or None,
    "too long for the suite": _too_long,
    "needs what no earlier example made": _needs_earlier,
    "asks at a terminal": lambda v, _: "a chat with tools asks before each call, and scripted it refuses "
                                       "without --yes (tests/test_tools_chat.py drives it at a terminal)"
    if v.argv[0] == "chat" and {"--functions", "--mcp"} & set(v.argv) and "--yes" not in v.argv else None,
    "costs too much": _too_costly,
    "needs the checkout's .venv": lambda v, _: "runs .venv/bin/python, and this checkout's venv is elsewhere "
                                              "(LOCALGEN_VENV)" if any(".venv/" in w for w in v.argv)
                                              and not (ROOT / ".venv" / "bin" / "python").exists() else None,
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
        if rule is None and _goes_on(v):
            pass  # which conversation it goes on with is its page's: never a repeat of another page's
        elif rule is None and v.key() in seen:
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
            state.serving = _serves_ps(v) or (argv[0] in ASKS_SERVER and state.serving)
    return plan


PLAN = _plan()
RUN = [v for v in PLAN if not v.rule]
# the examples after which the page's server stays up: the next example run on the page is a ps that asks it
KEEP_SERVING = {a for a, b in itertools.pairwise(RUN) if a.page == b.page and b.argv[0] in ASKS_SERVER}


def not_run_summary(verbose: bool) -> list[str]:
    """The examples not run here, for the end of pytest's report (conftest's pytest_terminal_summary): how many
    by rule, and with `verbose` each with its reason. Counted there, not as tests: a test that can only skip
    can never fail."""
    left = [v for v in PLAN if v.rule]
    counts = collections.Counter(str(v.rule) for v in left)
    lines = [f"doc examples not run here: {len(left)} of {len(PLAN)} ("
             + "; ".join(f"{n} {rule}" for rule, n in counts.most_common()) + ")"
             + ("" if verbose else "; -v lists each with its reason")]
    return lines + ([f"  {v}" for v in left] if verbose else [])


def test_every_example_is_run_or_says_why_not() -> None:
    """Each example has one verdict, to run or one rule's reason not to; at least AT_LEAST_RUN run."""
    assert [v.example for v in PLAN] == dx.EXAMPLES
    assert all(v.rule is None or ((v.rule in RULES or v.rule == REPEATS) and v.detail) for v in PLAN)
    counts = collections.Counter(v.rule or "run" for v in PLAN)
    assert counts["run"] >= AT_LEAST_RUN, counts


@pytest.fixture(scope="module")
def pages(cli: CLI, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Page]]:
    """Each page's Page, made by its first example: a fresh home (with the bounded catalogue) and directory.
    A server still up at the end (its ps deselected) is killed."""
    made: dict[str, Page] = {}
    provide = provider(smollm2_path, tmp_path_factory.mktemp("provided"))

    def page(name: str) -> Page:
        if name not in made:
            root = tmp_path_factory.mktemp(re.sub(r"\W", "-", name))
            bounded_catalogue(root / "home")
            (root / "work").mkdir()
            env = {**cli.env, "LOCALGEN_HOME": str(root / "home"), "LOCALGEN_CTX": str(CTX)}
            made[name] = Page(root / "home", root / "work", CLI(env), provide)
        return made[name]

    yield page
    for p in made.values():
        if p.server is not None:
            p.server.kill()


@pytest.mark.parametrize("verdict", [pytest.param(v, marks=[pytest.mark.gemma] * _needs_gemma(v)) for v in RUN],
                         ids=str)
def test_doc_example(verdict: Verdict, pages: Callable[[str], Page]) -> None:
    """The example runs as written in its page's home and directory: exit 0, no traceback, and `check`; one
    that serves starts, answers, passes Served.check and stops as it should (tests/doc_examples_check.py)."""
    page = pages(verdict.page)
    page.prepare(verdict)
    found, page.found = page.found, None
    argv = tuple((found or page.last_conversation()) if a == "ID" else a for a in verdict.argv)
    if _needs_gemma(verdict) or argv[0] == "serve":  # a serve lists Gemma too, and a listing assembles it
        page.assemble_gemma()
    cli = CLI({**page.cli.env, **dict(verdict.example.env)})
    if argv[0] in ASKS_SERVER and page.server is None:  # not a user's own server on 11435
        pytest.skip("asks the server of the serve example before it, which did not run here")
    with kept(page, verdict in KEEP_SERVING):
        if argv[0] in SERVES:
            page.server = start(cli, argv, page.work, verdict.example.where)
            page.server.check()
            return
        page.given = page.stdin(verdict)
        r = cli(*argv, input=page.given, cwd=page.work)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"exit {r.returncode}: {r.stderr[-3000:]}"
        check(r.stdout, page, argv)
        if argv[0] == "logs" and {"-q", "--query"} & set(argv):  # its best match's conversation, for ID after it
            page.found = next(iter(re.findall(r"conversation (\w+)", r.stdout)), None)
        if found and argv[0] in ("run", "chat") and _goes_on(verdict):
            assert page.last_conversation() == found, (
                "after a `logs -q` that found a conversation, the example goes on with another one "
                f"({page.last_conversation()}, not {found}): use --cid ID")
