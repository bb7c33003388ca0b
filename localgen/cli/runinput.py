"""What a run reads before anything loads: its prompt (documents, piped stdin, the prompt itself) and its
images and audio, each checked (text is UTF-8 within its caps; media format, size and pixels)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from localgen.cli.runoptions import RunArgs
from localgen.errors import UsageError
from localgen.text import checked


def attachments(f: RunArgs, many: bool) -> tuple[Any, ...]:
    """--image and -a/--attach, read and checked (format, size, pixels) before anything loads."""
    images, attach = list(f.media.image or ()), list(f.media.attach or ())
    if not images and not attach:
        return ()
    d = f.decoding
    dropped = [flag for flag, on in (("--file/--each-line", many), ("--raw", f.raw), ("--beams", bool(d.beams)),
                                     ("--draft/--lookup", bool(d.draft or d.lookup)),
                                     ("--endpoint", bool(f.remote.endpoint)),
                                     ("--prompt-cache", f.given("prompt_cache") and f.prompt_cache)) if on]
    if dropped:
        raise UsageError(f"images and audio (--image, -a) cannot be combined with {', '.join(dropped)}")
    if attach.count("-") > 1:
        raise UsageError("stdin can be read once: give -a - only once")
    from localgen import media

    out = []
    for spec in images:
        m = media.read(str(spec))
        if m.kind != "image":
            raise UsageError(f"--image {spec} is {m.format} audio: attach it with -a")
        out.append(m)
    out += [media.read(spec) for spec in attach]
    return tuple(out)


def prompt_parts(f: RunArgs, stdin_taken: bool = False) -> list[str]:
    """Documents (-f), piped stdin, then the prompt. A lone -f FILE with no other prompt is the prompt itself,
    as llama.cpp's -f means. `stdin_taken`: stdin's bytes are an attachment (-a -)."""
    question = f.prompt if f.prompt is not None else f.prompt_arg
    piped = "" if f.no_stdin or stdin_taken else _read_stdin()
    documents = list(f.document or [])
    if question is None and not piped and len(documents) == 1:
        return [_read_text(documents[0])]
    parts = [*(f"{d.name}:\n\n{_read_text(d)}" for d in documents)]
    if question is not None:
        checked(question, "the prompt")
    parts += [p for p in (piped, question) if p]
    if not parts:
        raise UsageError("no prompt: give it as an argument or with -p, or pipe text on stdin")
    return parts


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None


def _read_stdin() -> str:
    stdin = sys.stdin
    if stdin is None or stdin.closed or stdin.isatty():
        return ""
    try:
        text = stdin.read().strip("\n")
    except UnicodeDecodeError:
        raise UsageError("stdin is not UTF-8 text") from None
    except (OSError, ValueError):
        return ""
    return checked(text, "stdin")
