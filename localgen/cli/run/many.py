"""`localgen run --file F` / `--each-line`: many prompts, answers in input order, one per line (or JSONL).

Input lines are prompts; a line that is a JSON object takes "prompt" and optional per-line "system",
"id" and sampling settings (validated like the flags). With -p, each prompt is the line, a blank line,
then the -p text. A blank input line gives a blank output line. A failed line is reported (`localgen: error: line
N: ...` on stderr, and with --json an "error" in JSONL too) and the rest go on; the exit status is then 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from localgen import settings
from localgen.backend import Completion, Indexed
from localgen.cli.inputfile import file_source
from localgen.cli.output import error_text, for_terminal
from localgen.errors import UsageError
from localgen.text import MAX_PROMPT_TEXT, checked, problem, too_long
from localgen.types import GenerationRequest, SamplingParams, Stats, thinking_args


@dataclasses.dataclass
class _Line:
    number: int
    prompt: str | None
    system: str | None
    sampling: SamplingParams
    ident: Any = None
    error: str | None = None
    hint: str | None = None  # what to do about the error, as a single run says it in parentheses
    previous: str | None = None  # --resume-from: the earlier output line ("" when it is already in the file)
    seeded: bool = False  # the JSON line has a "seed" of its own
    request: GenerationRequest | None = None  # as sent: --json's "sampling" says its settings


def _lines(source: TextIO, what: str) -> Iterator[str]:
    """`source`'s lines, each read only up to one character past MAX_PROMPT_TEXT: a longer one (a line that never
    ends, /dev/zero) is a UsageError naming it, raised before it is read whole."""
    number = 0
    while raw := source.readline(MAX_PROMPT_TEXT + 1):
        number += 1
        if len(raw) > MAX_PROMPT_TEXT:
            raise too_long(f"line {number} of {what}")
        yield raw


def no_prompts(path: Path) -> str:
    """Why --file PATH gives no prompt, in words ("it is empty"), or "" when it holds one. Only a regular
    file is read ahead, and only up to its first line that is not blank (a FIFO would be used up)."""
    import os
    import stat

    number = 0
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return ""  # read as it comes: run_batch says so at its end instead
        with open(path, encoding="utf-8-sig", errors="surrogateescape") as source:
            for raw in _lines(source, str(path)):
                number += 1
                if raw.strip():
                    return ""
    except OSError:
        return ""  # the open that reads it says what is wrong
    return "it is empty" if number == 0 else "it holds only blank lines"


def parse(source: TextIO, instruction: str | None, system: str | None, base: SamplingParams,
          what: str = "stdin") -> Iterator[_Line]:
    """Input lines as prompts, JSON lines with their settings checked (a bad one carries its error). A line past
    MAX_PROMPT_TEXT raises UsageError (`what` names the input) when it is reached."""
    for number, raw in enumerate(_lines(source, what), 1):
        line = raw.rstrip("\n")
        if not line.strip():
            yield _Line(number, None, system, base)
            continue
        if not line.lstrip().startswith("{"):
            why = problem(line)
            if why is not None:
                yield _Line(number, None, system, base, error=f"the line is not valid UTF-8 text: {why}")
                continue
            yield _Line(number, "\n\n".join(p for p in (line, instruction) if p), system, base)
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            yield _Line(number, None, system, base, error=f"bad JSON line: {e}")
            continue
        except RecursionError:  # 5,000 nested brackets: this line fails, the others go on
            yield _Line(number, None, system, base, error="bad JSON line: it nests too deeply")
            continue
        ident = None  # a failed line's object carries its id where the line gave one and it was read
        try:  # valid JSON from here: what is wrong is said as it is, without "bad JSON"
            if isinstance(obj, dict) and "id" in obj:  # written back with the answer: a lone surrogate in it
                checked(_id_json(obj["id"]), '"id"')  # could not be, nor NaN (not JSON)
                ident = obj["id"]
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise UsageError('a JSON line needs a "prompt" string')
            if "system" in obj and not isinstance(obj["system"], (str, type(None))):
                raise UsageError('"system" must be a string')
            checked(obj["prompt"], '"prompt"')
            if not obj["prompt"].strip():  # as -p "" and -p "   " are refused
                raise UsageError(f'"prompt" is {"only whitespace" if obj["prompt"] else "empty"}: there is no prompt')
            stops = obj.get("stop")
            if stops == "" or (isinstance(stops, list) and "" in stops):  # as --stop '' is refused
                raise UsageError('"stop" holds an empty string: give the text, or leave it out')
            if obj.get("system") is not None:
                checked(obj["system"], '"system"')
            knobs = {k: v for k, v in obj.items() if k not in ("prompt", "system", "id")}
            sampling = settings.apply(base, knobs)
            text = "\n\n".join(p for p in (obj["prompt"], instruction) if p)
            yield _Line(number, text, obj.get("system", system), sampling, obj.get("id"), seeded="seed" in knobs)
        except UsageError as e:
            yield _Line(number, None, system, base, ident, error=e.message, hint=e.hint)
        except ValueError as e:
            yield _Line(number, None, system, base, ident, error=str(e))
        except RecursionError:
            yield _Line(number, None, system, base, ident, error="the JSON line nests too deeply")


def _id_json(ident: Any) -> str:
    """A JSON line's "id" as the output writes it back; a UsageError for NaN or an infinity (1e400 reads as one),
    which JSON cannot hold: written as `NaN`, the output line would be no JSON a reader takes."""
    try:
        return json.dumps(ident, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise UsageError('"id" holds NaN or an infinity (such as 1e400), which JSON cannot hold: give a string or a '
                         "number of JSON's range") from None


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """How `run --file` / `--each-line` runs and prints."""

    instruction: str | None = None  # -p: appended to each line
    system: str | None = None
    raw: bool = False
    parallel: int = 1
    json_out: bool = False
    stats: bool = False
    exact: bool | None = None
    logprobs: int | None = None
    json_schema: str | None = None  # for a remote server's response_format
    resume_from: Path | None = None  # an earlier JSONL output: its answered lines are not run again
    source_name: str = "stdin"  # the input as a too-long line's error names it
    think: bool | None = None  # the template's thinking switch (--think/--no-think); None: its default
    needs_prompts: bool = False  # --file: an input without a line that is not blank is a UsageError


def _overflow_hint(backend: Any, error: Exception | None) -> str | None:
    """A prompt too long for its slot's window (errors.prompt_too_long, which knows its numbers): what helps, as a
    single run's error says it."""
    tokens, window = getattr(error, "tokens", None), getattr(error, "window", None)
    if not isinstance(tokens, int) or not isinstance(window, int):
        return None
    from localgen.cli.run.window import overflow_hint

    return overflow_hint(backend, tokens, window)


