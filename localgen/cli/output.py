"""Writers for stdout (the answer, nothing else) and stderr (status, warnings, stats)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Collection
from typing import Any, TextIO

from localgen.types import SamplingParams, Stats, shown_path

_said = {"interrupted": False}
RESULT_PREVIEW = 300  # characters of a tool's result shown


class ReaderGone(Exception):
    """stdout's reader went away (`| head -1`). Not an OSError, so click does not turn it into exit 1."""


class StdoutError(OSError):
    """A write to stdout failed (`> /dev/full`: ENOSPC): an OSError as before, which the error line says was
    stdout's (`cannot write to stdout: No space left on device`), not a bare reason with no file named."""


class _GuardedStdout:
    """Wraps sys.stdout: a write or flush to a closed pipe silences stdout and raises ReaderGone; any other
    failure raises StdoutError."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            silence_stdout()
            raise ReaderGone from None
        except StdoutError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            silence_stdout()
            raise ReaderGone from None
        except StdoutError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stdout() -> None:
    """Install the guard (once per process)."""
    if not isinstance(sys.stdout, _GuardedStdout) and sys.stdout is not None:
        sys.stdout = _GuardedStdout(sys.stdout)  # type: ignore[assignment]


class _QuietStderr:
    """Wraps sys.stderr: a write or flush that fails (its reader gone: `2>&1 | head -1`, a log collector that
    exits; a full disk: `2>/dev/full`) silences stderr for the rest of the process instead of ending the command.
    stderr carries status, progress and warnings: losing them is no reason to drop a quantization or a download
    part-way (it ended with status 1 at the next progress line, its work thrown away)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError:
                self._silence()

    def _silence(self) -> None:
        """Nothing more is written there: llama.cpp's own lines and Python's flush at exit go to /dev/null."""
        self._gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
            pass
        with contextlib.suppress(OSError, ValueError):  # what its buffer holds goes to /dev/null now
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stderr() -> None:
    """Install the stderr guard (once per process)."""
    if not isinstance(sys.stderr, _QuietStderr) and sys.stderr is not None:
        sys.stderr = _QuietStderr(sys.stderr)  # type: ignore[assignment]


# what the writers here (TextWriter's text, ErrWriter's lines) last left on the terminal, and how many writes there
# were when Ctrl-C was pressed: the terminal echoes it as `^C` where the cursor then was
_cursor = {"mid_line": False, "writes": 0, "writes_at_press": -1}


def _wrote(text: str) -> None:
    _cursor["writes"] += 1
    _cursor["mid_line"] = not text.endswith("\n")


def command_starts() -> None:
    """A command begins (once per process, or per call where a test runs commands in one): nothing written yet,
    no Ctrl-C seen, no "interrupted" said."""
    _said["interrupted"] = False
    _cursor.update(mid_line=False, writes=0, writes_at_press=-1)


def ctrl_c_pressed() -> None:
    """Called by a SIGINT handler at the first press: where the output stood when the terminal echoed it."""
    if _cursor["writes_at_press"] < 0:
        _cursor["writes_at_press"] = _cursor["writes"]


def ctrl_c_seen() -> bool:
    """Whether Ctrl-C has been pressed in this process (the command is on its way out)."""
    return _cursor["writes_at_press"] >= 0


def after_the_echo() -> bool:
    """Whether the cursor is where the terminal's `^C` echo left it (nothing written since the press), or on a
    line left open since: either way "interrupted" needs a line of its own."""
    return _cursor["writes"] == _cursor["writes_at_press"] or bool(_cursor["mid_line"])


