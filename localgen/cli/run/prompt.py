"""What a run reads before anything loads: its prompt (documents, piped stdin, the prompt itself) and its
images and audio, each checked (text is UTF-8 within its caps; media format, size and pixels)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localgen.cli.run.options import MediaOptions
from localgen.errors import UsageError
from localgen.text import checked


def attachments(media: MediaOptions, others: Sequence[tuple[str, bool]], order: Sequence[str] = ()) -> tuple[Any, ...]:
    """--image, --video and -a/--attach, read and checked (format, size, pixels) before anything loads, in the
    order the command line gave them (`order`: "image", "video" or "attach" for each, as given; what it leaves out
    follows, images, videos, then -a); `others`: the flags given (flag, given) that they cannot go with."""
    images, attach, videos = list(media.image or ()), list(media.attach or ()), list(media.video or ())
    fps = media.video_fps
    if fps is not None and not (0 < fps <= 60):
        raise UsageError(f"--video-fps must be above 0 and at most 60 (got {fps:g})")
    if not images and not attach and not videos:
        if fps is not None:
            raise UsageError("--video-fps applies to a video: give one with --video or -a")
        return ()
    dropped = [flag for flag, on in others if on]
    if dropped:
        raise UsageError(f"images, audio and video (--image, --video, -a) cannot be combined with "
                         f"{', '.join(dropped)}")
    if attach.count("-") > 1:
        raise UsageError("stdin can be read once: give -a - only once")
    if "-" in attach and sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty():
        raise UsageError("-a - reads a picture or clip from stdin, but stdin is this terminal",
                         hint="pipe the file in: `-a - < photo.jpg`, or give its path: `-a photo.jpg`")
    import re

    from localgen import media as readers
    from localgen.cli.inputfile import check_input

    for name in attach:  # a path (not stdin's `-`, a data: URI or an http(s) URL): checked as --image's are
        if name.strip() and name != "-" and not re.match(r"(data:|https?://)", name, re.I):
            check_input("-a/--attach", name)
    out = []
    for kind, spec in _as_given(order, {"image": images, "video": videos, "attach": attach}):
        m = readers.read(str(spec), fps=None if kind == "image" else fps)
        if kind == "image" and m.kind != "image":
            raise UsageError(f"--image {spec} is {m.format} {m.kind}: attach it with "
                             f"{'--video' if m.kind == 'video' else '-a'}")
        if kind == "video" and m.kind != "video":
            raise UsageError(f"--video {spec} is not a video ({m.format} {m.kind}): attach it with "
                             f"{'--image' if m.kind == 'image' else '-a'}")
        out.append(m)
    if fps is not None and not any(m.kind == "video" for m in out):
        raise UsageError("--video-fps applies to a video: none of the attachments is one")
    return tuple(out)


def _as_given(order: Sequence[str], given: dict[str, list[Any]]) -> list[tuple[str, Any]]:
    """Each flag's values, (flag, value), in the command line's order: the n-th time `order` names a flag is its
    n-th value."""
    left = {kind: list(values) for kind, values in given.items()}
    ordered = [(kind, left[kind].pop(0)) for kind in order if left.get(kind)]
    return ordered + [(kind, value) for kind, values in left.items() for value in values]


def prompt_parts(question: str | None, documents: Sequence[Path] | None, no_stdin: bool,
                 rag: bool = False, media: bool = False) -> list[str]:
    """Documents (-f), piped stdin (unless `no_stdin`: --no-stdin, or stdin's bytes are an attachment), then the
    prompt. A lone -f FILE with no other prompt is the prompt itself, as llama.cpp's -f means. A prompt of only
    whitespace is a UsageError (with `rag`, the search says so of its question: execute.retrieve), as none is,
    unless `media` (images or audio) gives the model something: then the text may be empty."""
    piped = "" if no_stdin else _read_stdin()
    documents = list(documents or [])
    if question is None and not piped and len(documents) == 1:
        parts = [_read_text(documents[0])]
        if not media:  # (with pictures or clips, the text may be blank)
            _not_blank(parts, f"-f {documents[0]}")
        return parts
    parts = [*(f"{d.name}:\n\n{_read_text(d)}" for d in documents)]
    if question is not None:
        checked(question, "the prompt")
    parts += [p for p in (piped, question) if p]
    if media:
        return parts or [""]  # the pictures or clips are the prompt
    if not parts:  # at a terminal, one who typed `localgen run` as `ollama run` opens a conversation wants chat
        raise UsageError("no prompt: give it as an argument or with -p, or pipe text on stdin",
                         hint="to talk with the model turn by turn: localgen chat" if _at_terminal() else None)
    if not rag:
        _not_blank(parts, "the prompt and stdin" if question and piped else "stdin" if piped else "the prompt")
    return parts


def _not_blank(parts: list[str], what: str) -> None:
    """A prompt of only spaces and newlines is refused, as none is: the model would be asked nothing. (A document
    is never blank: its name comes before its text.)"""
    if not "".join(parts).strip():
        raise UsageError(f"{what} {'are' if ' and ' in what else 'is'} only whitespace: there is no prompt",
                         hint="give the prompt as an argument or with -p, or pipe text on stdin")


def _at_terminal() -> bool:
    """Whether stdin is a terminal (not a pipe, a file, or closed)."""
    stdin = sys.stdin
    try:
        return stdin is not None and not stdin.closed and stdin.isatty()
    except (OSError, ValueError):
        return False


def _read_text(path: Path) -> str:
    from localgen.text import MAX_PROMPT_TEXT, read_file

    return read_file(path, limit=MAX_PROMPT_TEXT)


def _read_stdin() -> str:
    from localgen.text import MAX_PROMPT_TEXT, too_long

    stdin = sys.stdin
    if stdin is None or stdin.closed or stdin.isatty():
        return ""
    try:  # a byte that is not UTF-8 is kept (main.utf8_stdin): checked() says which and where
        text = stdin.read(MAX_PROMPT_TEXT + 1)  # characters, read only one past the bound (a huge file, /dev/zero)
    except UnicodeDecodeError as e:  # a stdin that could not be set so (strict): the byte, if not where
        raise UsageError(f"stdin is not valid UTF-8 text: byte 0x{e.object[e.start]:02x} is not UTF-8") from None
    except (OSError, ValueError):
        return ""
    if len(text) > MAX_PROMPT_TEXT:
        raise too_long("stdin")
    return checked(text.strip(chr(10)), "stdin")