def run_batch(backend: Any, source: TextIO, base: SamplingParams, opts: BatchOptions) -> int:
    """Complete every line; returns the exit status (1 if any line failed). A line past MAX_PROMPT_TEXT ends the
    input there: the lines before it are answered and written, then its UsageError is raised."""
    from localgen.cli.signals import term_as_interrupt

    resumed = _resume(opts.resume_from)
    try:
        # a SIGTERM (a scheduler's time limit, `timeout`) or a SIGHUP stops it as Ctrl-C does, so that with --json the
        # answers held are written for --resume-from; the process then ends by that signal
        with term_as_interrupt():
            return _run(backend, source, base, opts, resumed)
    finally:
        resumed.close()


def _run(backend: Any, source: TextIO, base: SamplingParams, opts: BatchOptions, resumed: Resumed) -> int:
    instruction, system, json_out = opts.instruction, opts.system, opts.json_out
    lines: dict[int, _Line] = {}
    ready: dict[int, tuple[_Line, Completion | None]] = {}
    state = {"next": 1, "failed": 0, "tokens": 0, "prompts": 0, "skipped": 0, "given": 0}
    promise = getattr(backend, "exactness", None)  # a local model's; remote endpoints promise nothing here

    stopped: list[UsageError] = []  # a line too long to read: the input ends there

    def lines_in() -> Iterator[_Line]:
        try:
            yield from parse(source, instruction, system, base, opts.source_name)
        except UsageError as e:
            stopped.append(e)

    def requests() -> Iterator[Indexed]:
        for ln in lines_in():
            lines[ln.number] = ln
            if ln.prompt is not None or ln.error is not None:
                state["given"] += 1
            answer = resumed.answer(ln.number)
            if answer or (answer is not None and ln.prompt is None and ln.error is None):
                ln.previous = resumed.line(ln.number) if resumed.copy else ""
                ready[ln.number] = (ln, None)
                state["skipped"] += 1
                flush()
                continue
            if ln.prompt is None:
                ready[ln.number] = (ln, None)
                flush()
                continue
            item = _request(ln, ln.prompt, base, opts)
            ln.request = item.request
            yield item

    def done(c: Completion) -> None:
        ln = lines[c.index]
        if c.finish_reason.startswith("error: "):
            ln.error = c.finish_reason[len("error: "):]
            ln.hint = getattr(c.error, "hint", None) or _overflow_hint(backend, c.error)
        ready[c.index] = (ln, c)
        flush()

    answer = _Answer(backend)

    def write(ln: _Line, c: Completion | None) -> bool:
        exact = promise(opts.exact, ln.sampling.greedy) if promise is not None else None
        return _write(ln, c, answer if json_out else None, exact)

    def flush() -> None:
        while state["next"] in ready:
            ln, c = ready.pop(state["next"])
            lines.pop(ln.number, None)  # written: a long input holds only the lines in flight
            state["next"] += 1
            if write(ln, c):
                continue
            if ln.error:
                state["failed"] += 1
            elif c is not None:
                state["tokens"] += c.completion_tokens
                state["prompts"] += 1

    t0 = time.perf_counter()
    try:
        counters = backend.run_many(requests(), opts.parallel, done, exact=opts.exact)
    except BaseException as e:
        if json_out and not isinstance(e, BrokenPipeError):
            _spill(ready, write)
        raise
    flush()
    if opts.stats:
        _print_stats(state, time.perf_counter() - t0, counters, opts.parallel, len(getattr(backend, "endpoints", ())))
    if stopped:
        raise stopped[0]
    if opts.needs_prompts and not state["given"]:  # a FIFO, which no_prompts() could not read ahead
        raise UsageError(f"{file_source(opts.source_name)} has no prompts: "
                         f"{'it holds only blank lines' if state['next'] > 1 else 'it is empty'}",
                         hint="one prompt a line")
    return 1 if state["failed"] else 0