class TextWriter:
    """Streams text to stdout, flushing each chunk; notices a closed pipe instead of raising."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled
        self.wrote = ""
        self.visible = is_terminal(stream)  # on a terminal, control characters show escaped (visible())

    def write(self, text: str) -> bool:
        """Write and flush; False once the reader has gone away."""
        if not self.enabled or not text:
            return True
        try:
            self.stream.write(visible(text) if self.visible else text)
            self.stream.flush()
        except (BrokenPipeError, ReaderGone):
            silence_stdout()
            return False
        self.wrote = (self.wrote + text)[-1:]
        _wrote(text)
        return True

    def end(self) -> None:
        """End the answer with a newline if it did not end with one."""
        if self.enabled and self.wrote and self.wrote != "\n":
            self.write("\n")


def silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _echoes_ctrl_c(stream: TextIO) -> bool:
    """Whether the terminal of `stream` echoes a typed Ctrl-C as `^C` where the cursor is (ECHO and ECHOCTL)."""
    try:
        import termios
    except ImportError:  # no termios (Windows)
        return False
    try:
        lflag = termios.tcgetattr(stream.fileno())[3]
    except (termios.error, OSError, ValueError, AttributeError):
        return False
    return bool(lflag & termios.ECHO and lflag & termios.ECHOCTL)


def confirm_removal(what: str) -> None:
    """Ask "Remove WHAT? [y/N]" on a terminal (a no is exit 1); off one, a usage error that wants --yes. The
    caller asks only without --yes."""
    import typer

    from localgen.errors import UsageError

    if sys.stdin is None or not sys.stdin.isatty():
        raise UsageError(f"would remove {what}; pass --yes to confirm when not on a terminal")
    if not typer.confirm(f"Remove {what}?", default=False, err=True):
        raise typer.Exit(1)


def plural(n: int, word: str) -> str:
    """`n word`, with an s for any count but 1 ("1 exchange", "2 exchanges"); n with thousands separators."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def aligned(rows: list[list[str]], right: Collection[int] = ()) -> list[str]:
    """A plain table's lines: each column as wide as its widest cell as a terminal draws it (a CJK character is
    two cells, a combining accent none: len() misaligned such names), two spaces apart, no trailing spaces; the
    columns numbered in `right` (figures) padded on the left."""
    from rich.cells import cell_len

    widths = [max(cell_len(r[k]) for r in rows) for k in range(len(rows[0]))] if rows else []

    def cell(k: int, c: str) -> str:
        pad = " " * (widths[k] - cell_len(c))
        return pad + c if k in right else c + pad

    return ["  ".join(cell(k, c) for k, c in enumerate(r)).rstrip() for r in rows]


def format_stats(s: Stats) -> str:
    """One human line: tokens, rates, time to first token, load and total time, why it stopped."""
    prompt = f"{s.prompt_tokens} prompt tokens"
    if s.cached_tokens:
        prompt += f" ({s.cached_tokens} cached)"
    parts = [prompt, f"{s.completion_tokens} generated"]
    if s.media_tokens:
        enc = f", encoded in {s.encode_s * 1000:,.0f} ms" if s.encode_s else ", from the cache"
        parts.insert(1, f"media {s.media_tokens} tokens{enc}")
    if s.prefill_tps:
        parts.append(f"prefill {s.prefill_tps:,.1f} tok/s")
    if s.decode_tps:
        parts.append(f"decode {s.decode_tps:,.1f} tok/s")
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    if s.itl_p50_ms is not None:
        parts.append(f"inter-token p50 {s.itl_p50_ms:.1f} ms, p99 {s.itl_p99_ms or 0:.1f} ms")
    if s.load_s:  # 0: another server's model (remote.md), whose load is not known here
        parts.append(f"load {s.load_s:.2f} s")
    parts.append(f"total {s.total_s:.2f} s")
    if s.drafted is not None:
        rate = f" ({(s.accepted or 0) / s.drafted:.0%})" if s.drafted else ""
        parts.append(f"drafted {s.drafted}, accepted {s.accepted}{rate}")
    parts.append(f"stop: {s.finish_reason}")
    return " · ".join(parts)


