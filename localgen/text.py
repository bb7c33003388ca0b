"""Text at the input boundary: every prompt, system prompt and stop string that reaches a tokenizer is
valid Unicode. Bytes that are not UTF-8 (which Python keeps as lone surrogates in argv and stdin) and JSON's
lone-surrogate escapes are refused with a message that says where, never passed on; so are files read whole
that are not UTF-8 (read_file: the line of the first bad byte). A prompt's text is bounded (MAX_PROMPT_TEXT) and
read only up to one byte past the bound. Stdlib only."""

from __future__ import annotations

from pathlib import Path

from localgen.errors import UsageError

MAX_PROMPT_TEXT = 64 * 2**20  # a prompt's file or piped stdin: some 16 million tokens, past any context window
CHARS_PER_TOKEN = 32  # no tokenizer makes fewer tokens than one per this many characters: a text longer than this
# many per token of the window cannot fit it, and is refused before it is templated or tokenized


def too_long(what: str, limit: int = MAX_PROMPT_TEXT) -> UsageError:
    """The error for a text past its bound, `limit` bytes (a prompt's: MAX_PROMPT_TEXT), read only up to one byte
    past it or refused by its size on disk."""
    if limit == MAX_PROMPT_TEXT:
        return UsageError(f"{what} is larger than {MAX_PROMPT_TEXT >> 20} MiB: more text than any context window "
                          "holds")
    return UsageError(f"{what} is larger than {size_words(limit)}, the most localgen reads of it")


def size_words(n: int) -> str:
    """A bound in bytes as its errors say it: 64 KiB, 1 MiB."""
    if n >= 1 << 20 and not n % (1 << 20):
        return f"{n >> 20} MiB"
    return f"{n >> 10} KiB" if not n % 1024 else f"{n:,} bytes"


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """A file's bytes, at most `limit` of them: a UsageError naming `what` and the bound when there are more. A
    regular file is refused by its size before it is opened; anything else (a device such as /dev/zero, a pipe, a
    file /proc sizes as 0) is read up to one byte past the bound. OSError is the caller's to word."""
    import os
    import stat

    full = Path(path)
    st = os.stat(full)
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise too_long(what, limit)
    with full.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_long(what, limit)
    return data


def problem(text: str) -> str | None:
    """What makes `text` invalid Unicode (the first offender and where), or None when it is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:  # a byte that did not decode, kept by Python's surrogateescape
            return f"byte 0x{code - 0xDC00:02x} at character {e.start + 1} is not UTF-8"
        return f"a lone surrogate (\\u{code:04x}) at character {e.start + 1}"
    return None


def mended(text: str) -> str:
    """`text` with each lone surrogate (a byte that was not UTF-8, kept by surrogateescape: a file name os.listdir
    gave; a JSON \\ud800 escape) made U+FFFD, as a UTF-8 decoder replaces a bad byte: for text the user did not
    type, which is not refused but read (a tool's result, what a failure says)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        import re

        return re.sub("[\ud800-\udfff]", "\ufffd", text)
    return text


def checked(text: str, what: str) -> str:
    """`text` unchanged if it is valid Unicode; a UsageError naming `what` otherwise."""
    why = problem(text)
    if why is not None:
        raise UsageError(f"{what} is not valid UTF-8 text: {why}")
    return text


def read_file(path: str | Path, what: str | None = None, limit: int | None = None) -> str:
    """A text file's contents, all of it UTF-8; a UsageError naming the file (or `what`), the line and the first
    byte that is not. Line ends read as Path.read_text reads them (CRLF and CR as LF); a byte order mark at its
    start is dropped. With `limit` (bytes), a larger file is refused by its size, or after reading one byte past it
    (/dev/zero): read_bounded. OSError is the caller's to word."""
    if limit is None:
        return decode(Path(path).read_bytes(), what or str(path))
    return decode(read_bounded(path, limit, what or str(path)), what or str(path))


def decode(data: bytes, what: str) -> str:
    """A file's bytes as text, as read_file reads them: a byte order mark at its start dropped (some editors write
    one; it is no part of the text); a UsageError naming `what`, the line and the first byte that is not UTF-8."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{what} is not UTF-8 text: byte 0x{data[e.start]:02x} on line {line:,} is not "
                         "UTF-8") from None


SAVE_AS_UTF8 = "save it as UTF-8: in Notepad, Save As with Encoding UTF-8"


class Utf16File(UsageError):
    """A file of settings (endpoints.toml, models.toml, a preset, --mcp's servers) saved as UTF-16, Notepad's
    "Unicode", where its format is UTF-8: one line naming the file. `text`: what it says read as UTF-16, to tell
    whether it names what was asked for."""

    def __init__(self, what: str | Path, kind: str, text: str) -> None:
        super().__init__(f"{what} is UTF-16 text, not UTF-8 as {kind} is", hint=SAVE_AS_UTF8)
        self.text = text


def config_text(data: bytes, what: str | Path, kind: str) -> str:
    """A file of settings in `kind` (TOML, JSON: formats that are UTF-8) as text: a UTF-8 byte order mark an
    editor wrote dropped; Utf16File naming `what` where it is UTF-16; UnicodeDecodeError, for the caller to word,
    where it is other bytes. Line ends are left as they are (both formats read CRLF)."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    text = utf16(data)
    if text is not None:
        raise Utf16File(what, kind, text)
    return data.decode("utf-8")


def utf16(data: bytes) -> str | None:
    """The text of a file saved as UTF-16 (damaged characters replaced), else None: its byte order mark says so, or,
    without one, a NUL in most of its odd or even bytes, as ASCII is in UTF-16 (TOML and JSON text has no NUL; UTF-8
    text with one is the format's error, at its line), and the text it decodes to has no NUL."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        text = data.decode("utf-16", "replace").removeprefix("\ufeff")
    else:
        odd, even = data[1::2].count(0), data[0::2].count(0)
        if not data or len(data) % 2 or max(odd, even) * 2 < len(data) // 2:
            return None
        text = data.decode("utf-16-le" if odd > even else "utf-16-be", "replace")
    return None if "\x00" in text else text  # NULs still (a file a power cut zeroed): no text at all