def _write(ln: _Line, c: Completion | None, answer: _Answer | None, exact: str | None) -> bool:
    """A line's output (a JSON object where `answer` is given); True where it is an earlier output's line, copied
    (--resume-from)."""
    if ln.previous is not None:
        if ln.previous:
            sys.stdout.write(for_terminal(ln.previous, sys.stdout) + "\n")
        return True
    _emit(ln, c, answer, exact)
    return False


class _Answer:
    """A line's answer as `run --json`'s one object says it (output.answer_json, so that the two keep one shape),
    with the model and its load read once for the whole run."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._described: dict[str, Any] | None = None
        self.remote = bool(getattr(backend, "endpoints", ()))
        engine = getattr(backend, "engine", None)
        self.load_s = engine.load_s if engine is not None else 0.0

    def describe(self) -> dict[str, Any]:
        """The backend's model and load (what answer_json reads), the same for every line."""
        if self._described is None:
            self._described = self.backend.describe()
        return self._described

    def doc(self, ln: _Line, c: Completion) -> dict[str, Any]:
        """The line's answer in run --json's fields (no conversation_id: the lines are not logged)."""
        from localgen.cli.output import answer_doc

        assert ln.request is not None
        sampling = dataclasses.replace(ln.request.sampling, seed=c.seed)
        sent = None
        if self.remote:
            from localgen.remote.client import sent_sampling

            sent = sent_sampling(ln.request, c.seed)
        # a remote line's own stats and server timings, where its Completion carries them (its stream's counts)
        gen = _Generation(c.text, c.finish_reason, c.seed, c.stats or _stats(c, self.load_s), c.logprobs, sent,
                          c.server_timings)
        return answer_doc(self, gen, sampling)