ERROR_HEAD, ERROR_TAIL = 600, 400  # what an error line keeps of its start and end when it quotes a huge value
# characters that would act on a terminal instead of showing (ESC, BEL, CR, ...) or reorder the line (bidi controls)
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# C0 but a line break and a tab, DEL, C1; a CR is one only alone (a CRLF line end, a Windows file's, is a line break)
_CONTROLS = re.compile(r"\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group())
    # DEL and C1 as \u00NN, which JSON reads as the same character (`logs --json` on a terminal stays JSON);
    # C0 as \x1b (JSON already escapes those)
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """Text a model or a user wrote, as a terminal must get it: every control character but a line break (CRLF too)
    and a tab (ESC, BEL, a CR alone, DEL, C1) shown escaped (`\\x1b`, `\\u009b`), so a saved prompt or an answer
    cannot set the window's title, write the clipboard (OSC 52) or move the cursor. For text bound for a terminal
    only: piped, an answer stays byte for byte (for_terminal)."""
    return _CONTROLS.sub(_escaped, text)


def rich_console(**kw: Any) -> Any:
    """A Rich Console for text a user or a model wrote, `kw` its own settings: `:x:` is shown as it is (Rich's emoji
    codes made `qwen:x:latest` `qwen❌latest`)."""
    from rich.console import Console

    return Console(emoji=False, **kw)


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal (False for one closed or without isatty)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def for_terminal(text: str, stream: Any) -> str:
    """`text` made visible (visible()) where `stream` is a terminal; unchanged into a pipe or a file."""
    return visible(text) if is_terminal(stream) else text


def header_text(text: str) -> str:
    """A value from a model's file (its name, architecture, license) on one line of `fit` or `show`: a line break or a
    carriage return shown as \\n or \\r, and on a terminal every other control character escaped (visible()) and
    every bidi control too (U+202E would show the rest of the line reversed, a name posing as another), so a header
    cannot clear the screen, write the clipboard or disguise itself; in a pipe it stays as written."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if not is_terminal(sys.stdout):
        return text
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def error_text(line: str) -> str:
    """An error line as it is printed: a control character a quoted value carried is shown escaped (\\x1b), not
    obeyed by the terminal, a file name's byte that is not UTF-8 as \\xe8 (types.shown_path; stderr wrote the lone
    surrogate Python keeps it as, \\udce8), and a line past ERROR_HEAD + ERROR_TAIL characters (a 100 KB flag value
    quoted) keeps its start and its end, where the hint is, around what was left out."""
    line = _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), shown_path(line))
    if len(line) > ERROR_HEAD + ERROR_TAIL + 100:
        left_out = len(line) - ERROR_HEAD - ERROR_TAIL
        line = f"{line[:ERROR_HEAD]} … ({left_out:,} characters left out) … {line[-ERROR_TAIL:]}"
    return line


class ErrWriter:
    """stderr: styled on a terminal (unless NO_COLOR), plain text otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._console = None
        self._once: set[str] = set()
        if self.tty:
            self._console = rich_console(file=self.stream, highlight=False, soft_wrap=True)

    def _print(self, text: str, style: str | None = None, fresh: bool = True) -> None:
        """One line. `fresh`: a line written right after a terminal's `^C` echo begins a line of its own."""
        if fresh and self.tty and _cursor["writes"] == _cursor["writes_at_press"] and _echoes_ctrl_c(self.stream):
            text = "\n" + text
        _wrote("\n")
        try:
            if self._console is not None:
                self._console.print(visible(text), style=style, markup=False)
            else:
                print(text, file=self.stream, flush=True)
        except (BrokenPipeError, ValueError):
            pass

    def status(self, text: str) -> None:
        """Progress chatter ("loading ..."): shown only on a terminal, so pipelines stay quiet."""
        if self.tty:
            self._print(text, "dim")

    def line(self, text: str) -> None:
        """A plain informational line."""
        self._print(text, "dim")

    def line_once(self, text: str) -> None:
        """A plain line said at most once by this writer (a wait met twice in one command is one line)."""
        if text not in self._once:
            self._once.add(text)
            self.line(text)

    def interrupted(self, text: str = "interrupted", at_line_start: bool | None = None) -> None:
        """The one "interrupted" line of a Ctrl-C (printed once, whoever notices first): `text` says what was kept
        where the command knows, and then the exit adds no second line. `at_line_start`: the output was whole
        lines when Ctrl-C came (None: what the writers here saw, after_the_echo), so a terminal that echoes it as
        `^C` left the cursor after that echo, and the word starts a line of its own (not `^Cinterrupted`)."""
        if at_line_start is None:
            at_line_start = after_the_echo()
        if not _said["interrupted"]:
            _said["interrupted"] = True
            if at_line_start and self.tty and _echoes_ctrl_c(self.stream):
                text = "\n" + text
            self._print(text, "dim", fresh=False)

    def warn(self, text: str) -> None:
        """A warning, always shown; a file name's byte that is not UTF-8 as \\xe8, as in an error (error_text)."""
        self._print(f"warning: {shown_path(text)}", "yellow")

    def error(self, message: str, hint: str | None = None) -> None:
        """The one-line error: `localgen: error: message (hint)`, readable whatever value it quotes (error_text)."""
        self._print(error_text(f"localgen: error: {message}" + (f" ({hint})" if hint else "")), "red")

    def stats(self, s: Stats, lead: str = "") -> None:
        """The stats line (after `lead`: a tool run's steps)."""
        self._print(lead + format_stats(s), "dim")

    def raw(self, text: str) -> None:
        """Streamed text (a model's thinking), dimmed on a terminal, no newline added."""
        try:
            if self._console is not None:
                self._console.print(visible(text), style="dim", markup=False, end="")
            else:
                self.stream.write(text)
                self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass


def call_line(call: Any) -> str:
    """How a tool call is shown: name(arguments)."""
    return f"tool call: {call.name}({call.arguments})"


def result_line(result: Any) -> str:
    """How a tool's result is shown, cut to RESULT_PREVIEW characters."""
    if result.declined:
        return f"tool {result.call.name}: declined"
    text = " ".join(result.text.split())
    return f"tool result: {text[:RESULT_PREVIEW]}{'…' if len(text) > RESULT_PREVIEW else ''}"


class ThinkingWriter:
    """A reasoning model's thinking on stderr, dimmed, under a "thinking:" line (or nothing when off)."""

    def __init__(self, err: ErrWriter, on: bool) -> None:
        self.err, self.on, self.open = err, on, False

    def write(self, text: str) -> None:
        if not self.on or not text:
            return
        if not self.open:
            self.err.line("thinking:")
            self.open = True
        self.err.raw(text)

    def end(self) -> None:
        if self.open:
            self.err.raw("\n")
            self.err.line("answer:")
            self.open = False


class AnswerWriter:
    """An answer's events (tools/stream.py), where a person reads them: content to stdout (unless --json),
    thinking (when shown), tool calls and results to stderr."""

    def __init__(self, err: ErrWriter, json_out: bool = False, show_thinking: bool = False) -> None:
        self.err = err
        self.out = TextWriter(sys.stdout, enabled=not json_out)
        self.thinking = ThinkingWriter(err, on=show_thinking and not json_out)

    def show(self, events: list[Any]) -> bool:
        """Write the events; False once the reader of stdout has gone away (`| head -1`)."""
        from localgen.tools.stream import Piece

        for event in events:
            if isinstance(event, Piece) and event.kind == "reasoning":
                self.thinking.write(event.text)
                continue
            self.thinking.end()
            if isinstance(event, Piece):
                if not self.out.write(event.text):
                    return False
                continue
            from localgen.tools.loop import ToolResult  # only an answer with tools has other events

            self.err.line(result_line(event) if isinstance(event, ToolResult) else call_line(event))
        return True

    def end(self) -> None:
        """The answer is over: close the thinking and the line."""
        self.thinking.end()
        self.out.end()


def finite_json(value: Any) -> Any:
    """`value` with every float that JSON cannot hold (a ban's -inf logit bias, a NaN) as the string --logit-bias
    spells it ("-inf", "inf", "nan"), as run --json writes a bias: json.dumps would write -Infinity, which jq
    turns into another number and strict parsers refuse."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def answer_json(backend: Any, gen: Any, sampling: SamplingParams, conversation_id: str | None = None,
                extra: dict[str, Any] | None = None) -> str:
    """`run --json`'s one object (answer_doc) as its JSON text."""
    import json

    return json.dumps(answer_doc(backend, gen, sampling, conversation_id, extra), ensure_ascii=False)


def answer_doc(backend: Any, gen: Any, sampling: SamplingParams, conversation_id: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """`run --json`'s one object: text, finish reason, model, seed, settings (a remote answer's: those sent), load,
    stats, logprobs, and the conversation's id in the log (run --file --json's lines take it too)."""
    import localgen

    sent = getattr(gen, "sent_sampling", None)  # a remote answer's: the settings sent, the seed among them
    if sent is not None:  # the server's defaults, which it does not say, took the place of the others
        settings = dict(sent)
    else:
        settings = sampling.to_dict()
        settings["grammar"] = sampling.grammar is not None
        settings["seed"] = gen.seed
    info = backend.describe()
    doc: dict[str, Any] = {
        "text": gen.text,
        "finish_reason": gen.finish_reason,
        "model": info["model"],
        "seed": gen.seed,
        "sampling": settings,
        "load": info["load"],
        "stats": gen.stats.to_dict(),
        "prompt_cache": gen.prompt_cache,
        "localgen": localgen.__version__,
    }
    if conversation_id:
        doc["conversation_id"] = conversation_id
    if gen.logprobs:
        doc["logprobs"] = [t.to_dict() for t in gen.logprobs]
    if getattr(gen, "server_timings", None):
        doc["server_timings"] = gen.server_timings  # what a remote server reported (llama-server's shape)
    doc.update(extra or {})
    return doc