@dataclasses.dataclass(frozen=True)
class _Generation:
    """A Completion in the shape answer_json reads a single run's Generation in."""

    text: str
    finish_reason: str
    seed: int
    stats: Stats
    logprobs: list[Any]
    sent_sampling: dict[str, Any] | None  # a remote line's: the settings sent
    server_timings: dict[str, Any] | None
    prompt_cache: str = "off"  # many prompts use no prompt cache (--prompt-cache is refused with them)


def _stats(c: Completion, load_s: float) -> Stats:
    """A line's stats as a single run's: its rates from the time its prompt took and the time after it (the first
    token comes with the prompt, as Stats.combine counts it)."""
    evaluated = c.prompt_tokens - c.cached_tokens
    return Stats(prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens, completion_tokens=c.completion_tokens,
                 load_s=load_s, ttft_s=c.ttft_s, prefill_tps=evaluated / c.prompt_s if c.prompt_s > 0 else None,
                 decode_tps=(c.completion_tokens - 1) / c.decode_s if c.decode_s > 0 and c.completion_tokens > 1
                 else None, total_s=c.total_s, finish_reason=c.finish_reason,  # type: ignore[arg-type]
                 drafted=c.drafted or None, accepted=c.accepted if c.drafted else None)


def _spill(ready: dict[int, tuple[_Line, Completion | None]],
           write: Callable[[_Line, Completion | None], bool]) -> None:
    """A stop (Ctrl-C, a failure) with answers held behind a line not yet answered: with --json, where each
    carries its line number, they are written now, out of order, so that --resume-from skips them."""
    held = sorted(ready.items())
    ready.clear()
    with contextlib.suppress(Exception):
        for _, (ln, c) in held:
            write(ln, c)


def _request(ln: _Line, prompt: str, base: SamplingParams, opts: BatchOptions) -> Indexed:
    """A line's request, with its seed: the line's own (null: a fresh one), else --seed + line - 1 (within the
    seed's range), else a fresh one."""
    from localgen.engine.batchseq import new_seed

    if ln.seeded:
        seed = ln.sampling.seed if ln.sampling.seed is not None else new_seed()
    else:
        seed = (base.seed + ln.number - 1) % 2**32 if base.seed is not None else new_seed()
    sampling = dataclasses.replace(ln.sampling, seed=seed)
    if opts.raw:
        req = GenerationRequest(prompt=prompt, sampling=sampling, logprobs=opts.logprobs, json_schema=opts.json_schema)
    else:
        msgs = ([{"role": "system", "content": ln.system}] if ln.system else [])
        req = GenerationRequest(messages=(*msgs, {"role": "user", "content": prompt}), sampling=sampling,
                                logprobs=opts.logprobs, json_schema=opts.json_schema,
                                template_args=thinking_args(opts.think))
    return Indexed(ln.number, req, seed)


def _print_stats(state: dict[str, int], secs: float, counters: dict[str, Any], parallel: int, endpoints: int) -> None:
    """--stats for many prompts: aggregate rate, and how the work was shared: the batching mode and why
    (engine/batchmode.py)."""
    per_call = counters["rows"] / counters["steps"] if counters.get("steps") else 0
    mode = ("throughput" if counters.get("throughput") else "exact") + " batching" + (
        " in one pool of KV cells" if counters.get("kv_unified") else "")
    shared = f", {int(counters['shared']):,} prompt tokens shared" if counters.get("shared") else ""
    why = f" · why: {counters['why']}" if counters.get("why") else ""
    drafted = counters.get("drafted")
    drafts = ("" if drafted is None else f", {drafted:,} tokens drafted, {counters['accepted']:,} kept"
              + (f" ({counters['accepted'] / drafted:.0%})" if drafted else "")
              + f", a drafted row costing {counters['row_cost']:.2f} of a step")
    # a local model's calls (none where no line needed one: all answered before, or one token each); else endpoints
    calls = f", {per_call:.1f} sequences per decode call" if counters.get("steps") else ""
    how = (f"{mode}{calls}{shared}{drafts}{why}" if not endpoints else
           _plural(endpoints, "endpoint") + (
               f", {_plural(int(counters['retried']), 'line')} moved off a failed one" if counters.get("retried")
               else ""))
    print(f"{_plural(state['prompts'], 'prompt')} · {_plural(state['tokens'], 'token')} generated in {secs:.2f} s · "
          f"{state['tokens'] / secs if secs else 0:.1f} tok/s aggregate · --parallel {parallel} · {how}"
          + (f" · {state['skipped']} already answered" if state["skipped"] else "")
          + (f" · {state['failed']} failed" if state["failed"] else ""), file=sys.stderr)


MAX_RECORD = 64 * 2**20  # an output line longer than this (no answer is) is read past, not held


def check_resume(path: Path) -> None:
    """A UsageError unless --resume-from names a regular file that starts as an earlier run's JSONL output does
    (a JSON object with a "line" number, or the start of one a crash cut short), or no file yet (a first run).
    Only its first line is read: a FIFO or a device is never opened, a big file of something else never read."""
    with _opened(path) as f:
        if f is not None:
            _first_line(f, path)


class Resumed:
    """What --resume-from read of an earlier output, a line at a time: the input line numbers it answered, each
    with where its output line starts (an answer's at `offset`, a blank input line's `{"line": N}` at ~offset), and
    whether to copy them to this output. Only that index is held; a copied line is read again from the file when
    its turn comes."""

    def __init__(self, path: Path | None) -> None:
        self.answered: dict[int, int] = {}
        self.copy = False
        self._file: BinaryIO | None = None
        self._path = path
        self.torn = False  # the file ends inside a line (a crash cut it short)

    def answer(self, number: int) -> bool | None:
        """Whether the earlier output holds an answer for this line (True), only its blank-line record (False), or
        nothing (None)."""
        at = self.answered.get(number)
        return None if at is None else at >= 0

    def line(self, number: int) -> str:
        """The earlier output's line for `number`, as it was written; a UsageError when the file changed since."""
        at = self.answered[number]
        assert self._file is not None
        self._file.seek(at if at >= 0 else ~at)
        raw = self._file.readline(MAX_RECORD + 1)
        if _record(raw) != (number, at >= 0):
            raise UsageError(f"--resume-from {self._path} changed while this run read it: line {number}'s answer is "
                             "no longer where it was", hint="run again (with a file that no other job writes)")
        return raw.decode("utf-8").rstrip("\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _resume(path: Path | None) -> Resumed:
    """The lines an earlier JSONL output answered (see Resumed), read as a stream (a 5 GB output costs its index,
    not its size), and whether to copy them to this output: not when stdout appends to that same file
    (`>> OUTPUT.jsonl`)."""
    import os

    resumed = Resumed(path)
    if path is None:
        return resumed
    with _opened(path) as f:
        if f is None:
            resumed.copy = True  # nothing answered yet: the first run of a job that will resume from its output
            return resumed
        _first_line(f, path)
        f.seek(0)
        resumed.torn = _index(f, resumed.answered)
        try:
            out, old = os.fstat(sys.stdout.fileno()), os.fstat(f.fileno())
            same = (out.st_dev, out.st_ino) == (old.st_dev, old.st_ino)
            if same and not _appends(sys.stdout.fileno()):
                raise UsageError(f"stdout writes over {path} (`>`), the file --resume-from reads: the shell "
                                 "emptied it before localgen started, so its earlier output is gone",
                                 hint=f"next time append with `>> {path}`, or write to a new file")
        except (OSError, ValueError, AttributeError):
            same = False
        if same and resumed.torn:
            sys.stdout.write("\n")  # end the line a crash cut short, so the next answer starts a line of its own
        resumed.copy = not same
        if resumed.copy and resumed.answered:
            resumed._file = open(path, "rb")  # noqa: SIM115 (closed by run_batch: Resumed.close)
    return resumed


def _appends(fd: int) -> bool:
    """Whether the descriptor writes at the file's end (`>>`: O_APPEND). Taken as so where that cannot be asked
    (Windows has no fcntl): there a file `>` emptied is read as one nothing answered yet, and every line runs."""
    import os

    try:
        import fcntl
    except ImportError:
        return True
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BinaryIO | None]:
    """The file --resume-from names, open for reading (None when there is none yet); a UsageError for one that is
    not a regular file (a FIFO would be used up, a device never ends), checked before it is opened."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        yield None
        return
    except OSError as e:
        raise UsageError(f"cannot read --resume-from {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else (
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a file")
        raise UsageError(f"--resume-from {path} is {kind}, not a regular file: it reads an earlier run's JSONL "
                         "output, which a file holds")
    try:
        f = open(path, "rb", buffering=CHUNK)  # noqa: SIM115 (closed below)
    except OSError as e:
        raise UsageError(f"cannot read --resume-from {path}: {e.strerror or e}") from None
    with f:
        yield f


CHUNK = 1 << 20
_START = re.compile(rb'\s*\{\s*"line"\s*:\s*[0-9]')  # how an output line begins, even one a crash cut short


def _first_line(f: BinaryIO, path: Path) -> None:
    """A UsageError unless the file is empty or begins as run --json's output does (read: its first CHUNK)."""
    head = f.read(CHUNK)
    if head.strip() and _START.match(head) is None:
        raise UsageError(f"--resume-from {path} is not an earlier run's JSONL output: its first line is not a JSON "
                         'object with a "line" number', hint="give it the output of `run --file ... --json`")


def _index(f: BinaryIO, answered: dict[int, int]) -> bool:
    """Read the output a line at a time into `answered` (see Resumed); a line too long to be one is read past in
    pieces. True when the file ends inside a line."""
    offset, torn = 0, False
    while raw := f.readline(MAX_RECORD + 1):
        start = offset
        offset += len(raw)
        torn = not raw.endswith(b"\n")
        if len(raw) > MAX_RECORD:  # no answer is this long: read past it, a piece at a time
            while torn and (raw := f.readline(CHUNK)):
                offset += len(raw)
                torn = not raw.endswith(b"\n")
            continue
        found = _record(raw)
        if found is not None:
            number, answer = found
            answered[number] = start if answer else ~start
    return torn


def _record(raw: bytes) -> tuple[int, bool] | None:
    """An output line's input line number and whether it holds an answer (rather than a blank input line's
    `{"line": N}`, which counts only where that line is still blank); None for a line that failed (it runs
    again), and for one a crash cut short, even in the middle of a character."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return None
    if (isinstance(doc, dict) and isinstance(doc.get("line"), int) and "error" not in doc
            and ("text" in doc or set(doc) == {"line"})):
        return doc["line"], "text" in doc
    return None


def _emit(ln: _Line, c: Completion | None, answer: _Answer | None, exact: str | None = None) -> None:
    if ln.error:  # said on stderr as every error is, with --json too (where it is also the line's "error")
        hint = f" ({ln.hint})" if ln.hint else ""  # as a single run's error says it
        print(error_text(f"localgen: error: line {ln.number}: {ln.error}{hint}"), file=sys.stderr, flush=True)
    if answer is not None:
        doc: dict[str, Any] = {"line": ln.number}
        if ln.ident is not None:
            doc["id"] = ln.ident
        if ln.error:
            doc["error"] = ln.error
            if ln.hint:
                doc["hint"] = ln.hint
        elif c is not None:
            doc.update(answer.doc(ln, c))
            # as before the line carried a single run's fields: also in "stats", kept at the top for scripts
            doc.update(prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                       ttft_s=round(c.ttft_s, 4), total_s=round(c.total_s, 4))
            if c.drafted:
                doc.update(drafted=c.drafted, accepted=c.accepted)
            if exact is not None:
                doc["exact"] = exact
        out = json.dumps(doc, ensure_ascii=False, allow_nan=False)  # NaN and Infinity are no JSON
    else:
        out = " ".join(c.text.split()) if c is not None and not ln.error else ""
    if problem(out) is not None:  # a lone surrogate an error quotes (a key's name): shown escaped, not a crash
        out = out.encode("utf-8", "backslashreplace").decode("utf-8")
    sys.stdout.write(for_terminal(out, sys.stdout) + "\n")  # on a terminal, a model's ESC or C1 shows escaped
    sys.stdout.flush()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
